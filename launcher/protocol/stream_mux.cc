// StreamMux: many byte streams over one channel, in one poll() loop.
#include "launcher/protocol/stream_mux.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <new>
#include <vector>

#include "common/frame.h"
#include "common/strings.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kIdSize = 4;
// Local ends are not read while more than this waits to go out on the
// channel: the channel is the bottleneck, and bytes wait as well in the
// local sockets as here.
constexpr size_t kChannelHighWater = 1 << 20;
// The channel is not read while more than this waits to go out. Only our
// answers to the peer's frames (credits, kHello) can grow the buffer past
// the high-water mark, so only a peer that sends without reading gets here.
constexpr size_t kChannelHardLimit = 4 << 20;
constexpr size_t kChannelReadSize = 256 << 10;
// Connections beyond what the listener loop takes in one wake-up wait for
// the next, so that the streams are served in between.
constexpr int kAcceptsPerWakeup = 64;
// Out of descriptors, accept() fails while the listener stays readable:
// wait this long instead of spinning.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
// On the guest, after kGone, the bytes buffered for the agent's end are
// written out as long as it keeps taking them; one that stalls this long is
// closed anyway. A client that closes fully must end the agent's command
// even when the command reads no input (the agent sees POLLHUP only once we
// close). The host gives its clients no such limit: what the agent wrote
// before it closed is the client's, however slowly it reads.
constexpr auto kGoneStall = std::chrono::milliseconds(500);
// The host repeats its kHello until the guest's arrives, first after this
// long and then at twice the interval each time, up to kHelloRetryMax. A
// guest that notices the end of the host's last connection only after the
// new host's kHello arrived loses that kHello with the old connection's
// state; the next one finds it waiting.
constexpr auto kHelloRetry = std::chrono::milliseconds(250);
constexpr auto kHelloRetryMax = std::chrono::seconds(4);

void PutLe32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

uint32_t GetLe32(std::string_view s) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(s[i])) << (8 * i);
  return v;
}

std::string Le32(uint32_t v) {
  std::string s(4, '\0');
  PutLe32(s.data(), v);
  return s;
}

// The first bytes of every kHello frame: type, payload length 8, stream 0.
// A side hunts for them at the start of a connection (see ParseChannel).
std::string_view HelloPrefix() {
  static const char prefix[] = {static_cast<char>(MuxFrame::kHello), 8, 0, 0, 0, 0, 0, 0, 0};
  return {prefix, sizeof prefix};
}

bool IsAgain(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

Status SetNonBlocking(int fd, std::string_view what) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return ErrnoError(errno, StrCat("make the ", what, " non-blocking"));
  }
  return OkStatus();
}

StreamMux::Options Normalize(StreamMux::Options options) {
  // Credits travel as 32-bit counts; a window of 0 would never move a byte.
  options.window = std::clamp<size_t>(options.window, 1, size_t{1} << 30);
  return options;
}

}  // namespace

struct StreamMux::Stream {
  uint32_t id = 0;
  UniqueFd fd;
  size_t credit = 0;       // bytes we may still send the peer
  std::string to_local;    // bytes from the peer not yet written to fd, from to_local_off
  size_t to_local_off = 0;
  size_t uncredited = 0;   // bytes written to fd and not yet credited back
  bool read_eof = false;   // reading fd returned 0 (kEof or kGone sent)
  bool peer_eof = false;   // kEof received
  bool shut_wr = false;    // shutdown(SHUT_WR) after kEof and the flush
  bool peer_gone = false;  // kGone received: flush, then close
  bool local_hup = false;  // POLLHUP/POLLERR seen: drain the input, then kGone (see OnLocalHangup)
  std::chrono::steady_clock::time_point gone_deadline;  // peer_gone: close if no progress by then
  size_t pending() const { return to_local.size() - to_local_off; }
};

StreamMux::StreamMux(Options options)
    : options_(Normalize(std::move(options))),
      // Half a window keeps the sender busy while the credit travels; a
      // credit per 64 KiB keeps the channel free of tiny frames.
      credit_batch_(std::clamp<size_t>(options_.window / 2, 1, kMuxMaxData)),
      stop_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!stop_fd_.valid()) stop_errno_ = errno;
}

StreamMux::~StreamMux() = default;

void StreamMux::Stop() {
  if (!stop_fd_.valid()) return;
  uint64_t one = 1;
  // Fails only when the counter is about to overflow: a Stop is pending then.
  ssize_t w = ::write(stop_fd_.get(), &one, sizeof one);
  (void)w;
}

Status StreamMux::Run(int channel, int listener) {
  Status status;
  // The guest agent runs this on its main thread: nothing may escape.
  try {
    status = Serve(channel, listener);
  } catch (const std::bad_alloc&) {
    status = Error(ENOMEM, "stream mux: out of memory");
  } catch (const std::exception& e) {
    status = Error(EIO, StrCat("stream mux: ", e.what()));
  } catch (...) {
    status = Error(EIO, "stream mux: unknown exception");
  }
  Reset();
  return status;
}

void StreamMux::Reset() {
  streams_.clear();  // closes every local end fully: its peer sees POLLHUP
  stream_count_.store(0, std::memory_order_relaxed);
  std::string().swap(in_);
  std::string().swap(out_);
  in_off_ = out_off_ = 0;
  channel_ = -1;
  channel_closed_ = false;
  channel_is_socket_ = true;
  synced_ = false;
  next_id_ = 1;
  rotate_ = 0;
  listener_paused_until_ = {};
  hello_retry_ = kHelloRetry;
  hello_again_at_ = {};
  ++epoch_;
}

Status StreamMux::Serve(int channel, int listener) {
  if (!stop_fd_.valid()) return ErrnoError(stop_errno_, "stream mux: create the stop eventfd");
  Reset();
  STRATA_RETURN_IF_ERROR(SetNonBlocking(channel, "mux channel"));
  if (options_.host && listener >= 0) STRATA_RETURN_IF_ERROR(SetNonBlocking(listener, "mux listener"));
  channel_ = channel;
  if (!chunk_) chunk_ = std::make_unique<char[]>(kMuxMaxData);
  if (options_.host) {
    QueueHello();
    hello_again_at_ = Clock::now() + hello_retry_;
  }

  std::vector<pollfd> fds;
  std::vector<uint32_t> ids;  // the stream of fds[kFixed + i]
  std::vector<uint32_t> stream_ids;
  constexpr size_t kFixed = 3;  // stop, channel, listener
  while (true) {
    fds.clear();
    ids.clear();
    fds.push_back({stop_fd_.get(), POLLIN, 0});
    short channel_events = 0;
    if (OutPending() < kChannelHardLimit) channel_events |= POLLIN;
    if (OutPending() > 0) channel_events |= POLLOUT;
    fds.push_back({channel, channel_events, 0});
    const auto now = Clock::now();
    // The host opens streams only once the guest has answered its kHello:
    // a kHello repeated before that cannot drop one.
    const bool accepting = options_.host && listener >= 0 && synced_ && now >= listener_paused_until_;
    fds.push_back({accepting ? listener : -1, POLLIN, 0});
    auto wake_at = Clock::time_point::max();
    if (options_.host && !synced_) wake_at = hello_again_at_;
    else if (options_.host && listener >= 0 && !accepting) wake_at = listener_paused_until_;
    // Round-robin: while the channel is backed up, the first stream served
    // would otherwise take every byte of room that frees up.
    auto start = streams_.upper_bound(rotate_);
    if (start == streams_.end()) start = streams_.begin();
    if (start != streams_.end()) rotate_ = start->first;
    for (size_t k = 0, count = streams_.size(); k < count; ++k) {
      Stream& s = *start->second;
      if (++start == streams_.end()) start = streams_.begin();
      if (s.peer_gone && !options_.host) wake_at = std::min(wake_at, s.gone_deadline);
      ids.push_back(s.id);
      if (s.local_hup) {
        // An agent's end that closed with bytes left to read: read on as
        // credit comes back. Not polled meanwhile (it would report POLLHUP
        // at once, every time).
        fds.push_back({CanRead(s) ? s.fd.get() : -1, POLLIN, 0});
        continue;
      }
      // Even with no events, poll() reports POLLHUP: a local peer that
      // closes is noticed while its stream waits for credit.
      short events = 0;
      if (CanRead(s)) events |= POLLIN;
      if (s.pending() > 0) events |= POLLOUT;
      fds.push_back({s.fd.get(), events, 0});
    }
    int timeout = -1;
    if (wake_at != Clock::time_point::max()) {
      auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now);
      timeout = static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 60'000));
    }

    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "stream mux: poll");
    }
    if (fds[0].revents != 0) {
      uint64_t count;
      ssize_t r = ::read(stop_fd_.get(), &count, sizeof count);  // re-arms for the next Run
      (void)r;
      return OkStatus();
    }

    const uint64_t epoch = epoch_;
    const short channel_revents = fds[1].revents;
    if (channel_revents & POLLNVAL) return Error(EBADF, "mux channel: not an open descriptor");
    if (channel_revents & (POLLIN | POLLHUP | POLLERR)) {
      bool eof = false;
      STRATA_RETURN_IF_ERROR(ReadChannel((channel_revents & (POLLHUP | POLLERR)) != 0, &eof));
      if (eof) {
        // The peer went away. What it sent before goes to the local ends
        // as far as they take it now; then Run closes them all.
        stream_ids.clear();
        for (auto& [id, s] : streams_) stream_ids.push_back(id);
        for (uint32_t id : stream_ids) {
          if (Stream* s = Find(id)) WriteLocal(*s);
        }
        return OkStatus();
      }
    }
    if (fds[2].revents & POLLNVAL) return Error(EBADF, "mux listener: not an open descriptor");
    if (fds[2].revents != 0) STRATA_RETURN_IF_ERROR(Accept(listener));

    // A kHello read above replaced every stream: the revents are of old ones.
    if (epoch == epoch_) {
      for (size_t i = 0; i < ids.size(); ++i) {
        const short revents = fds[kFixed + i].revents;
        if (revents == 0) continue;
        Stream* s = Find(ids[i]);
        if (s == nullptr) continue;
        if (s->local_hup || (revents & (POLLHUP | POLLERR | POLLNVAL))) {
          OnLocalHangup(*s);  // not POLLOUT: the local peer takes nothing more
          continue;
        }
        if ((revents & POLLOUT) && !WriteLocal(*s)) continue;
        if (revents & POLLIN) ReadLocal(*s, /*drain=*/false);
      }
    }
    // Local ends that stalled after kGone.
    stream_ids.clear();
    const auto after = Clock::now();
    for (auto& [id, s] : streams_) {
      if (s->peer_gone && !options_.host && s->gone_deadline <= after) stream_ids.push_back(id);
    }
    for (uint32_t id : stream_ids) {
      if (Stream* s = Find(id)) Forget(*s);
    }

    if (options_.host && !synced_ && after >= hello_again_at_) {
      if (OutPending() == 0) QueueHello();  // (else the last one has not even left)
      hello_retry_ = std::min<Clock::duration>(hello_retry_ * 2, kHelloRetryMax);
      hello_again_at_ = after + hello_retry_;
    }
    STRATA_RETURN_IF_ERROR(FlushChannel());
    if (channel_closed_) return OkStatus();
  }
}

Status StreamMux::ReadChannel(bool hangup, bool* eof) {
  // One read per wake-up keeps the local ends served in between; after a
  // hang-up, everything left is read now.
  do {
    const size_t at = in_.size();
    in_.resize(at + kChannelReadSize);
    ssize_t n = ::read(channel_, in_.data() + at, kChannelReadSize);
    in_.resize(at + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) {
      STRATA_RETURN_IF_ERROR(ParseChannel());
      continue;
    }
    if (n == 0) {
      *eof = true;
      return OkStatus();
    }
    if (errno == EINTR) continue;
    // A virtio-serial port whose host side is gone polls POLLHUP; read()
    // returns 0 there, but never spin on one that says EAGAIN.
    if (IsAgain(errno)) {
      *eof = hangup;
      return OkStatus();
    }
    if (errno == ECONNRESET || errno == EPIPE) {
      *eof = true;
      return OkStatus();
    }
    return ErrnoError(errno, "read the mux channel");
  } while (hangup);
  return OkStatus();
}

Status StreamMux::ParseChannel() {
  if (!synced_) {
    // A port outlives its connections: the start of what arrives may be the
    // tail of a frame of an earlier connection. Everything before the
    // peer's kHello is skipped.
    std::string_view prefix = HelloPrefix();
    size_t pos = in_.find(prefix.data(), in_off_, prefix.size());
    if (pos == std::string::npos) {
      size_t keep = std::min(in_.size() - in_off_, prefix.size() - 1);
      in_.erase(0, in_.size() - keep);
      in_off_ = 0;
      return OkStatus();
    }
    in_off_ = pos;
    synced_ = true;
  }
  while (in_off_ < in_.size()) {
    uint8_t type = 0;
    std::string_view payload;
    auto used = DecodeFrame(std::string_view(in_).substr(in_off_), &type, &payload);
    if (!used.ok()) return std::move(used).status().Annotate("mux channel");
    if (*used == 0) break;
    in_off_ += *used;  // HandleFrame leaves in_ alone: `payload` stays valid
    STRATA_RETURN_IF_ERROR(HandleFrame(type, payload).Annotate("mux channel"));
  }
  if (in_off_ == in_.size()) {
    in_.clear();
    in_off_ = 0;
  } else if (in_off_ > 0) {
    in_.erase(0, in_off_);
    in_off_ = 0;
  }
  return OkStatus();
}

Status StreamMux::HandleFrame(uint8_t type, std::string_view payload) {
  if (payload.size() < kIdSize) return Error(EPROTO, StrCat("frame of type ", type, " without a stream id"));
  const uint32_t id = GetLe32(payload);
  const std::string_view body = payload.substr(kIdSize);
  switch (static_cast<MuxFrame>(type)) {
    case MuxFrame::kHello: {
      if (id != 0 || body.size() != 4) return Error(EPROTO, "malformed hello frame");
      const uint32_t version = GetLe32(body);
      if (version != kMuxVersion) {
        return Error(EPROTO, StrCat("the peer speaks stream mux protocol ", version, ", this end ", kMuxVersion));
      }
      if (!options_.host) {
        // A (re)connected host: the streams of its predecessor are gone.
        DropStreams();
        QueueHello();
      }
      return OkStatus();
    }
    case MuxFrame::kOpen:
      if (options_.host) return Error(EPROTO, StrCat("the guest opened stream ", id, "; only the host opens streams"));
      if (id == 0) return Error(EPROTO, "stream 0 opened (stream ids start at 1)");
      if (streams_.count(id) != 0) return Error(EPROTO, StrCat("stream ", id, " opened twice"));
      OpenStream(id);
      return OkStatus();
    case MuxFrame::kData: {
      if (body.size() > kMuxMaxData) {
        return Error(EPROTO, StrCat("data frame of ", body.size(), " bytes on stream ", id, " (at most ", kMuxMaxData, ")"));
      }
      Stream* s = Find(id);
      if (s == nullptr) return OkStatus();  // one we sent kGone for; the peer did not know yet
      if (s->peer_eof || s->peer_gone) return Error(EPROTO, StrCat("data on stream ", id, " after its end"));
      if (s->local_hup) return OkStatus();  // its local end takes nothing more; it reads on (OnLocalHangup)
      if (s->pending() + s->uncredited + body.size() > options_.window) {
        return Error(EPROTO, StrCat("stream ", id, ": the peer sent past the window of ", options_.window, " bytes"));
      }
      const bool was_empty = s->pending() == 0;
      s->to_local.append(body);
      // When bytes are waiting already, the local end was full: POLLOUT says when it is not.
      if (was_empty) WriteLocal(*s);
      return OkStatus();
    }
    case MuxFrame::kEof: {
      Stream* s = Find(id);
      if (s == nullptr || s->peer_gone) return OkStatus();
      s->peer_eof = true;
      WriteLocal(*s);  // shuts the local end for writing once it has everything
      return OkStatus();
    }
    case MuxFrame::kGone: {
      Stream* s = Find(id);
      if (s == nullptr) return OkStatus();
      s->peer_gone = true;
      s->uncredited = 0;
      s->gone_deadline = Clock::now() + kGoneStall;
      WriteLocal(*s);  // forgets the stream once the buffered bytes are out
      return OkStatus();
    }
    case MuxFrame::kCredit: {
      if (body.size() != 4) return Error(EPROTO, StrCat("malformed credit frame on stream ", id));
      Stream* s = Find(id);
      if (s == nullptr) return OkStatus();
      s->credit += GetLe32(body);
      if (s->credit > options_.window) {
        return Error(EPROTO, StrCat("stream ", id, ": the peer credited more bytes than were sent"));
      }
      return OkStatus();
    }
  }
  return Error(EPROTO, StrCat("unknown frame type ", type, " (stream ", id, ")"));
}

Status StreamMux::FlushChannel() {
  while (OutPending() > 0 && !channel_closed_) {
    const char* p = out_.data() + out_off_;
    // send() for MSG_NOSIGNAL: a vanished peer is EPIPE, not SIGPIPE. A
    // virtio-serial port is a character device: write().
    ssize_t n = channel_is_socket_ ? ::send(channel_, p, OutPending(), MSG_NOSIGNAL)
                                   : ::write(channel_, p, OutPending());
    if (n > 0) {
      out_off_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == ENOTSOCK && channel_is_socket_) {
      channel_is_socket_ = false;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && IsAgain(errno)) break;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      channel_closed_ = true;  // the peer went away
      break;
    }
    return ErrnoError(n < 0 ? errno : EIO, "write the mux channel");
  }
  if (out_off_ == out_.size()) {
    out_.clear();
    out_off_ = 0;
  } else if (out_off_ >= kChannelHighWater) {
    out_.erase(0, out_off_);
    out_off_ = 0;
  }
  return OkStatus();
}

Status StreamMux::Accept(int listener) {
  for (int i = 0; i < kAcceptsPerWakeup; ++i) {
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (IsAgain(errno)) return OkStatus();
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The connection stays queued; a closing stream may free a descriptor.
        listener_paused_until_ = Clock::now() + kAcceptBackoff;
        return OkStatus();
      }
      return ErrnoError(errno, "accept on the mux listener");
    }
    UniqueFd owned(fd);
    if (next_id_ == 0) next_id_ = 1;  // after 2^32 connections
    const uint32_t id = next_id_++;
    Queue(MuxFrame::kOpen, id, {});
    AddStream(id, std::move(owned));
  }
  return OkStatus();
}

void StreamMux::OpenStream(uint32_t id) {
  UniqueFd fd;
  // The callback reports its own failures; the host just sees the stream end.
  if (options_.open_local) {
    auto local = options_.open_local();
    if (local.ok()) fd = std::move(*local);
  }
  if (!fd.valid() || !SetNonBlocking(fd.get(), "local end").ok()) {
    Queue(MuxFrame::kGone, id, {});
    return;
  }
  AddStream(id, std::move(fd));
}

void StreamMux::AddStream(uint32_t id, UniqueFd fd) {
  auto s = std::make_unique<Stream>();
  s->id = id;
  s->fd = std::move(fd);
  s->credit = options_.window;
  streams_[id] = std::move(s);
  stream_count_.store(streams_.size(), std::memory_order_relaxed);
}

void StreamMux::DropStreams() {
  streams_.clear();
  stream_count_.store(0, std::memory_order_relaxed);
  ++epoch_;
}

StreamMux::Stream* StreamMux::Find(uint32_t id) {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second.get();
}

bool StreamMux::CanRead(const Stream& s) const {
  return !s.read_eof && !s.peer_gone && s.credit > 0 && OutPending() < kChannelHighWater;
}

bool StreamMux::ReadLocal(Stream& s, bool drain) {
  // A drain after a hang-up ignores the channel's backlog: it happens once
  // per stream, and the credit bounds it.
  while (drain ? !s.read_eof && !s.peer_gone && s.credit > 0 : CanRead(s)) {
    ssize_t n = ::read(s.fd.get(), chunk_.get(), std::min(kMuxMaxData, s.credit));
    if (n > 0) {
      Queue(MuxFrame::kData, s.id, {chunk_.get(), static_cast<size_t>(n)});
      s.credit -= static_cast<size_t>(n);
      if (!drain) return true;  // one chunk per wake-up: streams take turns
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && IsAgain(errno) && !s.local_hup) return true;
    if (n == 0) {
      s.read_eof = true;
      // A half-close, or the second half of one: after our own SHUT_WR,
      // the local peer's SHUT_WR shows as POLLHUP too.
      if (!s.local_hup || s.shut_wr) {
        Queue(MuxFrame::kEof, s.id, {});
        return MaybeFinish(s);
      }
    }
    // The local peer closed fully (or reading failed: ECONNRESET): nothing
    // more goes either way.
    Queue(MuxFrame::kGone, s.id, {});
    Forget(s);
    return false;
  }
  return true;
}

bool StreamMux::OnLocalHangup(Stream& s) {
  const bool first = !s.local_hup;
  s.local_hup = true;
  if (s.peer_gone) {
    Forget(s);
    return false;
  }
  // What the local peer wrote before it closed goes first (POLLIN and
  // POLLHUP come together), as far as the credit reaches now.
  if (!ReadLocal(s, /*drain=*/first)) return false;  // all of it: the stream ended
  if (!options_.host) {
    // The agent writes its answer and closes, as over TCP: the rest of what
    // it wrote goes out as the host credits it back (the host's client
    // leaving ends the stream sooner). What the host sends meanwhile has
    // nowhere to go.
    std::string().swap(s.to_local);
    s.to_local_off = 0;
    s.uncredited = 0;
    return true;
  }
  // A client that closes fully has given up on the stream (one that wants
  // its answer half-closes): the rest of its input is dropped, and the
  // agent learns of it now, not when its own end reads again — it kills a
  // command whose client went away, even one that never reads its input.
  Queue(MuxFrame::kGone, s.id, {});
  Forget(s);
  return false;
}

bool StreamMux::WriteLocal(Stream& s) {
  while (s.pending() > 0) {
    const char* p = s.to_local.data() + s.to_local_off;
    ssize_t n = ::send(s.fd.get(), p, s.pending(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == ENOTSOCK) n = ::write(s.fd.get(), p, s.pending());
    if (n > 0) {
      s.to_local_off += static_cast<size_t>(n);
      if (s.peer_gone) {
        s.gone_deadline = Clock::now() + kGoneStall;
      } else {
        s.uncredited += static_cast<size_t>(n);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (n < 0 && IsAgain(errno))) break;
    // EPIPE, ECONNRESET: the local peer takes no more.
    if (!s.peer_gone) Queue(MuxFrame::kGone, s.id, {});
    Forget(s);
    return false;
  }
  if (s.pending() == 0) {
    // Drained: a large buffer goes back (streams idle most of their life).
    if (s.to_local.capacity() > kMuxMaxData) {
      std::string().swap(s.to_local);
    } else {
      s.to_local.clear();
    }
    s.to_local_off = 0;
  } else if (s.to_local_off >= kMuxMaxData && s.to_local_off * 2 >= s.to_local.size()) {
    s.to_local.erase(0, s.to_local_off);
    s.to_local_off = 0;
  }
  if (s.uncredited > 0 && (s.uncredited >= credit_batch_ || s.pending() == 0)) {
    Queue(MuxFrame::kCredit, s.id, Le32(static_cast<uint32_t>(s.uncredited)));
    s.uncredited = 0;
  }
  if (s.pending() > 0) return true;
  if (s.peer_gone) {
    Forget(s);
    return false;
  }
  if (s.peer_eof && !s.shut_wr) {
    // A failure (the local peer is gone) shows as POLLHUP next.
    ::shutdown(s.fd.get(), SHUT_WR);
    s.shut_wr = true;
  }
  return MaybeFinish(s);
}

bool StreamMux::MaybeFinish(Stream& s) {
  if (!s.read_eof || !s.shut_wr) return true;
  Forget(s);
  return false;
}

void StreamMux::Forget(Stream& s) {
  streams_.erase(s.id);  // closes the fd; `s` is gone
  stream_count_.store(streams_.size(), std::memory_order_relaxed);
}

void StreamMux::QueueHello() { Queue(MuxFrame::kHello, 0, Le32(kMuxVersion)); }

void StreamMux::Queue(MuxFrame type, uint32_t id, std::string_view body) {
  // The frame of common/frame.h, built in place: a data chunk is copied once.
  const size_t at = out_.size();
  out_.resize(at + kFrameHeader + kIdSize + body.size());
  char* p = out_.data() + at;
  p[0] = static_cast<char>(type);
  PutLe32(p + 1, static_cast<uint32_t>(kIdSize + body.size()));
  PutLe32(p + kFrameHeader, id);
  if (!body.empty()) std::memcpy(p + kFrameHeader + kIdSize, body.data(), body.size());
}

}  // namespace strata
