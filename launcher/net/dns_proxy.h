// The node's DNS proxy for sandbox networks. Every sandbox's resolv.conf
// names it (the gateway address, port 53, UDP and TCP); the firewall lets no
// other DNS out. For each question it asks the sandbox's policy (by the
// query's source address, which the firewall ties to the sandbox's
// interface): a refused name gets NXDOMAIN without leaving the node; an
// admitted one goes to the upstream resolver, and the A records of the
// answer are admitted for that sandbox until their TTL (plus a grace) runs
// out *before* the answer is sent, so no connect can race the rule.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <condition_variable>
#include <set>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "common/unique_fd.h"
#include "launcher/net/policy.h"

namespace strata::launcher {

struct DnsProxyConfig {
  uint32_t listen = 0;       // the gateway address
  uint16_t port = 53;
  sockaddr_in upstream{};    // the resolver admitted names go to
  uint32_t grace_seconds = 5;
  int upstream_timeout_ms = 2000;
};

struct DnsProxyHooks {
  // The policy of the sandbox at `source`; nullopt when no sandbox has it.
  std::function<std::optional<NetPolicy>(uint32_t source)> policy;
  // Admits `addresses` (what `name` resolved to) on `ports` for the
  // sandbox at `source` for `seconds`.
  std::function<Status(uint32_t source, const std::string& name, const std::vector<uint32_t>& addresses,
                       const std::vector<uint16_t>& ports, uint32_t seconds)>
      admit;
};

struct DnsCounts {
  uint64_t answered = 0;  // names forwarded and answered
  uint64_t refused = 0;   // names answered NXDOMAIN by the policy
};

class DnsProxy {
 public:
  static Result<std::unique_ptr<DnsProxy>> Start(const DnsProxyConfig& config, DnsProxyHooks hooks);
  ~DnsProxy();

  DnsCounts Counts(uint32_t source) const;
  void Forget(uint32_t source);

  // Answers one query (the wire bytes of a DNS message) from `source`;
  // empty when no answer is due. Public for tests.
  std::string Handle(uint32_t source, std::string_view query, bool tcp);

 private:
  DnsProxy(DnsProxyConfig config, DnsProxyHooks hooks);
  void ServeUdp();
  void ServeTcp();
  void ServeTcpConnection(UniqueFd fd, uint32_t source);
  std::optional<std::string> AskUpstream(std::string_view query, bool tcp);

  DnsProxyConfig config_;
  DnsProxyHooks hooks_;
  UniqueFd udp_, tcp_, wake_r_, wake_w_;
  std::atomic<bool> stopping_{false};
  std::set<int> tcp_fds_;                   // open TCP connections (under mu_)
  std::map<uint32_t, int> tcp_by_source_;
  std::condition_variable tcp_done_;
  std::map<uint32_t, int> queued_;          // UDP queries per source
  int queued_total_ = 0;
  std::unique_ptr<ThreadPool> pool_;
  std::thread udp_thread_, tcp_thread_;
  mutable std::mutex mu_;
  std::map<uint32_t, DnsCounts> counts_;
};

// Parsing of the little of DNS the proxy needs (RFC 1035), for tests too.
namespace dns {
struct Question {
  std::string name;  // lower-case, no trailing dot
  uint16_t type = 0;
  size_t end = 0;    // offset just past the question
};
std::optional<Question> ParseQuestion(std::string_view msg);
struct ARecord {
  uint32_t address;
  uint32_t ttl;
};
// The A records of an answer's answer section.
std::optional<std::vector<ARecord>> ParseAnswers(std::string_view msg);
// An answer to `query` with `rcode` and no records.
std::string EmptyAnswer(std::string_view query, const Question& q, int rcode);
}  // namespace dns

}  // namespace strata::launcher
