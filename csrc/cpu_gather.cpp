// CPU gather for narrow units: the permuted dim's indices moved as torch's
// gather moves them (destination i <- source perm[i], in order of i, the
// caller's perm read as it is), through a buffer a few lines of every unit
// at a time, then copied back. No plan, so a first call costs what a later
// one does: a cycle plan is an int32 an index, built by walking cycles at
// random through memory, while the units here are at most 4 bytes a line.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "executors.h"

#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "csrc/cpu_gather.cpp must be built with -fopenmp (csrc/build_config.txt)"
#endif

namespace flashmla_perm {
namespace {

// Lines of every unit a pass: as many as fit kCpuGatherBytesPerIndex a unit.
int64_t lines_a_pass(const UnitView& v) {
  return std::max<int64_t>(1, std::min(v.lines, kCpuGatherBytesPerIndex / v.line_bytes));
}

// Indices a chunk of ATen's loop: sequential runs of perm long enough that
// the loop's overhead is nothing beside them.
constexpr int64_t kGrain = 32 * 1024;
// Units ahead whose source line is prefetched (its address is in perm).
constexpr int64_t kAhead = 16;

// With `seen`, perm is checked as it is read, in kCheckLanes halves of the
// indices, each with a bit an index of its own (a bitmap shared between
// threads had its lines move from core to core on every store, and an
// atomic OR an index stalls the loads behind it): a value out of range
// clears `in_range` (and is not read through); each other sets its bit.
template <int W, bool kCheck, class T>
void gather_range(const UnitView& v, const T* perm, int64_t n, int64_t begin, int64_t end,
                  const int64_t* offs, int64_t nl, uint8_t* buffer, uint64_t* seen, bool& ok) {
  const int64_t w = W > 0 ? W : v.line_bytes, stride = v.unit_stride, off0 = offs[0];
  const uint8_t* data = v.data;
  const T* __restrict p = perm;
  uint8_t* __restrict out = buffer + begin * nl * w;
  for (int64_t i = begin; i < end; ++i) {
    if (i + kAhead < end) {
      const int64_t ahead = p[i + kAhead];
      if (!kCheck || (ahead >= 0 && ahead < n)) __builtin_prefetch(data + ahead * stride + off0);
    }
    if constexpr (kCheck) {
      const int64_t u = p[i];
      if (u < 0 || u >= n) {
        ok = false;
        out += nl * w;
        continue;
      }
      seen[u >> 6] |= uint64_t{1} << (u & 63);
    }
    const uint8_t* src = data + static_cast<int64_t>(p[i]) * stride;
    if (nl == 1) {
      std::memcpy(out, src + off0, static_cast<size_t>(w));
      out += w;
      continue;
    }
    for (int64_t j = 0; j < nl; ++j, out += w) std::memcpy(out, src + offs[j], static_cast<size_t>(w));
  }
}

constexpr int64_t kCheckLanes = 2;

// buffer[i][j] <- line l0 + j of unit perm[i], for the nl lines of one pass;
// with `seen` (kCheckLanes bitmaps of `words`), checked: false where perm
// is not a permutation. Everything the loops read is a local first: their
// byte stores may alias anything else, which had every captured field
// loaded again each index.
template <int W, class T>
bool gather_pass(const UnitView& v, const T* perm, int64_t n, const int64_t* off, int64_t nl, uint8_t* buffer,
                 uint64_t* seen) {
  int64_t offs[kCpuGatherBytesPerIndex];
  for (int64_t j = 0; j < nl; ++j) offs[j] = off[j];
  if (!seen) {
    at::parallel_for(0, n, kGrain, [=](int64_t begin, int64_t end) {
      bool ok = true;
      gather_range<W, false>(v, perm, n, begin, end, offs, nl, buffer, nullptr, ok);
    });
    return true;
  }
  const int64_t words = (n + 63) / 64, half = (n + kCheckLanes - 1) / kCheckLanes;
  std::atomic<bool> in_range{true};
  at::parallel_for(0, kCheckLanes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t lane = begin; lane < end; ++lane) {
      bool ok = true;
      gather_range<W, true>(v, perm, n, lane * half, std::min(n, (lane + 1) * half), offs, nl, buffer,
                            seen + lane * words, ok);
      if (!ok) in_range = false;
    }
  });
  if (!in_range) return false;
  // Every index seen (n values among n positions: none twice).
  // Every index seen (n values among n positions: none twice). One thread:
  // a bit an index is quickly counted, and waking a second (on a busy
  // machine) took longer than the count.
  int64_t found = 0;
  for (int64_t i = 0; i < words; ++i) {
    uint64_t any = 0;
    for (int64_t lane = 0; lane < kCheckLanes; ++lane) any |= seen[lane * words + i];
    found += __builtin_popcountll(any);
  }
  return found == n;
}

// Line l0 + j of unit i <- buffer[i][j].
template <int W>
void copy_back(const UnitView& v, int64_t n, const int64_t* off, int64_t nl, const uint8_t* buffer) {
  const int64_t w = W > 0 ? W : v.line_bytes, stride = v.unit_stride;
  uint8_t* data = v.data;
  // In order on both sides: threads only for copies of several MiB (waking
  // one took longer than a copy of a few).
  const int64_t grain = std::max<int64_t>(kGrain, (int64_t{8} << 20) / (nl * w));
  if (nl == 1 && stride == w && off[0] == 0) {  // one contiguous run
    at::parallel_for(0, n, grain, [=](int64_t begin, int64_t end) {
      std::memcpy(data + begin * w, buffer + begin * w, static_cast<size_t>((end - begin) * w));
    });
    return;
  }
  int64_t offs[kCpuGatherBytesPerIndex];
  for (int64_t j = 0; j < nl; ++j) offs[j] = off[j];
  at::parallel_for(0, n, grain, [=](int64_t begin, int64_t end) {
    const uint8_t* __restrict in = buffer + begin * nl * w;
    for (int64_t i = begin; i < end; ++i) {
      uint8_t* dst = data + i * stride;
      for (int64_t j = 0; j < nl; ++j, in += w) std::memcpy(dst + offs[j], in, static_cast<size_t>(w));
    }
  });
}

// With `seen`, the first pass checks perm and returns false, having
// written nothing, where the check fails.
template <int W, class T>
bool gather_view(const UnitView& v, const T* perm, int64_t n, uint8_t* buffer, uint64_t* seen) {
  const int64_t per_pass = lines_a_pass(v);
  int64_t off[kCpuGatherBytesPerIndex];
  for (int64_t l0 = 0; l0 < v.lines; l0 += per_pass) {
    const int64_t nl = std::min(per_pass, v.lines - l0);
    for (int64_t j = 0; j < nl; ++j) off[j] = v.line_at.offset(l0 + j);
    if (!gather_pass<W>(v, perm, n, off, nl, buffer, l0 == 0 ? seen : nullptr)) return false;
    copy_back<W>(v, n, off, nl, buffer);
  }
  return true;
}

template <class T>
bool gather_any(const UnitView& v, const T* perm, int64_t n, uint8_t* buffer, uint64_t* seen) {
  switch (v.line_bytes) {
    case 1: return gather_view<1>(v, perm, n, buffer, seen);
    case 2: return gather_view<2>(v, perm, n, buffer, seen);
    case 4: return gather_view<4>(v, perm, n, buffer, seen);
    default: return gather_view<0>(v, perm, n, buffer, seen);
  }
}

}  // namespace

bool cpu_gathers(const UnitView& view) { return view.line_bytes <= kCpuGatherBytesPerIndex; }

int64_t cpu_gather_check_words(int64_t n) { return kCheckLanes * ((n + 63) / 64); }

int64_t cpu_gather_buffer_bytes(const UnitView& view, int64_t n) {
  return n * lines_a_pass(view) * view.line_bytes;
}

bool run_gather_cpu(const UnitView& view, const int64_t* perm, int64_t n, uint8_t* buffer, uint64_t* seen) {
  return gather_any(view, perm, n, buffer, seen);
}

bool run_gather_cpu(const UnitView& view, const int32_t* perm, int64_t n, uint8_t* buffer, uint64_t* seen) {
  return gather_any(view, perm, n, buffer, seen);
}

}  // namespace flashmla_perm
