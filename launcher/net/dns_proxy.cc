// The DNS proxy: policy per question, upstream forwarding, admission.
#include "launcher/net/dns_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/log.h"
#include "common/strings.h"

namespace strata::launcher {

namespace dns {

namespace {
constexpr size_t kHeader = 12;
uint16_t Get16(std::string_view m, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(m[at]) << 8) | static_cast<uint8_t>(m[at + 1]));
}
uint32_t Get32(std::string_view m, size_t at) { return (uint32_t{Get16(m, at)} << 16) | Get16(m, at + 2); }
void Put16(std::string& m, size_t at, uint16_t v) {
  m[at] = static_cast<char>(v >> 8);
  m[at + 1] = static_cast<char>(v & 255);
}

// Reads a (possibly compressed) name at `at`; sets `end` past it in place.
std::optional<std::string> ReadName(std::string_view m, size_t at, size_t* end) {
  std::string name;
  bool jumped = false;
  for (int hops = 0; hops < 64; ++hops) {
    if (at >= m.size()) return std::nullopt;
    uint8_t len = static_cast<uint8_t>(m[at]);
    if ((len & 0xc0) == 0xc0) {
      if (at + 1 >= m.size()) return std::nullopt;
      if (!jumped) *end = at + 2;
      jumped = true;
      at = ((len & 0x3f) << 8) | static_cast<uint8_t>(m[at + 1]);
      continue;
    }
    if (len & 0xc0) return std::nullopt;
    if (len == 0) {
      if (!jumped) *end = at + 1;
      return name;
    }
    if (at + 1 + len > m.size() || name.size() + len > 253) return std::nullopt;
    if (!name.empty()) name.push_back('.');
    for (size_t i = 0; i < len; ++i) name.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(m[at + 1 + i]))));
    at += 1 + len;
  }
  return std::nullopt;
}
}  // namespace

std::optional<Question> ParseQuestion(std::string_view m) {
  if (m.size() < kHeader) return std::nullopt;
  const uint16_t flags = Get16(m, 2);
  if ((flags & 0x8000) || ((flags >> 11) & 0xf) != 0 || Get16(m, 4) != 1) return std::nullopt;  // a query, opcode QUERY, one question
  Question q;
  size_t end = 0;
  auto name = ReadName(m, kHeader, &end);
  if (!name || end + 4 > m.size()) return std::nullopt;
  q.name = *name;
  q.type = Get16(m, end);
  q.end = end + 4;
  return q;
}

std::optional<std::vector<ARecord>> ParseAnswers(std::string_view m) {
  if (m.size() < kHeader) return std::nullopt;
  const uint16_t qd = Get16(m, 4), an = Get16(m, 6);
  size_t at = kHeader;
  for (uint16_t i = 0; i < qd; ++i) {
    size_t end = 0;
    if (!ReadName(m, at, &end) || end + 4 > m.size()) return std::nullopt;
    at = end + 4;
  }
  std::vector<ARecord> out;
  for (uint16_t i = 0; i < an; ++i) {
    size_t end = 0;
    if (!ReadName(m, at, &end) || end + 10 > m.size()) return std::nullopt;
    const uint16_t type = Get16(m, end), klass = Get16(m, end + 2), rdlen = Get16(m, end + 8);
    const uint32_t ttl = Get32(m, end + 4);
    if (end + 10 + rdlen > m.size()) return std::nullopt;
    if (type == 1 && klass == 1 && rdlen == 4) out.push_back({Get32(m, end + 10), ttl});
    at = end + 10 + rdlen;
  }
  return out;
}

std::string EmptyAnswer(std::string_view query, const Question& q, int rcode) {
  std::string r(query.substr(0, q.end));
  const uint16_t flags = Get16(query, 2);
  Put16(r, 2, static_cast<uint16_t>(0x8000 | (flags & 0x0100) | 0x0080 | (rcode & 0xf)));  // QR, RD as asked, RA
  Put16(r, 6, 0);
  Put16(r, 8, 0);
  Put16(r, 10, 0);
  return r;
}

}  // namespace dns

namespace {
constexpr int kNxDomain = 3, kRefused = 5, kServFail = 2;
constexpr int kMaxTcpConnections = 256;
constexpr int kMaxTcpPerSource = 8;
constexpr int kMaxQueued = 1024;      // UDP queries waiting or in flight, in all
constexpr int kMaxQueuedPerSource = 64;
constexpr uint16_t kTypeAAAA = 28;

// Reads n bytes within timeout_ms in all (a trickle does not extend it).
bool ReadFull(int fd, void* buf, size_t n, int timeout_ms) {
  auto* p = static_cast<char*>(buf);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (n) {
    const int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    pollfd pfd{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&pfd, 1, left) <= 0) return false;
    ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t r = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (r <= 0) return false;
    data.remove_prefix(static_cast<size_t>(r));
  }
  return true;
}

std::string WithLength(std::string_view msg) {
  std::string out(2, '\0');
  out[0] = static_cast<char>(msg.size() >> 8);
  out[1] = static_cast<char>(msg.size() & 255);
  out.append(msg);
  return out;
}
}  // namespace

DnsProxy::DnsProxy(DnsProxyConfig config, DnsProxyHooks hooks) : config_(config), hooks_(std::move(hooks)) {}

Result<std::unique_ptr<DnsProxy>> DnsProxy::Start(const DnsProxyConfig& config, DnsProxyHooks hooks) {
  std::unique_ptr<DnsProxy> p(new DnsProxy(config, std::move(hooks)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(config.port);
  addr.sin_addr.s_addr = htonl(config.listen);
  const std::string where = StrCat(Ipv4ToString(config.listen), ":", config.port);
  int one = 1;
  p->udp_ = UniqueFd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  p->tcp_ = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (p->udp_.get() < 0 || p->tcp_.get() < 0) return ErrnoError(errno, "DNS proxy: socket");
  for (int fd : {p->udp_.get(), p->tcp_.get()}) {
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    ::setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return ErrnoError(errno, "DNS proxy: bind " + where);
  }
  if (::listen(p->tcp_.get(), 128) != 0) return ErrnoError(errno, "DNS proxy: listen on " + where);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return ErrnoError(errno, "DNS proxy: pipe");
  p->wake_r_ = UniqueFd(pipefd[0]);
  p->wake_w_ = UniqueFd(pipefd[1]);
  p->pool_ = std::make_unique<ThreadPool>(16, 1);
  p->udp_thread_ = std::thread([raw = p.get()] { raw->ServeUdp(); });
  p->tcp_thread_ = std::thread([raw = p.get()] { raw->ServeTcp(); });
  return p;
}

DnsProxy::~DnsProxy() {
  stopping_ = true;
  if (wake_w_.get() >= 0) (void)!::write(wake_w_.get(), "x", 1);
  if (udp_thread_.joinable()) udp_thread_.join();
  if (tcp_thread_.joinable()) tcp_thread_.join();
  // Connections end at once (their reads see the shutdown), and none
  // outlives the proxy: they call its hooks.
  std::unique_lock lock(mu_);
  for (int fd : tcp_fds_) ::shutdown(fd, SHUT_RDWR);
  tcp_done_.wait(lock, [this] { return tcp_fds_.empty(); });
  lock.unlock();
  pool_.reset();  // (finishes queued queries first)
}

DnsCounts DnsProxy::Counts(uint32_t source) const {
  std::lock_guard lock(mu_);
  auto it = counts_.find(source);
  return it == counts_.end() ? DnsCounts{} : it->second;
}

void DnsProxy::Forget(uint32_t source) {
  std::lock_guard lock(mu_);
  counts_.erase(source);
}

void DnsProxy::ServeUdp() {
  char buf[4096];
  while (!stopping_) {
    pollfd fds[2] = {{udp_.get(), POLLIN, 0}, {wake_r_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (stopping_ || fds[1].revents) break;
    if (!(fds[0].revents & POLLIN)) continue;
    sockaddr_in from{};
    socklen_t len = sizeof from;
    ssize_t n = ::recvfrom(udp_.get(), buf, sizeof buf, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &len);
    if (n <= 0) continue;
    // Bounded: a flood (or names whose servers never answer) drops
    // queries, first those of the source that floods; clients retry.
    const uint32_t source = ntohl(from.sin_addr.s_addr);
    {
      std::lock_guard lock(mu_);
      int& mine = queued_[source];
      if (queued_total_ >= kMaxQueued || mine >= kMaxQueuedPerSource) continue;
      ++mine;
      ++queued_total_;
    }
    std::string query(buf, static_cast<size_t>(n));
    pool_->Submit([this, from, source, query = std::move(query)] {
      std::string answer = Handle(source, query, false);
      if (!answer.empty()) {
        ::sendto(udp_.get(), answer.data(), answer.size(), 0, reinterpret_cast<const sockaddr*>(&from), sizeof from);
      }
      std::lock_guard lock(mu_);
      if (--queued_[source] <= 0) queued_.erase(source);
      --queued_total_;
    });
  }
}

void DnsProxy::ServeTcp() {
  while (!stopping_) {
    pollfd fds[2] = {{tcp_.get(), POLLIN, 0}, {wake_r_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (stopping_ || fds[1].revents) break;
    if (!(fds[0].revents & POLLIN)) continue;
    sockaddr_in from{};
    socklen_t len = sizeof from;
    UniqueFd fd(::accept4(tcp_.get(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC));
    if (fd.get() < 0) continue;
    const uint32_t source = ntohl(from.sin_addr.s_addr);
    {
      // (Refused ones are closed: the client retries.)
      std::lock_guard lock(mu_);
      int& mine = tcp_by_source_[source];
      if (tcp_fds_.size() >= kMaxTcpConnections || mine >= kMaxTcpPerSource) continue;
      ++mine;
      tcp_fds_.insert(fd.get());
    }
    std::thread([this, fd = std::move(fd), source]() mutable {
      const int raw = fd.get();
      ServeTcpConnection(std::move(fd), source);
      std::lock_guard lock(mu_);
      tcp_fds_.erase(raw);
      if (--tcp_by_source_[source] <= 0) tcp_by_source_.erase(source);
      tcp_done_.notify_all();
    }).detach();
  }
}

void DnsProxy::ServeTcpConnection(UniqueFd fd, uint32_t source) {
  // Queries one after another, each with its 2-byte length; idle for 10 s
  // and the connection is closed.
  while (!stopping_) {
    uint8_t len[2];
    if (!ReadFull(fd.get(), len, 2, 10000)) return;
    size_t n = (size_t{len[0]} << 8) | len[1];
    std::string query(n, '\0');
    if (n == 0 || !ReadFull(fd.get(), query.data(), n, 10000)) return;
    std::string answer = Handle(source, query, true);
    if (answer.empty() || !WriteFull(fd.get(), WithLength(answer))) return;
  }
}

std::string DnsProxy::Handle(uint32_t source, std::string_view query, bool tcp) {
  auto q = dns::ParseQuestion(query);
  if (!q) {
    if (query.size() < 12) return "";
    dns::Question header_only;
    header_only.end = 12;
    std::string r = dns::EmptyAnswer(query, header_only, 1);  // FORMERR
    r[4] = r[5] = 0;  // no question echoed
    return r;
  }
  std::optional<NetPolicy> policy = hooks_.policy ? hooks_.policy(source) : std::nullopt;
  if (!policy) return dns::EmptyAnswer(query, *q, kRefused);
  std::vector<uint16_t> ports = policy->PortsForName(q->name);
  if (ports.empty()) {
    std::lock_guard lock(mu_);
    ++counts_[source].refused;
    return dns::EmptyAnswer(query, *q, kNxDomain);
  }
  // Sandboxes have no IPv6: an admitted name has no AAAA records for them.
  if (q->type == kTypeAAAA) {
    std::lock_guard lock(mu_);
    ++counts_[source].answered;
    return dns::EmptyAnswer(query, *q, 0);
  }
  auto answer = AskUpstream(query, tcp);
  if (!answer) return dns::EmptyAnswer(query, *q, kServFail);
  auto records = dns::ParseAnswers(*answer);
  if (!records) return dns::EmptyAnswer(query, *q, kServFail);
  // Admit before the answer leaves: grouped by TTL.
  std::map<uint32_t, std::vector<uint32_t>> by_ttl;
  for (const auto& r : *records) by_ttl[std::min<uint32_t>(r.ttl, 86400)].push_back(r.address);
  for (const auto& [ttl, addresses] : by_ttl) {
    Status s = hooks_.admit ? hooks_.admit(source, q->name, addresses, ports, ttl + config_.grace_seconds) : OkStatus();
    if (!s.ok()) {
      STRATA_LOG(kWarn) << "DNS proxy: " << s.ToString();
      return dns::EmptyAnswer(query, *q, kServFail);
    }
  }
  {
    std::lock_guard lock(mu_);
    ++counts_[source].answered;
  }
  return *answer;
}

std::optional<std::string> DnsProxy::AskUpstream(std::string_view query, bool tcp) {
  std::string q(query);
  uint16_t id;
  if (::getrandom(&id, sizeof id, 0) != sizeof id) return std::nullopt;
  const uint16_t client_id = static_cast<uint16_t>((static_cast<uint8_t>(query[0]) << 8) | static_cast<uint8_t>(query[1]));
  q[0] = static_cast<char>(id >> 8);
  q[1] = static_cast<char>(id & 255);
  auto restore = [&](std::string r) {
    r[0] = static_cast<char>(client_id >> 8);
    r[1] = static_cast<char>(client_id & 255);
    return r;
  };
  auto matches = [&](std::string_view r) {
    return r.size() >= 12 && r[0] == q[0] && r[1] == q[1] && (static_cast<uint8_t>(r[2]) & 0x80);
  };
  const auto* up = reinterpret_cast<const sockaddr*>(&config_.upstream);
  if (!tcp) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      if (fd.get() < 0 || ::connect(fd.get(), up, sizeof config_.upstream) != 0) return std::nullopt;
      if (::send(fd.get(), q.data(), q.size(), 0) < 0) return std::nullopt;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.upstream_timeout_ms / 2);
      char buf[65536];
      while (true) {
        int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
        pollfd pfd{fd.get(), POLLIN, 0};
        if (left <= 0 || ::poll(&pfd, 1, left) <= 0) break;
        ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
        if (n <= 0) break;
        std::string_view r(buf, static_cast<size_t>(n));
        if (!matches(r)) continue;
        if (!(static_cast<uint8_t>(r[2]) & 0x02)) return restore(std::string(r));  // not truncated
        tcp = true;  // truncated: ask again over TCP (the client will too)
        break;
      }
      if (tcp) break;
    }
    if (!tcp) return std::nullopt;
  }
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) return std::nullopt;
  if (::connect(fd.get(), up, sizeof config_.upstream) != 0 && errno != EINPROGRESS) return std::nullopt;
  pollfd pfd{fd.get(), POLLOUT, 0};
  if (::poll(&pfd, 1, config_.upstream_timeout_ms) <= 0) return std::nullopt;
  int err = 0;
  socklen_t elen = sizeof err;
  ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
  if (err) return std::nullopt;
  int flags = ::fcntl(fd.get(), F_GETFL);
  ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  if (!WriteFull(fd.get(), WithLength(q))) return std::nullopt;
  uint8_t len[2];
  if (!ReadFull(fd.get(), len, 2, config_.upstream_timeout_ms)) return std::nullopt;
  std::string r((size_t{len[0]} << 8) | len[1], '\0');
  if (r.empty() || !ReadFull(fd.get(), r.data(), r.size(), config_.upstream_timeout_ms) || !matches(r)) return std::nullopt;
  return restore(std::move(r));
}

}  // namespace strata::launcher
