// StreamMux: many byte streams multiplexed over one byte-stream channel (the
// virtio-serial port between a microVM's agent and the host).
//
// Wire format: frames of common/frame.h whose payload is a 4-byte
// little-endian stream id followed by the body (MuxFrame below). The host
// opens streams (ids 1, 2, ... per connection); either side half-closes
// (kEof) or drops (kGone) a stream. Each side has at most `window` bytes of
// a stream sent and not yet credited back (kCredit), so memory stays bounded
// whatever the local peers or the channel do. Both ends must use the same
// window.
//
// Local ends are unix stream sockets. Bytes read from one go to the peer's
// local end. A local end that half-closes (shutdown SHUT_WR) sends kEof and
// still gets its answer. One that closes fully (POLLHUP, or EPIPE on write):
//  - on the host, a client that gave up: kGone goes at once (its input
//    beyond the stream's credit is dropped);
//  - on the guest, an agent that wrote its answer and closed, as over TCP:
//    everything it wrote goes out as credit comes back, then kGone.
// The peer then writes out what it buffered and closes its local end fully:
// the host however slowly its client reads; the guest while the agent's end
// keeps taking bytes (after half a second without progress it gives up, so
// that a client's leaving ends a command that reads no input).
//
// Compiled into the static guest agent: depends only on libc, libstdc++ and
// common/{frame,status,strings,unique_fd}.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/unique_fd.h"

namespace strata {

inline constexpr uint32_t kMuxVersion = 1;
// The largest body of one kData frame.
inline constexpr size_t kMuxMaxData = 64 << 10;

enum class MuxFrame : uint8_t {
  kHello = 1,   // id 0, body: 4-byte LE version. Host sends it first (and again until the guest's
                // arrives; it opens no stream before); the guest drops all streams and answers each.
  kOpen = 2,    // host -> guest: a new stream.
  kData = 3,    // body: at most kMuxMaxData bytes of the stream.
  kEof = 4,     // the sender sends no more data on the stream.
  kGone = 5,    // the sender's local end closed fully; the sender forgot the stream.
  kCredit = 6,  // body: 4-byte LE count of bytes the receiver wrote to its local end.
};

class StreamMux {
 public:
  struct Options {
    // Host: Run sends kHello and makes a stream of every connection accepted
    // on its listener. Guest: the peer opens streams.
    bool host = false;
    // Guest: the local end of a stream the host opened (e.g. one end of a
    // socketpair whose other end goes to the agent). The mux owns the fd
    // from then on. Unset or failing: the stream is refused with kGone.
    std::function<Result<UniqueFd>()> open_local;
    // Bytes of one stream either side may have in flight.
    size_t window = 1 << 20;
  };

  explicit StreamMux(Options options);
  ~StreamMux();
  StreamMux(const StreamMux&) = delete;
  StreamMux& operator=(const StreamMux&) = delete;

  // Serves streams over `channel` (a socket or a character device; set
  // non-blocking here) until:
  //  - Stop() is called: returns OK;
  //  - the channel reaches end of file, POLLHUP or EPIPE/ECONNRESET (the
  //    peer went away): returns OK;
  //  - the channel fails or the peer breaks the protocol: returns an error
  //    naming the step ("mux channel: frame of N bytes is too large").
  // Host: every connection accepted on `listener` (-1: none; set
  // non-blocking here) becomes a stream.
  // Neither `channel` nor `listener` is owned or closed. Every stream's
  // local fd is closed when Run returns. Bytes before the peer's first
  // kHello are skipped (leftovers of an earlier connection on the port).
  // May be called again after it returned (the guest does so when the host
  // reconnects); each call starts with no streams. One Run at a time.
  Status Run(int channel, int listener = -1);

  // Makes a running Run return soon; with no Run running, the next Run
  // returns at once. Thread-safe.
  void Stop();

  // Number of open streams. Thread-safe.
  size_t streams() const { return stream_count_.load(std::memory_order_relaxed); }

 private:
  struct Stream;

  Status Serve(int channel, int listener);
  void Reset();
  Status ReadChannel(bool hangup, bool* eof);
  Status ParseChannel();
  Status HandleFrame(uint8_t type, std::string_view payload);
  Status FlushChannel();
  Status Accept(int listener);
  void OpenStream(uint32_t id);
  void AddStream(uint32_t id, UniqueFd fd);
  void QueueHello();
  void DropStreams();
  Stream* Find(uint32_t id);
  bool CanRead(const Stream& s) const;
  bool ReadLocal(Stream& s, bool drain);
  bool WriteLocal(Stream& s);
  bool OnLocalHangup(Stream& s);
  bool MaybeFinish(Stream& s);
  void Forget(Stream& s);
  void Queue(MuxFrame type, uint32_t id, std::string_view body);
  size_t OutPending() const { return out_.size() - out_off_; }

  const Options options_;
  const size_t credit_batch_;
  UniqueFd stop_fd_;  // eventfd
  int stop_errno_ = 0;
  std::atomic<size_t> stream_count_{0};

  // The state of one Run.
  int channel_ = -1;
  bool channel_closed_ = false;
  bool channel_is_socket_ = true;
  bool synced_ = false;  // the peer's kHello arrived
  uint32_t next_id_ = 1;
  uint32_t rotate_ = 0;  // streams are served round-robin from here
  std::chrono::steady_clock::time_point listener_paused_until_{};
  std::chrono::steady_clock::duration hello_retry_{};  // host, until synced_
  std::chrono::steady_clock::time_point hello_again_at_{};
  uint64_t epoch_ = 0;  // bumped when a kHello drops every stream
  std::map<uint32_t, std::unique_ptr<Stream>> streams_;
  std::string in_;  // channel bytes not yet parsed, from in_off_
  size_t in_off_ = 0;
  std::string out_;  // channel bytes not yet written, from out_off_
  size_t out_off_ = 0;
  std::unique_ptr<char[]> chunk_;
};

}  // namespace strata
