// How a host runs a tile body serially: one thread runs the whole tile, and a
// stage is a plain copy. The CPU executor runs its tiles this way, and the
// host harness runs them the same way to check the serial forms.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "launch.h"
#include "plan.h"

namespace flashmla_perm {

struct SerialCtx {
  static constexpr bool kSerial = true;
  int thread() const { return 0; }
  int num_threads() const { return 1; }
  void sync() {}
  template <int V>
  void stage(uint8_t* buf, const uint8_t* src) {
    std::memcpy(buf, src, V);
  }
  void stage_wait() {}
};

// Calls f(std::integral_constant<int, bytes>{}) for a chunk of 1..kMaxChunk
// bytes: host loads and stores need no alignment, so a tile moves whole
// chunks, wider than any GPU vector.
template <class F>
void with_chunk_bytes(int bytes, F&& f) {
  static_assert(kMaxChunk == 64, "cases below cover 1..64");
  switch (bytes) {
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    default: with_vector_width(bytes, f); break;
  }
}

}  // namespace flashmla_perm
