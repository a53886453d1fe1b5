// StreamMux: a host mux and a guest mux over a socketpair, with clients on a
// real unix listener and a serving thread per guest-side stream.
#include "launcher/protocol/stream_mux.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/frame.h"
#include "common/strings.h"
#include "common/unix_socket.h"
#include "tests/testing/test_util.h"

namespace strata {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Every blocking step of a test is bounded: a bug fails the test, it does
// not hang CTest.
constexpr auto kStepTimeout = 20s;

std::pair<UniqueFd, UniqueFd> SocketPair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    ADD_FAILURE() << "socketpair: " << std::strerror(errno);
    return {};
  }
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

void SetTimeouts(int fd, std::chrono::seconds t) {
  timeval tv{static_cast<time_t>(t.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Polls `fd` for `events` until `deadline`; the revents, 0 on timeout.
short WaitFor(int fd, short events, Clock::time_point deadline) {
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return 0;
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n > 0) return p.revents;
    if (n < 0 && errno != EINTR) return POLLERR;
  }
}

bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit = 5s) {
  const auto deadline = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

uint64_t Fnv1a(uint64_t h, std::string_view bytes) {
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}
constexpr uint64_t kFnvBasis = 14695981039346656037ull;

char PatternByte(size_t at) { return static_cast<char>(at % 251); }

double CpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Sends `data` on `fd`, half-closes, and reads until end of file, both at
// once (an echo needs it); each arriving piece goes to `sink`.
Status Pump(int fd, std::string_view data, const std::function<void(std::string_view)>& sink,
            Clock::time_point deadline) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  size_t sent = 0, received = 0;
  bool shut = false;
  std::string buf(64 << 10, '\0');
  while (true) {
    if (sent == data.size() && !shut) {
      ::shutdown(fd, SHUT_WR);
      shut = true;
    }
    short revents = WaitFor(fd, static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), deadline);
    if (revents == 0) {
      return Error(ETIMEDOUT, StrCat("timed out having sent ", sent, " of ", data.size(), " bytes and received ",
                                     received));
    }
    if ((revents & POLLOUT) && !shut) {
      ssize_t n = ::send(fd, data.data() + sent, std::min<size_t>(data.size() - sent, 64 << 10), MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) return ErrnoError(errno, "send");
    }
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno != EAGAIN && errno != EINTR) return ErrnoError(errno, "read");
      if (n == 0) {
        if (sent < data.size()) return Error(EPIPE, StrCat("end of stream after sending ", sent, " bytes"));
        return OkStatus();
      }
      if (n > 0) {
        received += static_cast<size_t>(n);
        sink({buf.data(), static_cast<size_t>(n)});
      }
    }
  }
}

Result<std::string> Exchange(int fd, std::string_view data) {
  std::string got;
  STRATA_RETURN_IF_ERROR(Pump(fd, data, [&](std::string_view s) { got.append(s); }, Clock::now() + kStepTimeout));
  return got;
}

std::string Le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

std::string HelloPayload() { return Le32(0) + Le32(kMuxVersion); }

uint8_t Type(MuxFrame f) { return static_cast<uint8_t>(f); }

// Reads frames on a blocking `fd` (with SO_RCVTIMEO) until one of `type`.
Result<std::string> ReadUntil(int fd, MuxFrame type) {
  for (int i = 0; i < 1000; ++i) {
    uint8_t t = 0;
    std::string payload;
    STRATA_RETURN_IF_ERROR(ReadFrame(fd, &t, &payload));
    if (t == Type(type)) return payload;
  }
  return Error(ENOENT, "no such frame in 1000");
}

// A Run on its own thread; the destructor stops it if it still runs and
// joins it.
class Running {
 public:
  Running(StreamMux& mux, int channel, int listener = -1) : mux_(mux) {
    std::packaged_task<Status()> task([&mux, channel, listener] { return mux.Run(channel, listener); });
    status_ = task.get_future();
    thread_ = std::thread(std::move(task));
  }
  ~Running() {
    if (status_.valid() && status_.wait_for(0s) != std::future_status::ready) mux_.Stop();
    if (thread_.joinable()) thread_.join();
  }
  // Run's status once it returned, or nullopt after `limit`.
  std::optional<Status> Wait(std::chrono::milliseconds limit = 5s) {
    if (status_.wait_for(limit) != std::future_status::ready) return std::nullopt;
    return status_.get();
  }

 private:
  StreamMux& mux_;
  std::future<Status> status_;
  std::thread thread_;
};

class StreamMuxTest : public ::testing::Test {
 protected:
  StreamMuxTest()
      : host_({.host = true}),
        guest_({.host = false, .open_local = [this]() -> Result<UniqueFd> { return OpenLocal(); }}) {}

  void SetUp() override {
    auto listener = ListenUnix(dir_.Sub("mux.sock"), 0600);
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    listener_ = std::move(*listener);
  }

  void TearDown() override {
    host_.Stop();
    guest_.Stop();
    host_run_.reset();
    guest_run_.reset();
    std::vector<std::thread> servers;
    {
      std::lock_guard lock(mu_);
      servers.swap(servers_);
    }
    for (auto& t : servers) t.join();  // every local end was closed with its Run
  }

  // Host and guest muxes on the two ends of a fresh channel.
  void Connect() {
    auto [host_end, guest_end] = SocketPair();
    host_channel_ = std::move(host_end);
    guest_channel_ = std::move(guest_end);
    guest_run_ = std::make_unique<Running>(guest_, guest_channel_.get());
    host_run_ = std::make_unique<Running>(host_, host_channel_.get(), listener_.get());
  }

  UniqueFd Client() {
    auto fd = ConnectUnix(dir_.Sub("mux.sock"), kStepTimeout);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    return fd.ok() ? std::move(*fd) : UniqueFd();
  }

  Result<UniqueFd> OpenLocal() {
    auto [mine, theirs] = SocketPair();
    std::lock_guard lock(mu_);
    servers_.emplace_back([this, fd = std::move(theirs)]() mutable { Serve(std::move(fd)); });
    return std::move(mine);
  }

  // The agent's side of a stream. The first byte says what to do:
  //  A: read the request to its end, answer "answer:<request>", close;
  //  E: echo everything until end of file, then close;
  //  F: flood: write until the stream breaks, counting in flooded_;
  //  B: write a pattern (PatternByte) until the stream is full, count it in
  //     flooded_, set filled_, and close;
  //  W: write "ready", then wait for POLLHUP and note when (hup_at_);
  //  S: the same, but never read;
  //  X: close at once.
  void Serve(UniqueFd fd) {
    SetTimeouts(fd.get(), 30s);
    char cmd = 0;
    if (::read(fd.get(), &cmd, 1) != 1) return;
    std::string buf(64 << 10, '\0');
    switch (cmd) {
      case 'A': {
        std::string request;
        ssize_t n;
        while ((n = ::read(fd.get(), buf.data(), buf.size())) > 0) request.append(buf.data(), static_cast<size_t>(n));
        SendAll(fd.get(), "answer:" + request);
        break;
      }
      case 'E': {
        ssize_t n;
        while ((n = ::read(fd.get(), buf.data(), buf.size())) > 0) {
          if (!SendAll(fd.get(), {buf.data(), static_cast<size_t>(n)})) break;
        }
        break;
      }
      case 'F':
        while (true) {
          ssize_t n = ::send(fd.get(), buf.data(), buf.size(), MSG_NOSIGNAL);
          if (n <= 0) break;
          flooded_ += static_cast<size_t>(n);
        }
        break;
      case 'B': {
        ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
        size_t at = 0;
        while (WaitFor(fd.get(), POLLOUT, Clock::now() + 300ms) & POLLOUT) {
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = PatternByte(at + i);
          ssize_t n = ::send(fd.get(), buf.data(), buf.size(), MSG_NOSIGNAL);
          if (n < 0 && errno != EAGAIN) break;
          if (n > 0) at += static_cast<size_t>(n);
        }
        flooded_ = at;
        filled_ = true;
        break;
      }
      case 'S':
      case 'W': {
        if (!SendAll(fd.get(), "ready")) break;
        const auto deadline = Clock::now() + kStepTimeout;
        short events = cmd == 'W' ? POLLIN : 0;
        while (true) {
          short revents = WaitFor(fd.get(), events, deadline);
          if (revents == 0) break;
          if (revents & POLLHUP) {
            std::lock_guard lock(mu_);
            hup_at_ = Clock::now();
            hup_cv_.notify_all();
            break;
          }
          if (revents & POLLIN) {
            if (::read(fd.get(), buf.data(), buf.size()) == 0) events = 0;  // half-closed: wait on
          }
        }
        break;
      }
      default:
        break;
    }
  }

  std::optional<Clock::time_point> WaitForHup() {
    std::unique_lock lock(mu_);
    hup_cv_.wait_for(lock, 5s, [&] { return hup_at_.has_value(); });
    return hup_at_;
  }

  TempDir dir_ = testing::MakeTempDir();
  UniqueFd listener_;
  StreamMux host_;
  StreamMux guest_;
  UniqueFd host_channel_, guest_channel_;
  std::unique_ptr<Running> host_run_, guest_run_;

  std::mutex mu_;
  std::vector<std::thread> servers_;
  std::condition_variable hup_cv_;
  std::optional<Clock::time_point> hup_at_;
  std::atomic<size_t> flooded_{0};
  std::atomic<bool> filled_{false};
};

// A client that half-closes still gets its answer; both muxes forget the
// stream afterwards.
TEST_F(StreamMuxTest, HalfClosedClientGetsItsAnswer) {
  Connect();
  for (int i = 0; i < 3; ++i) {
    UniqueFd client = Client();
    ASSERT_TRUE(client.valid());
    ASSERT_OK_AND_ASSIGN(std::string answer, Exchange(client.get(), StrCat("Aquestion ", i)));
    EXPECT_EQ(answer, StrCat("answer:question ", i));
  }
  EXPECT_TRUE(WaitUntil([&] { return host_.streams() == 0 && guest_.streams() == 0; }))
      << host_.streams() << " host streams, " << guest_.streams() << " guest streams";
}

// 20 streams at once, 3 MiB each way: flow control and interleaving keep
// every byte in its stream and in order.
TEST_F(StreamMuxTest, ConcurrentStreamsKeepTheirBytes) {
  Connect();
  constexpr int kStreams = 20;
  constexpr size_t kBytes = 3 << 20;
  std::vector<std::thread> clients;
  std::vector<Status> results(kStreams);
  std::vector<uint64_t> got_hash(kStreams, kFnvBasis), want_hash(kStreams);
  std::vector<size_t> got_bytes(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      std::string data = "E" + testing::RandomBytes(kBytes, 1000 + static_cast<uint64_t>(i));
      want_hash[i] = Fnv1a(kFnvBasis, std::string_view(data).substr(1));
      UniqueFd client = Client();
      results[i] = Pump(
          client.get(), data,
          [&](std::string_view s) {
            got_hash[i] = Fnv1a(got_hash[i], s);
            got_bytes[i] += s.size();
          },
          Clock::now() + 60s);
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_OK(results[i]);
    EXPECT_EQ(got_bytes[i], kBytes) << "stream " << i;
    EXPECT_EQ(got_hash[i], want_hash[i]) << "stream " << i;
  }
  EXPECT_TRUE(WaitUntil([&] { return host_.streams() == 0 && guest_.streams() == 0; }));
}

// A client that never reads holds its own stream only: another completes,
// and what the flooding agent side gets to write stays bounded by the
// window plus the sockets' buffers.
TEST_F(StreamMuxTest, SlowReaderStallsOnlyItsOwnStream) {
  Connect();
  UniqueFd flood_client = Client();
  ASSERT_TRUE(SendAll(flood_client.get(), "F"));
  ASSERT_TRUE(WaitUntil([&] { return flooded_ > 0; }));
  std::this_thread::sleep_for(300ms);

  UniqueFd client = Client();
  std::string data = "E" + testing::RandomBytes(2 << 20, 7);
  ASSERT_OK_AND_ASSIGN(std::string echoed, Exchange(client.get(), data));
  EXPECT_TRUE(echoed == data.substr(1)) << echoed.size() << " bytes echoed";

  // The flood stops: no byte moves while nobody reads, and the muxes wait
  // in poll() rather than spin. (On a loaded machine the last buffers may
  // take a while to fill: it has stopped once 300 ms pass without a byte.)
  size_t settled = flooded_;
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(300ms);
    if (flooded_ == settled) break;
    settled = flooded_;
  }
  const size_t flooded = flooded_;
  const double cpu_before = CpuSeconds();
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(flooded_, flooded);
  EXPECT_LT(CpuSeconds() - cpu_before, 0.05);
  int sndbuf = 0;
  socklen_t len = sizeof sndbuf;
  ::getsockopt(flood_client.get(), SOL_SOCKET, SO_SNDBUF, &sndbuf, &len);
  // A window in flight, and three sockets' buffers (agent's socketpair,
  // channel, client connection), with room for bookkeeping.
  const size_t bound = (1 << 20) + 3 * 2 * static_cast<size_t>(sndbuf) + (1 << 20);
  EXPECT_LT(flooded, bound) << "sndbuf " << sndbuf;
  EXPECT_EQ(host_.streams(), 1u);
}

// An agent's end that writes its answer and closes (as a command's output
// ends) is heard to the last byte, also what it wrote past the stream's
// credit and a client that pauses longer than the guest's stall limit.
TEST_F(StreamMuxTest, AnAgentThatClosesAfterWritingIsHeardToTheEnd) {
  Connect();
  UniqueFd client = Client();
  ASSERT_TRUE(SendAll(client.get(), "B"));
  ASSERT_TRUE(WaitUntil([&] { return filled_.load(); }, kStepTimeout)) << "the agent's end never filled";
  const size_t written = flooded_;
  EXPECT_GT(written, size_t{1} << 20);  // past the window: bytes wait in the agent's socket
  std::this_thread::sleep_for(200ms);   // its end has closed

  SetTimeouts(client.get(), 5s);
  std::string got;
  std::string buf(64 << 10, '\0');
  bool paused = false;
  while (true) {
    ssize_t n = ::read(client.get(), buf.data(), buf.size());
    ASSERT_GE(n, 0) << std::strerror(errno) << " after " << got.size() << " bytes";
    if (n == 0) break;
    got.append(buf.data(), static_cast<size_t>(n));
    if (!paused && got.size() > written / 2) {
      std::this_thread::sleep_for(1s);
      paused = true;
    }
  }
  ASSERT_EQ(got.size(), written);
  size_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != PatternByte(i);
  EXPECT_EQ(wrong, 0u);
  EXPECT_TRUE(WaitUntil([&] { return host_.streams() == 0 && guest_.streams() == 0; }));
}

// A client that closes fully mid-stream makes the agent's end see POLLHUP
// within a second (the agent kills the command then); the other way, an
// agent end that closes makes the client's connection hang up.
TEST_F(StreamMuxTest, FullCloseReachesTheOtherEnd) {
  Connect();
  UniqueFd client = Client();
  SetTimeouts(client.get(), 5s);
  ASSERT_TRUE(SendAll(client.get(), "Wsome input"));
  char ready[5];
  ASSERT_EQ(::recv(client.get(), ready, sizeof ready, MSG_WAITALL), 5);
  ASSERT_TRUE(SendAll(client.get(), "more input the agent never asked for"));
  const auto closed_at = Clock::now();
  client.reset();
  auto hup_at = WaitForHup();
  ASSERT_TRUE(hup_at.has_value()) << "the agent's end saw no POLLHUP";
  EXPECT_LT(*hup_at - closed_at, 1s);

  // Also when the agent's end reads nothing, and the client filled the
  // stream's window and its socket.
  {
    std::lock_guard lock(mu_);
    hup_at_.reset();
  }
  UniqueFd stuffing = Client();
  SetTimeouts(stuffing.get(), 5s);
  ASSERT_TRUE(SendAll(stuffing.get(), "S"));
  ASSERT_EQ(::recv(stuffing.get(), ready, sizeof ready, MSG_WAITALL), 5);
  ::fcntl(stuffing.get(), F_SETFL, ::fcntl(stuffing.get(), F_GETFL) | O_NONBLOCK);
  std::string block(64 << 10, 's');
  size_t stuffed = 0;
  while (WaitFor(stuffing.get(), POLLOUT, Clock::now() + 300ms) & POLLOUT) {
    ssize_t n = ::send(stuffing.get(), block.data(), block.size(), MSG_NOSIGNAL);
    if (n > 0) stuffed += static_cast<size_t>(n);
  }
  EXPECT_GT(stuffed, size_t{1} << 20);  // past the window: the host's end has unread input
  const auto stuffed_closed_at = Clock::now();
  stuffing.reset();
  hup_at = WaitForHup();
  ASSERT_TRUE(hup_at.has_value()) << "the agent's end that never reads saw no POLLHUP";
  EXPECT_LT(*hup_at - stuffed_closed_at, 2s);  // its buffered input is given half a second

  UniqueFd other = Client();
  ASSERT_TRUE(SendAll(other.get(), "X"));
  short revents = WaitFor(other.get(), POLLIN, Clock::now() + 1s);
  EXPECT_TRUE(revents & POLLHUP) << "revents " << revents;
  EXPECT_TRUE(WaitUntil([&] { return host_.streams() == 0 && guest_.streams() == 0; }));
}

// A new host connection: the guest's Run returns OK at the old channel's
// end, the old streams are closed, and a second Run serves the new host.
TEST_F(StreamMuxTest, GuestServesAReconnectedHost) {
  Connect();
  {
    UniqueFd client = Client();
    ASSERT_OK_AND_ASSIGN(std::string answer, Exchange(client.get(), "Aone"));
    EXPECT_EQ(answer, "answer:one");
  }
  UniqueFd waiting = Client();
  SetTimeouts(waiting.get(), 5s);
  ASSERT_TRUE(SendAll(waiting.get(), "W"));
  char ready[5];
  ASSERT_EQ(::recv(waiting.get(), ready, sizeof ready, MSG_WAITALL), 5);

  host_.Stop();
  auto host_status = host_run_->Wait();
  ASSERT_TRUE(host_status.has_value()) << "the host's Run did not return after Stop";
  EXPECT_OK(*host_status);
  EXPECT_EQ(host_.streams(), 0u);
  char c;
  EXPECT_EQ(::recv(waiting.get(), &c, 1, 0), 0) << "the host mux did not close its connection";
  host_channel_.reset();  // the daemon exits: end of file on the guest's channel

  auto guest_status = guest_run_->Wait();
  ASSERT_TRUE(guest_status.has_value()) << "the guest's Run did not return at the channel's end";
  EXPECT_OK(*guest_status);
  EXPECT_EQ(guest_.streams(), 0u);
  EXPECT_TRUE(WaitForHup().has_value()) << "the old stream's agent end was not closed";

  host_run_.reset();
  guest_run_.reset();
  Connect();  // the same muxes, Run again
  UniqueFd client = Client();
  ASSERT_OK_AND_ASSIGN(std::string answer, Exchange(client.get(), "Atwo"));
  EXPECT_EQ(answer, "answer:two");
}

// A host that reconnects over the same port without the guest seeing an end
// of file: its kHello drops every stream, and leftovers before it are skipped.
TEST_F(StreamMuxTest, HelloDropsEveryStream) {
  auto [host_end, guest_end] = SocketPair();
  guest_channel_ = std::move(guest_end);
  SetTimeouts(host_end.get(), 5s);
  guest_run_ = std::make_unique<Running>(guest_, guest_channel_.get());

  ASSERT_TRUE(SendAll(host_end.get(), std::string("\x03\x10\x00\x00\x00tail of a frame", 20)));
  ASSERT_OK(WriteFrame(host_end.get(), Type(MuxFrame::kHello), HelloPayload()));
  ASSERT_OK_AND_ASSIGN(std::string hello, ReadUntil(host_end.get(), MuxFrame::kHello));
  EXPECT_EQ(hello, HelloPayload());

  ASSERT_OK(WriteFrame(host_end.get(), Type(MuxFrame::kOpen), Le32(1)));
  ASSERT_OK(WriteFrame(host_end.get(), Type(MuxFrame::kData), Le32(1) + "W"));
  ASSERT_OK_AND_ASSIGN(std::string data, ReadUntil(host_end.get(), MuxFrame::kData));
  EXPECT_EQ(data, Le32(1) + "ready");
  EXPECT_EQ(guest_.streams(), 1u);

  const auto hello_at = Clock::now();
  ASSERT_OK(WriteFrame(host_end.get(), Type(MuxFrame::kHello), HelloPayload()));
  ASSERT_OK_AND_ASSIGN(hello, ReadUntil(host_end.get(), MuxFrame::kHello));
  auto hup_at = WaitForHup();
  ASSERT_TRUE(hup_at.has_value());
  EXPECT_LT(*hup_at - hello_at, 1s);
  EXPECT_EQ(guest_.streams(), 0u);
  // Stream ids start over with the new host.
  ASSERT_OK(WriteFrame(host_end.get(), Type(MuxFrame::kOpen), Le32(1)));
  ASSERT_OK(WriteFrame(host_end.get(), Type(MuxFrame::kData), Le32(1) + "Aq"));
  ASSERT_OK(WriteFrame(host_end.get(), Type(MuxFrame::kEof), Le32(1)));
  ASSERT_OK_AND_ASSIGN(data, ReadUntil(host_end.get(), MuxFrame::kData));
  EXPECT_EQ(data, Le32(1) + "answer:q");
  ASSERT_OK_AND_ASSIGN(std::string eof, ReadUntil(host_end.get(), MuxFrame::kEof));
  EXPECT_EQ(eof, Le32(1));
}

// A guest that lost the host's kHello (it noticed the last host's end only
// after the new one's kHello came, and dropped it with the old state): the
// host opens no stream until the guest answers, and says kHello again.
TEST_F(StreamMuxTest, HostRepeatsAHelloTheGuestLost) {
  auto [host_end, guest_end] = SocketPair();
  host_channel_ = std::move(host_end);
  guest_channel_ = std::move(guest_end);
  SetTimeouts(guest_channel_.get(), 5s);
  host_run_ = std::make_unique<Running>(host_, host_channel_.get(), listener_.get());
  ASSERT_OK_AND_ASSIGN(std::string lost, ReadUntil(guest_channel_.get(), MuxFrame::kHello));
  EXPECT_EQ(lost, HelloPayload());
  // A client before the guest answers waits for it; nothing reaches the guest meanwhile but kHello.
  UniqueFd client = Client();
  std::string bytes;
  char buf[256];
  ssize_t n;
  const auto until = Clock::now() + 200ms;
  while (Clock::now() < until && (n = ::recv(guest_channel_.get(), buf, sizeof buf, MSG_DONTWAIT)) != 0) {
    if (n > 0) bytes.append(buf, static_cast<size_t>(n));
    std::this_thread::sleep_for(5ms);
  }
  for (size_t at = 0; at < bytes.size(); at += 13) EXPECT_EQ(bytes[at], Type(MuxFrame::kHello)) << "at byte " << at;
  const auto started = Clock::now();
  guest_run_ = std::make_unique<Running>(guest_, guest_channel_.get());
  ASSERT_OK_AND_ASSIGN(std::string answer, Exchange(client.get(), "Alate"));
  EXPECT_EQ(answer, "answer:late");
  EXPECT_LT(Clock::now() - started, 2s);
}

// A peer breaking the protocol ends Run with an error that says how; the
// local ends are closed.
TEST_F(StreamMuxTest, BrokenFramesEndRunWithAnError) {
  struct Case {
    std::string bytes;
    int code;
    std::string error;
  };
  const std::string huge_header("\x03\xff\xff\xff\x7f", 5);
  const std::vector<Case> cases = {
      {huge_header + "xxxx", EMSGSIZE, "mux channel: frame of 2147483647 bytes is too large"},
      {EncodeFrame(99, Le32(1)), EPROTO, "mux channel: unknown frame type 99 (stream 1)"},
      {EncodeFrame(Type(MuxFrame::kData), "ab"), EPROTO, "without a stream id"},
      {EncodeFrame(Type(MuxFrame::kData), Le32(1) + std::string(kMuxMaxData + 1, 'x')), EPROTO, "at most 65536"},
      {EncodeFrame(Type(MuxFrame::kHello), Le32(0) + Le32(7)), EPROTO, "the peer speaks stream mux protocol 7, this end 1"},
      {EncodeFrame(Type(MuxFrame::kCredit), Le32(1) + Le32(100)), EPROTO, "stream 1: the peer credited more bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    auto [host_end, guest_end] = SocketPair();
    SetTimeouts(host_end.get(), 5s);
    Running run(guest_, guest_end.get());
    ASSERT_OK(WriteFrame(host_end.get(), Type(MuxFrame::kHello), HelloPayload()));
    ASSERT_OK(WriteFrame(host_end.get(), Type(MuxFrame::kOpen), Le32(1)));
    ASSERT_OK(WriteFrame(host_end.get(), Type(MuxFrame::kData), Le32(1) + "W"));
    ASSERT_OK(ReadUntil(host_end.get(), MuxFrame::kData).status());  // "ready": the stream is up
    ASSERT_TRUE(SendAll(host_end.get(), c.bytes));
    auto status = run.Wait();
    ASSERT_TRUE(status.has_value()) << "Run did not return";
    EXPECT_EQ(status->code(), c.code);
    EXPECT_NE(status->ToString().find(c.error), std::string::npos) << status->ToString();
    EXPECT_EQ(guest_.streams(), 0u);
  }

  // The host refuses a guest that opens streams.
  auto [host_end, guest_end] = SocketPair();
  SetTimeouts(guest_end.get(), 5s);
  Running run(host_, host_end.get(), listener_.get());
  ASSERT_OK(ReadUntil(guest_end.get(), MuxFrame::kHello).status());
  ASSERT_OK(WriteFrame(guest_end.get(), Type(MuxFrame::kHello), HelloPayload()));
  ASSERT_OK(WriteFrame(guest_end.get(), Type(MuxFrame::kOpen), Le32(1)));
  auto status = run.Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_NE(status->ToString().find("only the host opens streams"), std::string::npos) << status->ToString();

  // A channel that is no descriptor at all.
  Status bad = guest_.Run(-1);
  EXPECT_EQ(bad.code(), EBADF);
  EXPECT_NE(bad.ToString().find("mux channel"), std::string::npos) << bad.ToString();
}

TEST_F(StreamMuxTest, StopBeforeRunReturnsAtOnce) {
  auto [host_end, guest_end] = SocketPair();
  guest_.Stop();
  Running run(guest_, guest_end.get());
  auto status = run.Wait(2s);
  ASSERT_TRUE(status.has_value());
  EXPECT_OK(*status);
  // The Stop was used up: the next Run serves until stopped again.
  Running again(guest_, guest_end.get());
  EXPECT_FALSE(again.Wait(200ms).has_value());
  guest_.Stop();
  EXPECT_TRUE(again.Wait().has_value());
}

}  // namespace
}  // namespace strata
