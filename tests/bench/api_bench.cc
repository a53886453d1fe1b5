// scripts/bench api: the node API's cost per call on each transport.
//   - `exec true` in a live sandbox through the launcher client (keep-alive)
//     over TLS, plain loopback TCP and the unix socket, beside a raw libcurl
//     handle reusing its connection that sends the same exec request, and
//     the same handle asking GET /v1/health (the transport, HTTP and the
//     token check, no sandbox): the daemon's cost beside the transport's;
//   - creations per second: one request with "count": 50 against 50 single
//     creates, 8 in flight.
// Usage: api_bench [CALLS]
#include <curl/curl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <regex>
#include <thread>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "launcher/api/client.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "tests/bench/bench_layers.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/tree.h"

namespace strata::bench {
namespace {

using nlohmann::json;


// One libcurl easy handle, kept (so is its connection) across requests.
class RawCurl {
 public:
  RawCurl(const std::string& base, const std::string& unix_socket, const std::string& ca, const std::string& token)
      : base_(base), curl_(curl_easy_init()) {
    if (!unix_socket.empty()) curl_easy_setopt(curl_, CURLOPT_UNIX_SOCKET_PATH, unix_socket.c_str());
    if (!ca.empty()) curl_easy_setopt(curl_, CURLOPT_CAINFO, ca.c_str());
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, &RawCurl::Write);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &body_);
    if (!token.empty()) headers_ = curl_slist_append(headers_, ("Authorization: Bearer " + token).c_str());
    headers_ = curl_slist_append(headers_, "Content-Type: application/json");
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, headers_);
  }
  ~RawCurl() {
    curl_slist_free_all(headers_);
    curl_easy_cleanup(curl_);
  }
  // GET when `post` is empty; checks for a 2xx answer.
  void Call(const std::string& path, const std::string& post) {
    body_.clear();
    curl_easy_setopt(curl_, CURLOPT_URL, (base_ + path).c_str());
    if (post.empty()) {
      curl_easy_setopt(curl_, CURLOPT_HTTPGET, 1L);
    } else {
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, post.c_str());
      curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE, static_cast<long>(post.size()));
    }
    CURLcode rc = curl_easy_perform(curl_);
    long status = 0;
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK || status / 100 != 2) {
      Check(Error(EIO, StrCat("raw curl ", base_, path, ": ", curl_easy_strerror(rc), " HTTP ", status, " ", body_)));
    }
  }

 private:
  static size_t Write(char* p, size_t, size_t n, void* out) {
    static_cast<std::string*>(out)->append(p, n);
    return n;
  }
  std::string base_, body_;
  CURL* curl_;
  curl_slist* headers_ = nullptr;
};

}  // namespace
}  // namespace strata::bench

static int Body(int argc, char** argv) {
  using namespace strata;
  using namespace strata::bench;
  const int calls = argc > 1 ? std::atoi(argv[1]) : 500;
  constexpr int kInFlight = 8, kBulk = 50;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  BusyboxLayer layer = PublishBusybox();
  const TempDir& dir = layer.dir;
  const std::string& store = layer.store;

  const std::string launcher = SelfDir() + "/../../launcher/launcher";
  const std::string cert = dir.Sub("cert.pem"), key = dir.Sub("key.pem"), tokens = dir.Sub("tokens");
  Check(RunChecked({.argv = {"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                             "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                             "subjectAltName=IP:127.0.0.1"}},
                   "openssl req").status());
  std::string token = Check(RunChecked({.argv = {launcher, "token", "new", "bench", "--tokens", tokens}}, "token new")).out;
  token = token.substr(0, token.find('\n'));

  const std::string socket = dir.Sub("launcher.sock");
  const std::vector<std::string> env = {"STRATA_STORE=" + store, "STRATA_LAZYFS_SOCKET=" + dir.Sub("lazyfs.sock"),
                                        "STRATA_CACHE=" + dir.Sub("cache"), "STRATA_RUN_DIR=" + dir.Sub("run"),
                                        "STRATA_CGROUP_PARENT=strata-bench"};
  // Starts the daemon with `listen` flags; returns the TCP URL it serves.
  std::optional<Subprocess> daemon;
  auto start = [&](std::vector<std::string> extra) {
    ::truncate(dir.Sub("daemon.log").c_str(), 0);
    std::vector<std::string> args = {launcher, "serve", "--socket", socket, "--state", dir.Sub("state"), "--tokens", tokens,
                                     "--store", store, "--listen", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon.emplace(Check(Subprocess::Start({.argv = args, .env = env, .stdout_mode = StdStream::kNull,
                                            .stderr_mode = StdStream::kFile, .stderr_file = dir.Sub("daemon.log")})));
    launcher::LauncherClient probe(socket);
    for (int i = 0; i < 500 && !probe.Alive(); ++i) ::usleep(10000);
    // (The unix socket answers before the TCP listener is announced.)
    std::string log;
    for (int i = 0; i < 500 && log.find("serving on http") == std::string::npos; ++i) {
      log = ReadFileToString(dir.Sub("daemon.log")).value_or("");
      ::usleep(10000);
    }
    std::smatch m;
    if (!std::regex_search(log, m, std::regex("serving on (https?://127\\.0\\.0\\.1:[0-9]+)"))) {
      Check(Error(EIO, "the daemon did not start: " + log));
    }
    return m[1].str();
  };
  auto stop = [&] {
    daemon->Kill(SIGTERM);
    daemon->Wait().status().IgnoreError();
    daemon.reset();
  };
  // However the bench ends (a failed Check throws), what it made goes:
  // sandboxes outlive their daemon, so they are destroyed through it first.
  struct Cleanup {
    std::function<void()> f;
    ~Cleanup() { f(); }
  } cleanup{[&] {
    if (daemon) {
      launcher::LauncherClient c(socket);
      for (const auto& s : c.List().value_or(json::array())) c.Destroy(s["id"].get<std::string>()).IgnoreError();
      stop();
    }
    RunCommand({.argv = {"pkill", "-TERM", "-f", "lazyfs daemon --socket " + dir.Sub("lazyfs.sock")}}).status().IgnoreError();
    for (int i = 0; i < 500 && RunCommand({.argv = {"pgrep", "-f", "lazyfs daemon --socket " + dir.Sub("lazyfs.sock")}})->success(); ++i) {
      ::usleep(10000);
    }
    for (const char* controller : {"blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "hugetlb", "memory", "pids", "systemd", "unified"}) {
      ::rmdir(StrCat("/sys/fs/cgroup/", controller, "/strata-bench").c_str());
    }
  }};

  const json spec = {{"layers", {"bench:1"}}};
  const json true_cmd = {{"argv", {"true"}}};
  const std::string exec_body = json{{"argv", {"true"}}, {"stream", false}}.dump();
  struct Row {
    std::string transport;
    Figures client, raw_exec, raw_health;
  };
  std::vector<Row> rows;
  auto measure = [&](const std::string& name, launcher::DaemonAddress address, const std::string& id) {
    launcher::LauncherClient client(address);
    const bool unix = address.url.starts_with("unix://");
    RawCurl raw(unix ? "http://launcher" : address.url, unix ? address.url.substr(7) : "", address.ca_file, address.token);
    auto exec_ok = [&] {
      auto r = Check(client.Exec(id, true_cmd, [](int, std::string_view) {}));
      if (r.exit_code != 0) Check(Error(EIO, "exec true failed"));
    };
    for (int i = 0; i < 5; ++i) {
      exec_ok();
      raw.Call("/v1/health", "");
      raw.Call("/v1/sandboxes/" + id + "/exec", exec_body);
    }
    std::fprintf(stderr, "api_bench: %s...\n", name.c_str());
    Row row{name, {}, {}, {}};
    // Interleaved in rounds, so drift falls on all three alike.
    std::vector<double> a, b, c;
    auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) {
      auto s = Clock::now();
      exec_ok();
      a.push_back(Seconds(Clock::now() - s) * 1000);
      s = Clock::now();
      raw.Call("/v1/sandboxes/" + id + "/exec", exec_body);
      b.push_back(Seconds(Clock::now() - s) * 1000);
      s = Clock::now();
      raw.Call("/v1/health", "");
      c.push_back(Seconds(Clock::now() - s) * 1000);
    }
    (void)t0;
    auto fig = [](const std::vector<double>& v) {
      double sum = 0;
      for (double x : v) sum += x;
      return Figures{Percentile(v, 50), Percentile(v, 99), 1000.0 * static_cast<double>(v.size()) / sum};
    };
    row.client = fig(a);
    row.raw_exec = fig(b);
    row.raw_health = fig(c);
    rows.push_back(row);
  };

  // TLS, and the unix socket beside it.
  std::string https = start({"--tls-cert", cert, "--tls-key", key});
  // The tenant's sandbox (the operator on the unix socket sees it too).
  const std::string id = Check(launcher::LauncherClient({https, token, cert}).Create(spec))["id"];
  measure("TLS (https, loopback)", {https, token, cert}, id);
  measure("unix socket (root)", {"unix://" + socket, "", ""}, id);
  stop();
  // Plain TCP: the same sandbox, re-adopted by the restarted daemon.
  std::string http = start({});
  measure("plain TCP (loopback)", {http, token, ""}, id);
  measure("unix socket (root), after the restart", {"unix://" + socket, "", ""}, id);

  // Creations: 50 in one request against 50 single ones, 8 in flight.
  std::fprintf(stderr, "api_bench: creations...\n");
  launcher::LauncherClient unix_client(socket);
  auto destroy_all = [&] {
    for (const auto& s : Check(unix_client.List())) {
      if (s["id"] != id) Check(unix_client.Destroy(s["id"].get<std::string>()));
    }
  };
  for (int i = 0; i < 3; ++i) Check(unix_client.Destroy(Check(unix_client.Create(spec))["id"].get<std::string>()));
  std::vector<double> bulk_rate, single_rate;
  for (int round = 0; round < 3; ++round) {
    auto s = Clock::now();
    json b = spec;
    b["count"] = kBulk;
    auto answer = Check(unix_client.Raw("POST", "/v1/sandboxes", b.dump()));
    json made = json::parse(answer.body);
    if (answer.status != 201 || made["sandboxes"].size() != kBulk) Check(Error(EIO, "bulk create: " + answer.body));
    bulk_rate.push_back(kBulk / Seconds(Clock::now() - s));
    destroy_all();
    Figures singles = Measure(kBulk, kInFlight, [&](int) { Check(unix_client.Create(spec).status()); });
    single_rate.push_back(singles.per_second);
    destroy_all();
  }
  Check(unix_client.Destroy(id));

  std::printf("node API, %d calls per row, one keep-alive connection each, interleaved\n", calls);
  Table t({"transport", "client exec true p50 ms", "p99 ms", "raw curl exec true p50 ms", "p99 ms",
           "raw curl GET /v1/health p50 ms", "p99 ms", "client / raw exec (p50)", "exec beyond health (p50 ms)"});
  for (const auto& r : rows) {
    t.Add({r.transport, Fixed(r.client.p50_ms, 3), Fixed(r.client.p99_ms, 3), Fixed(r.raw_exec.p50_ms, 3),
           Fixed(r.raw_exec.p99_ms, 3), Fixed(r.raw_health.p50_ms, 3), Fixed(r.raw_health.p99_ms, 3),
           Fixed(r.client.p50_ms / r.raw_exec.p50_ms, 2), Fixed(r.raw_exec.p50_ms - r.raw_health.p50_ms, 3)});
  }
  t.Print();
  std::printf("\ncreations, %d sandboxes, median of 3 rounds\n", kBulk);
  Table c({"measure", "sandboxes/s", "baseline", "baseline sandboxes/s", "ratio"});
  const double bulk = Median(bulk_rate), single = Median(single_rate);
  c.Add({StrCat("one request, count ", kBulk), Fixed(bulk, 1), StrCat(kBulk, " single creates, ", kInFlight, " in flight"),
         Fixed(single, 1), Fixed(bulk / single, 2)});
  c.Print();
  return 0;
}

int main(int argc, char** argv) {
  return strata::bench::BenchMain([&] { return Body(argc, argv); });
}
