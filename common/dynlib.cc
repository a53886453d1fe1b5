// Shared libraries loaded on first use.
#include "common/dynlib.h"

#include <dlfcn.h>

#include "common/strings.h"

namespace strata {

Result<DynamicLibrary> DynamicLibrary::Open(const std::string& soname, std::string_view package) {
  void* handle = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    return Error(ELIBACC, StrCat("load ", soname, ": ", why ? why : "unknown error", " (apt-get install ", package, ")"));
  }
  return DynamicLibrary(handle, soname);
}

Result<void*> DynamicLibrary::Lookup(const char* name) const {
  void* address = ::dlsym(handle_, name);
  if (!address) return Error(ELIBBAD, StrCat(soname_, " has no ", name, ": not the library strata was built against"));
  return address;
}

}  // namespace strata
