// Shared libraries loaded on first use instead of at program start. Each
// library with its dependency tree costs every process milliseconds to load
// and relocate; libcurl and libmicrohttpd are only needed by the runs that
// speak HTTP (docs/dependencies.md).
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

class DynamicLibrary {
 public:
  // dlopen(soname); the error names the library and the Debian package
  // that installs it.
  static Result<DynamicLibrary> Open(const std::string& soname, std::string_view package);

  // Points `fn` at the library's function `name`.
  template <typename F>
  Status Resolve(F& fn, const char* name) const {
    STRATA_ASSIGN_OR_RETURN(void* address, Lookup(name));
    fn = reinterpret_cast<F>(address);
    return OkStatus();
  }

 private:
  DynamicLibrary(void* handle, std::string soname) : handle_(handle), soname_(std::move(soname)) {}
  Result<void*> Lookup(const char* name) const;

  void* handle_;  // never closed: the functions stay valid for the process's life
  std::string soname_;
};

}  // namespace strata
