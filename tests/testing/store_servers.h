// Real object-store servers for system tests and benchmarks, each started
// on a free loopback port with everything it writes in a temporary
// directory, and stopped (its process group killed, its directory removed)
// when the object goes away, pass or fail. The processes are started under
// `setpriv --pdeathsig KILL`, so even a test binary killed by a timeout
// leaves no server behind.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/fs.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace strata::testing {

// nginx with WebDAV (PUT, DELETE, MOVE) and JSON directory listings, serving
// root() at url().
class NginxServer {
 public:
  // `workers` 0: one process (master_process off); else a master with that
  // many workers. ENOENT when nginx is not installed.
  static Result<std::unique_ptr<NginxServer>> Start(int workers = 0);
  std::string url() const;  // "http://127.0.0.1:<port>"
  std::string root() const { return dir_.Sub("root"); }

 private:
  NginxServer(TempDir dir, Subprocess process, int port)
      : dir_(std::move(dir)), process_(std::move(process)), port_(port) {}
  TempDir dir_;
  Subprocess process_;
  int port_;
};

// s3rver (npm), installed by scripts/setup into <source>/build/npm, or the
// executable $STRATA_S3RVER names.
class S3rverServer {
 public:
  // The s3rver executable, or nullopt when it is not installed.
  static std::optional<std::string> Find();
  // Creates `buckets` at startup. ENOENT when s3rver is not installed.
  static Result<std::unique_ptr<S3rverServer>> Start(const std::vector<std::string>& buckets);
  std::string endpoint() const;  // "http://127.0.0.1:<port>"
  int port() const { return port_; }

 private:
  S3rverServer(TempDir dir, Subprocess process, int port)
      : dir_(std::move(dir)), process_(std::move(process)), port_(port) {}
  TempDir dir_;
  Subprocess process_;
  int port_;
};

// A loopback TCP port nobody listens on right now.
Result<int> FreeLoopbackPort();

}  // namespace strata::testing
