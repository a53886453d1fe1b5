// Frames on a stream: a 1-byte type, a 4-byte little-endian payload length,
// then the payload (at most kMaxFrame bytes). The agent protocol and the
// node's control sockets (docs/protocol.md) are made of them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

inline constexpr uint32_t kMaxFrame = 1 << 20;
inline constexpr size_t kFrameHeader = 5;

// Reads/writes one frame on a blocking descriptor. ReadFrame returns ENODATA
// at a clean end of stream (before any byte of a frame).
Status WriteFrame(int fd, uint8_t type, std::string_view payload);
Status ReadFrame(int fd, uint8_t* type, std::string* payload);

// The same frames in memory: one frame's bytes; and the first whole frame of
// `buffer`, returning the bytes it took (0 while the frame is incomplete).
std::string EncodeFrame(uint8_t type, std::string_view payload);
Result<size_t> DecodeFrame(std::string_view buffer, uint8_t* type, std::string_view* payload);

}  // namespace strata
