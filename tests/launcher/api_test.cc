// System tests of the node API over the network: a real daemon on loopback
// TCP (TLS with a certificate made by openssl, and plain) and on its unix
// socket; tenants with tokens and limits, admission, idempotent retries,
// NDJSON, and hostile clients.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <future>
#include <regex>

#include "common/crypto.h"
#include "launcher/protocol/protocol.h"
#include "launcher/api/client.h"
#include "tests/launcher/fixture.h"

namespace strata::launcher {
namespace {

using nlohmann::json;

// A plain TCP connection to 127.0.0.1:port, for clients that misbehave.
UniqueFd Connect(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return UniqueFd();
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends `request` and reads until the server closes or 5 s pass (a server
// that stops reading mid-request makes the send fail, not hang).
std::string Exchange(uint16_t port, std::string_view request) {
  UniqueFd fd = Connect(port);
  if (!fd) return "connect failed";
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  for (size_t off = 0; off < request.size();) {
    ssize_t n = ::send(fd.get(), request.data() + off, request.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd.get(), buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// Whether the server closed `fd` (read returns 0 or fails) within `limit`.
bool ClosedWithin(int fd, Duration limit) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(limit).count())) != 1) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

class ApiTest : public DaemonFixture {
 protected:
  void SetUp() override {
    DaemonFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // A self-signed certificate for 127.0.0.1, its own CA.
    auto cert = RunCommand({.argv = {"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                     "-nodes", "-keyout", dir_.Sub("key.pem"), "-out", dir_.Sub("cert.pem"), "-days", "2",
                                     "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"}});
    ASSERT_TRUE(cert.ok() && cert->success()) << (cert.ok() ? cert->err : cert.status().ToString());
    tokens_ = dir_.Sub("tokens");
    alice_ = NewTenant("alice", {"--max-sandboxes", "2"});
    bob_ = NewTenant("bob", {});
  }

  // `launcher token new`: prints only the token.
  std::string NewTenant(const std::string& name, std::vector<std::string> limits) {
    std::vector<std::string> argv = {Tool(), "token", "new", name, "--tokens", tokens_};
    argv.insert(argv.end(), limits.begin(), limits.end());
    auto r = RunCommand({.argv = argv});
    EXPECT_TRUE(r.ok() && r->success()) << (r.ok() ? r->err : r.status().ToString());
    std::string token = r.ok() ? r->out : "";
    while (!token.empty() && token.back() == '\n') token.pop_back();
    EXPECT_TRUE(token.starts_with("st_")) << token;
    return token;
  }

  // The daemon with a TLS and a plain loopback listener and the tokens.
  void Serve(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {"--tokens", tokens_, "--listen", "127.0.0.1:0", "--tls-cert", dir_.Sub("cert.pem"),
                                     "--tls-key", dir_.Sub("key.pem"), "--store", store_url_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ports_.clear();
    ::truncate(dir_.Sub("daemon.log").c_str(), 0);
    StartDaemon(argv);
    if (HasFatalFailure()) return;
    // The unix socket answers before the TCP listeners are announced.
    std::string log = WaitForLog("serving on https://");
    std::regex https("serving on https://127\\.0\\.0\\.1:([0-9]+)");
    for (std::sregex_iterator it(log.begin(), log.end(), https), end; it != end; ++it) ports_.push_back(std::stoi((*it)[1]));
    ASSERT_EQ(ports_.size(), 1u) << log;
  }

  // The daemon with one plain loopback listener (tokens, no TLS).
  void ServePlain(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {"--tokens", tokens_, "--listen", "127.0.0.1:0", "--store", store_url_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ::truncate(dir_.Sub("daemon.log").c_str(), 0);
    StartDaemon(argv);
    if (HasFatalFailure()) return;
    std::string log = WaitForLog("serving on http://");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex("serving on http://127\\.0\\.0\\.1:([0-9]+)"))) << log;
    plain_port_ = static_cast<uint16_t>(std::stoi(m[1]));
  }

  // The daemon's log once it holds `text` (or after 5 s).
  std::string WaitForLog(const std::string& text) {
    std::string log;
    for (int i = 0; i < 500; ++i) {
      log = ReadFileToString(dir_.Sub("daemon.log")).value_or("");
      if (log.find(text) != std::string::npos) break;
      std::this_thread::sleep_for(10ms);
    }
    return log;
  }

  std::string Https() const { return StrCat("https://127.0.0.1:", ports_.at(0)); }
  LauncherClient As(const std::string& token) const { return LauncherClient(DaemonAddress{Https(), token, dir_.Sub("cert.pem")}); }

  static std::string Header(const HttpAnswer& a, const std::string& name) {
    for (const auto& [k, v] : a.headers) {
      if (k == name) return v;
    }
    return "";
  }

  json CreateBody(json extra = json::object()) const {
    json b = {{"layers", {"busybox:1"}}};
    b.update(extra);
    return b;
  }

  std::string tokens_, alice_, bob_;
  std::vector<uint16_t> ports_;
  uint16_t plain_port_ = 0;
};

TEST_F(ApiTest, TokensTenantsAndTheirLimitsDecideWhatACallerGets) {
  Serve();
  auto alice = As(alice_), bob = As(bob_);
  // The file holds hashes only, and is the owner's alone.
  std::string file = ReadFileToString(tokens_).value_or("");
  EXPECT_EQ(file.find(alice_), std::string::npos);
  EXPECT_NE(file.find("alice sha256:" + Sha256Hex(alice_).value_or("?")), std::string::npos) << file;
  struct stat st{};
  ASSERT_EQ(::stat(tokens_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  ASSERT_OK_AND_ASSIGN(auto made, alice.Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string id = json::parse(made.body)["id"];
  EXPECT_EQ(json::parse(made.body)["tenant"], "alice");

  // No token, a wrong one: 401, nothing done.
  auto anonymous = As("");
  ASSERT_OK_AND_ASSIGN(auto none, anonymous.Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  EXPECT_EQ(none.status, 401) << none.body;
  EXPECT_EQ(Header(none, "www-authenticate"), "Bearer");
  ASSERT_OK_AND_ASSIGN(auto wrong, As("st_" + std::string(64, '0')).Raw("GET", "/v1/sandboxes", ""));
  EXPECT_EQ(wrong.status, 401);
  // Another tenant's sandbox does not exist for bob.
  for (const auto& [method, path, body] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"GET", "/v1/sandboxes/" + id, ""},
           {"POST", "/v1/sandboxes/" + id + "/exec", R"({"argv":["true"]})"},
           {"GET", "/v1/sandboxes/" + id + "/files?path=/etc/passwd", ""},
           {"PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/x", "data"},
           {"POST", "/v1/sandboxes/" + id + "/pause", "{}"},
           {"DELETE", "/v1/sandboxes/" + id, ""}}) {
    ASSERT_OK_AND_ASSIGN(auto a, bob.Raw(method, path, body));
    EXPECT_EQ(a.status, 404) << method << " " << path << ": " << a.body;
  }
  ASSERT_OK_AND_ASSIGN(auto bobs, bob.List());
  EXPECT_TRUE(bobs.empty()) << bobs.dump();
  ASSERT_OK_AND_ASSIGN(auto alices, alice.List());
  EXPECT_EQ(alices.size(), 1u);
  // The operator (root on the unix socket) sees every sandbox.
  ASSERT_OK_AND_ASSIGN(auto all, client_->List());
  EXPECT_EQ(all.size(), 1u);

  // What a tenant may not ask for: 403, nothing created.
  for (const json& body : {CreateBody({{"store", "file:///etc"}}), CreateBody({{"store", "http://169.254.169.254/"}}),
                           CreateBody({{"network", "host"}})}) {
    ASSERT_OK_AND_ASSIGN(auto a, bob.Raw("POST", "/v1/sandboxes", body.dump()));
    EXPECT_EQ(a.status, 403) << body.dump() << ": " << a.body;
  }
  // Its limit of sandboxes at once: 429 with Retry-After.
  ASSERT_OK_AND_ASSIGN(auto second, alice.Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  ASSERT_EQ(second.status, 201) << second.body;
  ASSERT_OK_AND_ASSIGN(auto third, alice.Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  EXPECT_EQ(third.status, 429) << third.body;
  EXPECT_EQ(Header(third, "retry-after"), "1");
  ASSERT_OK_AND_ASSIGN(all, client_->List());
  EXPECT_EQ(all.size(), 2u);

  // A revoked token stops at the next SIGHUP; an added one starts; the
  // sandboxes stay.
  std::string carol = NewTenant("carol", {"--creates-per-s", "0.1"});
  ASSERT_OK_AND_ASSIGN(auto early, As(carol).Raw("GET", "/v1/sandboxes", ""));
  EXPECT_EQ(early.status, 401);
  ASSERT_OK_AND_ASSIGN(auto revoke, RunCommand({.argv = {Tool(), "token", "revoke", "alice", "--tokens", tokens_}}));
  ASSERT_TRUE(revoke.success()) << revoke.err;
  daemon_->Kill(SIGHUP);
  for (int i = 0; i < 200; ++i) {
    if (ReadFileToString(dir_.Sub("daemon.log")).value_or("").find("tokens reread") != std::string::npos) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(daemon_->Running());
  ASSERT_OK_AND_ASSIGN(auto revoked, alice.Raw("GET", "/v1/sandboxes", ""));
  EXPECT_EQ(revoked.status, 401);
  ASSERT_OK_AND_ASSIGN(auto first_call, As(carol).Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  EXPECT_EQ(first_call.status, 201) << first_call.body;
  // Its rate: one creation per 10 s.
  ASSERT_OK_AND_ASSIGN(auto too_fast, As(carol).Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  EXPECT_EQ(too_fast.status, 429) << too_fast.body;
  EXPECT_EQ(Header(too_fast, "retry-after"), "1");
  ASSERT_OK_AND_ASSIGN(all, client_->List());
  EXPECT_EQ(all.size(), 3u);  // alice's two are untouched
  ASSERT_OK_AND_ASSIGN(auto still, client_->Exec(id, {{"argv", {"true"}}}, [](int, std::string_view) {}));
  EXPECT_EQ(still.exit_code, 0);

  // The CLI reaches the daemon by URL, token and CA.
  ASSERT_OK_AND_ASSIGN(auto ls, RunCommand({.argv = {Tool(), "ls", "--json", "--url", Https(), "--token", carol, "--ca",
                                                     dir_.Sub("cert.pem")}}));
  EXPECT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_EQ(json::parse(ls.out).size(), 1u) << ls.out;
  // Without the CA the certificate is not trusted.
  ASSERT_OK_AND_ASSIGN(auto untrusted, RunCommand({.argv = {Tool(), "ls", "--url", Https(), "--token", carol}}));
  EXPECT_NE(untrusted.exit_code, 0);
}

TEST_F(ApiTest, TheNodeRefusesWhatItCannotTakeAndSaysWhenToRetry) {
  Serve({"--max-sandboxes", "3"});
  auto bob = As(bob_);
  // Bulk: three fit, the other two fail with their index.
  ASSERT_OK_AND_ASSIGN(auto bulk, bob.Raw("POST", "/v1/sandboxes", CreateBody({{"count", 5}}).dump()));
  ASSERT_EQ(bulk.status, 201) << bulk.body;
  json answer = json::parse(bulk.body);
  EXPECT_EQ(answer["sandboxes"].size(), 3u) << bulk.body;
  ASSERT_EQ(answer["failures"].size(), 2u) << bulk.body;
  std::set<int> failed;
  for (const auto& f : answer["failures"]) {
    failed.insert(f["index"].get<int>());
    EXPECT_NE(f["error"].get<std::string>().find("node full"), std::string::npos) << f.dump();
  }
  EXPECT_EQ(failed.size(), 2u);
  // Full: 503 with Retry-After, for anyone.
  ASSERT_OK_AND_ASSIGN(auto full, bob.Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  EXPECT_EQ(full.status, 503) << full.body;
  EXPECT_EQ(Header(full, "retry-after"), "1");
  ASSERT_OK_AND_ASSIGN(auto health, client_->Raw("GET", "/v1/health", ""));
  json h = json::parse(health.body);
  EXPECT_EQ(h["headroom"]["slots"], 0) << health.body;
  EXPECT_EQ(h["accepting"], false);
  EXPECT_GT(h["headroom"]["memory_available"].get<uint64_t>(), 0u);
  EXPECT_GT(h["headroom"]["disk_available"].get<uint64_t>(), 0u);

  // Paused: 409 (no Retry-After: retrying does not help until a resume).
  const std::string id = answer["sandboxes"][0]["id"];
  ASSERT_OK(bob.Pause(id));
  ASSERT_OK_AND_ASSIGN(auto paused, bob.Raw("POST", "/v1/sandboxes/" + id + "/exec", R"({"argv":["true"]})"));
  EXPECT_EQ(paused.status, 409) << paused.body;
  EXPECT_EQ(Header(paused, "retry-after"), "");
  ASSERT_OK(bob.Resume(id));
  StopDaemon(SIGTERM);

  // A memory reserve larger than the machine: nothing is admitted.
  Serve({"--memory-reserve", "100T"});
  ASSERT_OK_AND_ASSIGN(auto low, As(bob_).Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  EXPECT_EQ(low.status, 503) << low.body;
  EXPECT_NE(low.body.find("memory"), std::string::npos) << low.body;
  StopDaemon(SIGTERM);

  // A memory capacity: the sandboxes' parent cgroup is capped at it, and
  // limits (each with the agent's 64 MiB reserve) may not pass it.
  Serve({"--memory-capacity", "400M", "--disk-reserve", "1M"});
  EXPECT_EQ(ReadFileToString(StrCat("/sys/fs/cgroup/memory/", cgroup_parent_, "/memory.limit_in_bytes")).value_or(""),
            StrCat(400 << 20, "\n"));
  auto bob2 = As(bob_);
  const std::string with_limit = CreateBody({{"memory", "100M"}}).dump();
  std::vector<std::string> held;
  for (int i = 0; i < 2; ++i) {  // 2 x 164 MiB fit in 400
    ASSERT_OK_AND_ASSIGN(auto r, bob2.Raw("POST", "/v1/sandboxes", with_limit));
    ASSERT_EQ(r.status, 201) << r.body;
    held.push_back(json::parse(r.body)["id"]);
  }
  ASSERT_OK_AND_ASSIGN(auto over, bob2.Raw("POST", "/v1/sandboxes", with_limit));
  EXPECT_EQ(over.status, 503) << over.body;
  EXPECT_NE(over.body.find("--memory-capacity"), std::string::npos) << over.body;
  ASSERT_OK_AND_ASSIGN(auto health2, client_->Raw("GET", "/v1/health", ""));
  json h2 = json::parse(health2.body);
  EXPECT_EQ(h2["headroom"]["memory_committed"], 2 * (164 << 20)) << health2.body;
  EXPECT_EQ(h2["headroom"]["memory_capacity"], 400 << 20) << health2.body;
  EXPECT_GT(h2["headroom"]["pids_available"].get<uint64_t>(), 4096u) << health2.body;
  ASSERT_OK(bob2.Destroy(held.back()));
  held.pop_back();
  ASSERT_OK_AND_ASSIGN(auto again, bob2.Raw("POST", "/v1/sandboxes", with_limit));
  EXPECT_EQ(again.status, 201) << again.body;
  if (again.status == 201) held.push_back(json::parse(again.body)["id"]);
  for (const auto& id2 : held) EXPECT_OK(bob2.Destroy(id2));
  StopDaemon(SIGTERM);
  ::rmdir(StrCat("/sys/fs/cgroup/memory/", cgroup_parent_).c_str());
  // A disk reserve larger than the uppers: nothing is admitted.
  Serve({"--disk-reserve", "100T"});
  ASSERT_OK_AND_ASSIGN(auto no_disk, As(bob_).Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  EXPECT_EQ(no_disk.status, 503) << no_disk.body;
  EXPECT_NE(no_disk.body.find("--disk-reserve"), std::string::npos) << no_disk.body;
}

TEST_F(ApiTest, RetriesWithAnIdempotencyKeyDoTheWorkOnce) {
  Serve();
  auto bob = As(bob_);
  const std::string body = CreateBody().dump();
  auto create = [&](const std::string& key) { return bob.Raw("POST", "/v1/sandboxes", body, {"Idempotency-Key: " + key}); };
  // The same create twice at once: one sandbox, the same answer.
  auto a = std::async(std::launch::async, create, "create-1");
  auto b = std::async(std::launch::async, create, "create-1");
  ASSERT_OK_AND_ASSIGN(auto ra, a.get());
  ASSERT_OK_AND_ASSIGN(auto rb, b.get());
  ASSERT_EQ(ra.status, 201) << ra.body;
  ASSERT_EQ(rb.status, 201) << rb.body;
  const std::string id = json::parse(ra.body)["id"];
  EXPECT_EQ(json::parse(rb.body)["id"], id);
  ASSERT_OK_AND_ASSIGN(auto list, client_->List());
  EXPECT_EQ(list.size(), 1u) << list.dump();
  // The same key for another request: 422.
  ASSERT_OK_AND_ASSIGN(auto other, bob.Raw("POST", "/v1/sandboxes", CreateBody({{"memory", "64M"}}).dump(),
                                           {"Idempotency-Key: create-1"}));
  EXPECT_EQ(other.status, 422) << other.body;
  // An exec retried: the command ran once.
  const std::string exec = json{{"argv", {"sh", "-c", "echo run >> /root/count; wc -l < /root/count"}}, {"stream", false}}.dump();
  ASSERT_OK_AND_ASSIGN(auto e1, bob.Raw("POST", "/v1/sandboxes/" + id + "/exec", exec, {"Idempotency-Key: exec-1"}));
  ASSERT_OK_AND_ASSIGN(auto e2, bob.Raw("POST", "/v1/sandboxes/" + id + "/exec", exec, {"Idempotency-Key: exec-1"}));
  EXPECT_EQ(e1.status, 200) << e1.body;
  EXPECT_EQ(e1.body, e2.body);
  EXPECT_EQ(Base64Decode(json::parse(e2.body)["stdout"].get<std::string>()).value_or(""), "1\n");

  // After kill -9 and a restart the keys still hold.
  StopDaemon(SIGKILL);
  Serve();
  bob = As(bob_);
  ASSERT_OK_AND_ASSIGN(auto again, create("create-1"));
  EXPECT_EQ(again.status, 201) << again.body;
  EXPECT_EQ(json::parse(again.body)["id"], id);
  ASSERT_OK_AND_ASSIGN(list, client_->List());
  EXPECT_EQ(list.size(), 1u) << list.dump();
  // Keys are per tenant: alice's "create-1" is hers.
  ASSERT_OK_AND_ASSIGN(auto hers, As(alice_).Raw("POST", "/v1/sandboxes", body, {"Idempotency-Key: create-1"}));
  EXPECT_EQ(hers.status, 201);
  EXPECT_NE(json::parse(hers.body)["id"], id);

  // A retried destroy answers as the first did.
  ASSERT_OK_AND_ASSIGN(auto d1, bob.Raw("DELETE", "/v1/sandboxes/" + id, "", {"Idempotency-Key: destroy-1"}));
  ASSERT_OK_AND_ASSIGN(auto d2, bob.Raw("DELETE", "/v1/sandboxes/" + id, "", {"Idempotency-Key: destroy-1"}));
  EXPECT_EQ(d1.status, 200) << d1.body;
  EXPECT_EQ(d2.status, 200) << d2.body;
  ASSERT_OK_AND_ASSIGN(auto d3, bob.Raw("DELETE", "/v1/sandboxes/" + id, ""));
  EXPECT_EQ(d3.status, 404) << d3.body;  // without the key: it is gone
}

TEST_F(ApiTest, NdjsonAndFramesCarryTheSameBytes) {
  Serve();
  auto bob = As(bob_);
  ASSERT_OK_AND_ASSIGN(auto made, bob.Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string id = json::parse(made.body)["id"];
  // Every byte value on both streams.
  const std::string script = "i=0; while [ $i -lt 256 ]; do printf \"\\\\$(printf %o $i)\"; i=$((i+1)); done; "
                             "printf 'err\\000\\377' >&2; exit 7";
  const std::string body = json{{"argv", {"sh", "-c", script}}}.dump();
  std::string frames_out, frames_err;
  ASSERT_OK_AND_ASSIGN(auto framed, bob.Exec(id, json::parse(body), [&](int s, std::string_view b) { (s == 1 ? frames_out : frames_err).append(b); }));
  EXPECT_EQ(framed.exit_code, 7);
  EXPECT_EQ(frames_out.size(), 256u);
  EXPECT_EQ(frames_err, std::string("err\0\377", 5));

  ASSERT_OK_AND_ASSIGN(auto nd, bob.Raw("POST", "/v1/sandboxes/" + id + "/exec", body, {"Accept: application/x-ndjson"}));
  ASSERT_EQ(nd.status, 200) << nd.body;
  EXPECT_EQ(Header(nd, "content-type"), "application/x-ndjson");
  std::string nd_out, nd_err;
  json exit;
  for (const auto& line : Split(nd.body, '\n')) {
    if (line.empty()) continue;
    json j = json::parse(line);  // every line is one JSON object
    if (j.contains("stdout")) nd_out += Base64Decode(j["stdout"].get<std::string>()).value_or("?");
    if (j.contains("stderr")) nd_err += Base64Decode(j["stderr"].get<std::string>()).value_or("?");
    if (j.contains("exit")) exit = j["exit"];
  }
  EXPECT_EQ(nd_out, frames_out);
  EXPECT_EQ(nd_err, frames_err);
  EXPECT_EQ(exit["exit_code"], 7) << nd.body;
  EXPECT_EQ(exit["stdout_bytes"], 256);
  // An exec that cannot start ends with an error line.
  ASSERT_OK_AND_ASSIGN(auto bad, bob.Raw("POST", "/v1/sandboxes/" + id + "/exec", R"({"argv":["/no/such/program"]})",
                                         {"Accept: application/x-ndjson"}));
  EXPECT_NE(bad.body.find("\"error\""), std::string::npos) << bad.body;
}

TEST_F(ApiTest, HostileClientsGetClearRefusalsAndCannotStarveOthers) {
  // Short deadlines so the test sees them; room for 500 idle connections.
  ServePlain({"--idle-timeout", "3s", "--request-timeout", "2s", "--max-connections-per-client", "600",
              "--max-body", "1M", "--max-upload", "1M"});
  const std::string auth = "Authorization: Bearer " + bob_ + "\r\n";
  LauncherClient bob(DaemonAddress{StrCat("http://127.0.0.1:", plain_port_), bob_, ""});
  ASSERT_OK_AND_ASSIGN(auto made, bob.Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string id = json::parse(made.body)["id"];
  auto status_of = [](const std::string& reply) { return reply.size() > 12 ? reply.substr(9, 3) : reply; };
  auto post = [&](const std::string& path, const std::string& body) {
    return StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\n", auth, "Content-Length: ", body.size(),
                  "\r\nConnection: close\r\n\r\n", body);
  };
  EXPECT_EQ(status_of(Exchange(plain_port_, post("/v1/sandboxes", "{not json"))), "400");
  EXPECT_EQ(status_of(Exchange(plain_port_, post("/v1/sandboxes", R"({"layers": "busybox:1"})"))), "400");
  EXPECT_EQ(status_of(Exchange(plain_port_, post("/v1/sandboxes", R"({"layers": ["busybox:1"], "memory": [1]})"))), "400");
  EXPECT_EQ(status_of(Exchange(plain_port_, post("/v1/sandboxes/" + id + "/exec", "{\"argv\": [\"echo\", \"\xff\xfe\"]}"))), "400");
  EXPECT_EQ(status_of(Exchange(plain_port_, post("/v1/sandboxes", R"({"layers": ["busybox:1"], "count": 100000})"))), "400");
  // Paths with ".." or a NUL.
  for (const std::string q : {"/etc/../etc/passwd", "/etc/passwd%00.txt", "relative", ""}) {
    std::string get = StrCat("GET /v1/sandboxes/", id, "/files?path=", q, " HTTP/1.1\r\nHost: x\r\n", auth, "Connection: close\r\n\r\n");
    EXPECT_EQ(status_of(Exchange(plain_port_, get)), "400") << q;
    std::string put = StrCat("PUT /v1/sandboxes/", id, "/files?path=", q, " HTTP/1.1\r\nHost: x\r\n", auth,
                             "Content-Length: 1\r\nConnection: close\r\n\r\nx");
    EXPECT_EQ(status_of(Exchange(plain_port_, put)), "400") << q;
  }
  // Huge headers and bodies.
  std::string huge_header = StrCat("GET /v1/health HTTP/1.1\r\nHost: x\r\n", auth, "X-Junk: ", std::string(100 << 10, 'a'), "\r\n\r\n");
  std::string reply = Exchange(plain_port_, huge_header);
  EXPECT_TRUE(reply.empty() || status_of(reply) == "431" || status_of(reply) == "413") << reply.substr(0, 100);
  EXPECT_EQ(status_of(Exchange(plain_port_, StrCat("POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n", auth,
                                                    "Content-Length: 100000000\r\nConnection: close\r\n\r\n{"))), "413");
  std::string big(2 << 20, 'x');
  EXPECT_EQ(status_of(Exchange(plain_port_, post("/v1/sandboxes", big))), "413");
  // An upload past its cap is refused and leaves the file as it was.
  ASSERT_OK(bob.Put(id, "/root/kept", "old", 0644));
  ASSERT_OK_AND_ASSIGN(auto over, bob.Raw("PUT", "/v1/sandboxes/" + id + "/files?path=/root/kept", big));
  EXPECT_EQ(over.status, 413) << over.body;
  ASSERT_OK_AND_ASSIGN(auto kept, bob.Get(id, "/root/kept"));
  EXPECT_EQ(kept, "old");
  ASSERT_OK_AND_ASSIGN(auto leftovers, bob.Exec(id, {{"argv", {"sh", "-c", "ls -a /root | grep -c strata-put"}}}, [](int, std::string_view) {}));
  EXPECT_EQ(leftovers.exit_code, 1);  // no temporary file left behind

  // 500 idle connections and a slowloris client.
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 500; ++i) {
    UniqueFd fd = Connect(plain_port_);
    ASSERT_TRUE(fd) << "connection " << i;
    idle.push_back(std::move(fd));
  }
  UniqueFd slow = Connect(plain_port_);
  ASSERT_TRUE(slow);
  std::atomic<bool> stop{false};
  std::thread loris([&] {
    std::string req = StrCat("GET /v1/health HTTP/1.1\r\nHost: x\r\n", auth, "X-Slow: ");
    for (size_t i = 0; i < req.size() + 200 && !stop; ++i) {
      char c = i < req.size() ? req[i] : 'a';
      if (::send(slow.get(), &c, 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(200ms);
    }
  });
  // Meanwhile a well-behaved client is answered at once (bound: 2 s).
  for (int i = 0; i < 5; ++i) {
    auto start = std::chrono::steady_clock::now();
    ASSERT_OK_AND_ASSIGN(auto r, bob.Exec(id, {{"argv", {"echo", "fine"}}}, [](int, std::string_view) {}));
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  }
  // The unix socket too.
  ASSERT_OK_AND_ASSIGN(auto via_unix, client_->Exec(id, {{"argv", {"true"}}}, [](int, std::string_view) {}));
  EXPECT_EQ(via_unix.exit_code, 0);
  // The slowloris client is cut off by the request deadline (2 s), the
  // idle ones by the idle timeout (3 s).
  EXPECT_TRUE(ClosedWithin(slow.get(), 5s));
  stop = true;
  loris.join();
  int closed = 0;
  for (auto& fd : idle) closed += ClosedWithin(fd.get(), 4s);
  EXPECT_EQ(closed, 500);
  ASSERT_OK_AND_ASSIGN(auto after, bob.Exec(id, {{"argv", {"true"}}}, [](int, std::string_view) {}));
  EXPECT_EQ(after.exit_code, 0);
}

TEST_F(ApiTest, ATcpClientThatGoesAwayAbandonsItsCommand) {
  ServePlain();
  LauncherClient bob(DaemonAddress{StrCat("http://127.0.0.1:", plain_port_), bob_, ""});
  ASSERT_OK_AND_ASSIGN(auto made, bob.Raw("POST", "/v1/sandboxes", CreateBody().dump()));
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string id = json::parse(made.body)["id"];
  auto running = [&] {
    std::string out;
    auto r = client_->Exec(id, {{"argv", {"sh", "-c", "ps -o args | grep -c '^sleep 61'"}}}, [&](int, std::string_view b) { out += b; });
    return r.ok() && out != "0\n";
  };
  for (bool stream : {false, true}) {
    const std::string body = json{{"argv", {"sleep", "61"}}, {"stream", stream}}.dump();
    UniqueFd fd = Connect(plain_port_);
    ASSERT_TRUE(fd);
    std::string req = StrCat("POST /v1/sandboxes/", id, "/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ", bob_,
                             "\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
    ASSERT_OK(WriteFull(fd.get(), req));
    for (int i = 0; i < 100 && !running(); ++i) std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(running()) << "the command did not start";
    fd.reset();  // the client goes away (a FIN, no hang-up on the daemon's side)
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      std::this_thread::sleep_for(50ms);
      gone = !running();
    }
    EXPECT_TRUE(gone) << "the abandoned command still runs (stream " << stream << ")";
  }
}

TEST_F(ApiTest, ConnectionsPerClientAreCapped) {
  ServePlain({"--max-connections-per-client", "8"});
  std::vector<UniqueFd> held;
  for (int i = 0; i < 8; ++i) held.push_back(Connect(plain_port_));
  UniqueFd ninth = Connect(plain_port_);
  ASSERT_TRUE(ninth);
  EXPECT_TRUE(ClosedWithin(ninth.get(), 2s));  // accepted and closed at once
  held.clear();
  std::this_thread::sleep_for(200ms);
  LauncherClient bob(DaemonAddress{StrCat("http://127.0.0.1:", plain_port_), bob_, ""});
  EXPECT_OK(bob.List().status());
}

// GET /v1/sandboxes/ID/usage: CPU time, memory and disk as the node sees
// them, against the create's limits; the owner's alone; and watching a
// sandbox does not renew its ttl.
TEST_F(ApiTest, UsageIsWhatASandboxHoldsAgainstItsLimits) {
  Serve();
  auto bob = As(bob_);
  ASSERT_OK_AND_ASSIGN(auto made, bob.Raw("POST", "/v1/sandboxes",
                                          CreateBody({{"memory", 256 << 20}, {"disk", 1 << 30}, {"cpus", 1}, {"ttl", 4}}).dump()));
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string id = json::parse(made.body)["id"];
  ASSERT_OK_AND_ASSIGN(json before, bob.Usage(id));
  EXPECT_EQ(before["id"], id);
  EXPECT_EQ(before["memory"]["limit"], 256 << 20);
  EXPECT_EQ(before["disk"]["limit"], 1 << 30);
  EXPECT_EQ(before["cpu"]["limit"], 1.0);
  EXPECT_GT(before["memory"].value("used", uint64_t{0}), 0u) << before.dump();
  ASSERT_TRUE(before["cpu"].contains("seconds")) << before.dump();
  ASSERT_TRUE(before["disk"].contains("used")) << before.dump();

  // 24 MiB written and synced (btrfs counts them at its commit), and a
  // second or so of CPU.
  ASSERT_OK_AND_ASSIGN(auto r, bob.Exec(id, {{"argv", {"sh", "-c", "dd if=/dev/zero of=/big bs=1M count=24 2>/dev/null && sync && "
                                                                    "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"}}},
                                        [](int, std::string_view) {}));
  EXPECT_EQ(r.exit_code, 0);
  ASSERT_OK_AND_ASSIGN(json after, bob.Usage(id));
  EXPECT_GT(after["cpu"]["seconds"].get<double>() - before["cpu"]["seconds"].get<double>(), 0.1) << after.dump();
  EXPECT_GE(after["disk"]["used"].get<uint64_t>(), uint64_t{24} << 20) << after.dump();
  EXPECT_LT(after["disk"]["used"].get<uint64_t>(), uint64_t{40} << 20) << after.dump();
  EXPECT_GE(after["memory"]["used"].get<uint64_t>(), after["memory"].value("cache", uint64_t{0})) << after.dump();
  EXPECT_GT(after["time"].get<double>(), before["time"].get<double>());

  // Another tenant's call finds no such sandbox.
  ASSERT_OK_AND_ASSIGN(auto theirs, As(alice_).Raw("GET", "/v1/sandboxes/" + id + "/usage", ""));
  EXPECT_EQ(theirs.status, 404) << theirs.body;

  // Asked every half second, it still ends at its ttl (4 s after the exec;
  // the reaper looks every 5 s).
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  int status = 200;
  while (status == 200 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(500ms);
    ASSERT_OK_AND_ASSIGN(auto u, bob.Raw("GET", "/v1/sandboxes/" + id + "/usage", ""));
    status = u.status;
  }
  EXPECT_EQ(status, 404) << "asking for its usage kept the sandbox alive";
}

TEST_F(ApiTest, InsecureListenersAreRefusedUnlessAskedFor) {
  auto serve = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {Tool(), "serve", "--socket", socket_, "--state", dir_.Sub("state")};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunCommand({.argv = argv, .env = env_, .timeout = 30s});
  };
  ASSERT_OK_AND_ASSIGN(auto tokenless, serve({"--listen", "127.0.0.1:0"}));
  EXPECT_NE(tokenless.exit_code, 0);
  EXPECT_NE(tokenless.err.find("without --tokens"), std::string::npos) << tokenless.err;
  ASSERT_OK_AND_ASSIGN(auto plain, serve({"--listen", "0.0.0.0:0", "--tokens", tokens_}));
  EXPECT_NE(plain.exit_code, 0);
  EXPECT_NE(plain.err.find("no TLS"), std::string::npos) << plain.err;
  ASSERT_OK(WriteFileAtomic(dir_.Sub("open-tokens"), "x sha256:" + std::string(64, 'a') + "\n", true, 0644));
  ASSERT_OK_AND_ASSIGN(auto readable, serve({"--listen", "127.0.0.1:0", "--tokens", dir_.Sub("open-tokens")}));
  EXPECT_NE(readable.exit_code, 0);
  EXPECT_NE(readable.err.find("chmod 600"), std::string::npos) << readable.err;
  // With --insecure it starts, and says so.
  StartDaemon({"--listen", "127.0.0.1:0", "--insecure"});
  std::string log = ReadFileToString(dir_.Sub("daemon.log")).value_or("");
  EXPECT_NE(log.find("WARNING: --listen 127.0.0.1:0 has no tokens"), std::string::npos) << log;
}

}  // namespace
}  // namespace strata::launcher
