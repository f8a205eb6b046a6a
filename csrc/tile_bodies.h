// Tile bodies: the only code that moves bytes. Written once, compiled by NVRTC
// (CUDA threads, __syncthreads, cp.async) and by the host compiler (one thread
// per tile, or std::threads with a std::barrier in the host harness). No ATen
// in here: plain pointers, sizes and strides in small params structs.
//
// An execution context `Ctx` provides:
//   static constexpr bool kSerial;          // one thread runs the whole tile
//   int thread() const;                     // this thread's index in the tile
//   int num_threads() const;
//   static constexpr bool kWholeWarps;      // (parallel) num_threads() is a multiple of kWarp
//   void sync();                            // barrier across the tile's threads
//   template <int V> void stage(uint8_t* buf, const uint8_t* src);
//                                           // buf <- src, V bytes, may be asynchronous
//   void stage_wait();                      // this thread's stages have landed
// and parallel contexts that run two_stage_loop also:
//   void stage_commit();                    // the stages since the last commit form a group
//   template <int N> void stage_wait_prior();  // all but this thread's newest N groups have landed
//
// Parallel tiles all follow one pattern: stage every byte the tile reads into
// its buffer (all loads in flight at once: cp.async on a GPU, so no register
// holds them), wait, barrier, then store from the buffer. Serial tiles (the
// CPU executor) take shortcuts that suit one core (see each body).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FLASHMLA_PERM_BODY __device__ __forceinline__
#define FLASHMLA_PERM_HOST_DEVICE __host__ __device__ __forceinline__
#define FLASHMLA_PERM_UNROLL _Pragma("unroll")
#define FLASHMLA_PERM_NO_UNROLL _Pragma("unroll 1")
#else
#define FLASHMLA_PERM_BODY inline
#define FLASHMLA_PERM_HOST_DEVICE inline
#define FLASHMLA_PERM_UNROLL
#define FLASHMLA_PERM_NO_UNROLL
#endif

// Every vector a parallel body loads or stores (not only what it stages)
// passes through this hook. A GPU faults on a misaligned 16-byte access
// where a host does not, so the host harness (built with
// FLASHMLA_PERM_HARNESS_ACCESS_CHECKS) counts the misaligned ones; in every
// other build it is nothing.
#if defined(FLASHMLA_PERM_HARNESS_ACCESS_CHECKS) && !defined(__CUDACC__)
namespace flashmla_perm {
void harness_vector_access(const void* p, int bytes, bool store);  // tests/harness/tile_harness.cpp
}
#define FLASHMLA_PERM_VECTOR_ACCESS(p, bytes, store) ::flashmla_perm::harness_vector_access(p, bytes, store)
#else
#define FLASHMLA_PERM_VECTOR_ACCESS(p, bytes, store) ((void)0)
#endif

namespace flashmla_perm {

// Unit of a cooperative copy: V bytes moved by one load and one store.
template <int V>
struct VecOf;
#if defined(__CUDACC__)
template <>
struct VecOf<16> {
  using type = uint4;
};  // 128-bit ld/st
template <>
struct VecOf<8> {
  using type = uint2;
};
#else
struct alignas(16) Bytes16 {
  uint64_t lo, hi;
};
template <>
struct VecOf<16> {
  using type = Bytes16;
};
template <>
struct VecOf<8> {
  using type = uint64_t;
};
#endif
template <>
struct VecOf<4> {
  using type = uint32_t;
};
template <>
struct VecOf<2> {
  using type = uint16_t;
};
template <>
struct VecOf<1> {
  using type = uint8_t;
};

template <class T>
FLASHMLA_PERM_BODY T min_of(T a, T b) {
  return a < b ? a : b;
}

// Vectors a thread of a parallel context reads before it stores them (the
// buffer-to-memory half of a tile; its loads come from the tile buffer).
constexpr int kBatch = 4;

template <int V>
FLASHMLA_PERM_BODY typename VecOf<V>::type load_vec(const uint8_t* p) {
  FLASHMLA_PERM_VECTOR_ACCESS(p, V, false);
  return *reinterpret_cast<const typename VecOf<V>::type*>(p);
}

// A flag known when the code is compiled: a body instantiated for each
// value compiles only the branches that value takes.
template <bool B>
struct Flag {
  static constexpr bool value = B;
  FLASHMLA_PERM_HOST_DEVICE constexpr operator bool() const { return B; }
};

// The V bytes at byte b (a multiple of V) of a gathered row: destination
// chunk j of the row comes from row + offset[j], chunks of 1 << shift bytes.
// Two forms, so that each call site compiles only the one it can take:
// chunks at least V wide (one load), and chunks narrower than V (the
// per-32-column scales: 1 byte), which are assembled into one vector, so
// the store is still V bytes wide.
// B: the byte index's type (uint32_t where the row fits a tile buffer).
template <int V, class B>
FLASHMLA_PERM_BODY typename VecOf<V>::type gather_whole(const uint8_t* row, const int32_t* offset, int shift,
                                                        B b) {
  return load_vec<V>(row + offset[b >> shift] + (b & ((B{1} << shift) - 1)));
}

template <int V, class B>
FLASHMLA_PERM_BODY typename VecOf<V>::type gather_pieces(const uint8_t* row, const int32_t* offset, int shift,
                                                         B b) {
  static_assert(V > 1, "no chunk is under 1 byte");
  using T = typename VecOf<V>::type;
  T v;
  const int32_t* off = offset + (b >> shift);
  auto pieces = [&](auto piece) {
    using P = decltype(piece);
    constexpr int kPieces = V / sizeof(P);
    P* out = reinterpret_cast<P*>(&v);
    FLASHMLA_PERM_UNROLL
    for (int j = 0; j < kPieces; ++j) {
      FLASHMLA_PERM_VECTOR_ACCESS(row + off[j], static_cast<int>(sizeof(P)), false);
      out[j] = *reinterpret_cast<const P*>(row + off[j]);
    }
  };
  if constexpr (V >= 16) {
    if (shift == 3) {
      pieces(uint64_t{});
      return v;
    }
  }
  if constexpr (V >= 8) {
    if (shift == 2) {
      pieces(uint32_t{});
      return v;
    }
  }
  if constexpr (V >= 4) {
    if (shift == 1) {
      pieces(uint16_t{});
      return v;
    }
  }
  pieces(uint8_t{});
  return v;
}

// n / d for n < 2^31 by a multiply and a shift (Granlund and Montgomery),
// set up on the host (launch.cpp) so that a loop does no divide per item
// (nvcc recomputes a runtime divisor's reciprocal each time, about 20
// instructions). m = ceil(2^(31 + s) / d) with 2^s >= d > 2^(s - 1), which is
// under 2^32, and the rounding error n * (m * d - 2^(31 + s)) stays under
// 2^(31 + s). The items of a tile number under kGpuTileBudget / V < 2^31.
struct FastDiv {
  uint32_t m = 1u << 31;  // d = 1
  int shift = 31;
  FastDiv() = default;
  explicit FastDiv(uint32_t d) {
    int s = 0;
    while ((uint64_t{1} << s) < d) ++s;
    shift = 31 + s;
    m = static_cast<uint32_t>(((uint64_t{1} << shift) + d - 1) / d);
  }
  FLASHMLA_PERM_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    // One 32 x 32 -> 64 multiply and one shift, the quotient 32 bits. From
    // C++, NVVM makes the product a 64 x 64 one (both factors zero-extended),
    // two instructions more, and the quotient's callers keep its 64-bit
    // shift and mask it.
    uint32_t q;
    asm("{\n\t.reg .b64 t;\n\tmul.wide.u32 t, %1, %2;\n\tshr.b64 t, t, %3;\n\tcvt.u32.u64 %0, t;\n\t}"
        : "=r"(q)
        : "r"(n), "r"(m), "r"(shift));
    return q;
#else
    return static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> shift);
#endif
  }
};

// What a caller knows of the Lines it offsets into: that each has one dim,
// or nothing (LinesFrom::line).
struct OneDim {};
struct AnyDims {};

// Parallel contexts: item i < total is V bytes; addr(i, buf, src) says where
// it goes in the tile buffer and where it comes from. All items are staged
// before anyone waits, so the whole tile is in flight at once.
template <int V, class Ctx, class Addr>
FLASHMLA_PERM_BODY void stage_items(Ctx& ctx, uint32_t total, Addr addr) {
  for (uint32_t i = ctx.thread(); i < total; i += ctx.num_threads()) {
    uint8_t* buf;
    const uint8_t* src;
    addr(i, buf, src);
    ctx.template stage<V>(buf, src);
  }
}

// Parallel contexts: item i < total stores value(i, dst, dims) (V bytes) at
// dst. Each thread reads Batch values before it stores them (a value
// assembled from pieces already has V / piece loads in flight: Batch 1),
// then takes what is left below Batch one at a time. Whole batches only: an
// `if` on each item of a batch leaves each value defined on some paths only,
// which ptxas keeps live from the kernel's entry, every inlined copy at once
// (well over 100 registers a thread). Batches only where one_dim (every
// Lines the values use has one dim), whose values get OneDim{} and skip
// Lines::offset's multi-dim path, which inlined at each of a batch's items
// would be most of the kernels' code. Items one at a time get AnyDims{}.
template <int V, int Batch = kBatch, class Ctx, class Value>
FLASHMLA_PERM_BODY void store_items(Ctx& ctx, uint32_t total, bool one_dim, Value value) {
  using T = typename VecOf<V>::type;
  const uint32_t stride = ctx.num_threads();
  uint32_t base = ctx.thread();
  if constexpr (Batch > 1) {
    for (; one_dim && base + (Batch - 1) * stride < total; base += Batch * stride) {
      T v[Batch];
      uint8_t* d[Batch];
      FLASHMLA_PERM_UNROLL
      for (int u = 0; u < Batch; ++u) v[u] = value(base + u * stride, d[u], OneDim{});
      FLASHMLA_PERM_UNROLL
      for (int u = 0; u < Batch; ++u) {
        FLASHMLA_PERM_VECTOR_ACCESS(d[u], V, true);
        *reinterpret_cast<T*>(d[u]) = v[u];
      }
    }
  } else {
    for (; one_dim && base < total; base += stride) {  // one at a time, OneDim where it may
      uint8_t* d;
      const T v = value(base, d, OneDim{});
      FLASHMLA_PERM_VECTOR_ACCESS(d, V, true);
      *reinterpret_cast<T*>(d) = v;
    }
  }
  for (; base < total; base += stride) {
    uint8_t* d;
    const T v = value(base, d, AnyDims{});
    FLASHMLA_PERM_VECTOR_ACCESS(d, V, true);
    *reinterpret_cast<T*>(d) = v;
  }
}

// dst[r * dst_pitch + c] = src[r * src_pitch + c] for r < rows, c < bytes, by
// one thread (memcpy: host addresses need no alignment).
FLASHMLA_PERM_BODY void copy_rect_serial(uint8_t* dst, int64_t dst_pitch, const uint8_t* src,
                                         int64_t src_pitch, int64_t rows, int64_t bytes) {
  if (dst_pitch == bytes && src_pitch == bytes) {
    std::memcpy(dst, src, static_cast<size_t>(rows * bytes));
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * dst_pitch, src + r * src_pitch, static_cast<size_t>(bytes));
}

// Where line l of a set of lines starts: l as a mixed-radix index over up to
// kMaxLineDims dims, inner first (a unit's lines, or a column job's rows, in
// any strided layout). One dim is the common case and costs one multiply.
// With more, the set holds fewer than kMaxMixedLines lines (csrc/strided.cpp
// cuts bigger ones into several), so the digits are 32-bit, each by a
// FastDiv the host sets up (set_line_divs): a divide by a runtime divisor is
// about 20 instructions on the GPU (a 64-bit one a subroutine, which spilled
// registers). The dims from the outermost on divide by 2^31, which leaves
// the whole rest as the digit: every set takes the same steps, no branch.
constexpr int kMaxLineDims = 4;
constexpr int64_t kMaxMixedLines = int64_t{1} << 31;
struct Lines {
  int dims;                      // 1 .. kMaxLineDims
  int64_t size[kMaxLineDims];    // lines along each dim (the outermost may be anything)
  int64_t pitch[kMaxLineDims];   // bytes between neighbours along each dim
  FastDiv by_size[kMaxLineDims - 1];  // by size[i] for i + 1 < dims, else by 2^31 (set_line_divs)
  FLASHMLA_PERM_HOST_DEVICE int64_t offset(int64_t line) const {
    if (dims == 1) return line * pitch[0];
    uint32_t l = static_cast<uint32_t>(line);  // < kMaxMixedLines
    int64_t off = 0;
    FLASHMLA_PERM_UNROLL
    for (int i = 0; i + 1 < kMaxLineDims; ++i) {
      const uint32_t q = by_size[i].div(l);
      off += static_cast<int64_t>(l - q * static_cast<uint32_t>(size[i])) * pitch[i];
      l = q;
    }
    return off + static_cast<int64_t>(l) * pitch[kMaxLineDims - 1];
  }
};

// Host: a Lines' divisors, once its dims, sizes and pitches are set (the
// dims past `dims` are never read but by offset's multiply by 0 digits).
inline void set_line_divs(Lines& at) {
  for (int i = 0; i + 1 < kMaxLineDims; ++i)
    at.by_size[i] = i + 1 < at.dims ? FastDiv(static_cast<uint32_t>(at.size[i])) : FastDiv(uint32_t{1} << 31);
}

// Lines first + l of a Lines, for l < 2^31 (a tile's, counted from its
// first), from `data`. With one dim, from the first's address by a 32 x 64-bit
// multiply: the first's address is worked out once a tile, not a 64-bit add
// and multiply each item, and the loops keep one address live, not the data,
// the first line and the pitch. Otherwise by Lines::offset, from data (a set
// of several dims holds under kMaxMixedLines lines: 32-bit line numbers).
template <class T>
struct LinesFrom {
  const Lines& at;
  T* start;  // one dim: data + at.offset(first); else data
  int64_t pitch;  // at.pitch[0]
  uint32_t first;  // several dims: the first line
  FLASHMLA_PERM_BODY LinesFrom(T* data, const Lines& a, int64_t f)
      : at(a),
        start(a.dims == 1 ? data + f * a.pitch[0] : data),
        pitch(a.pitch[0]),
        first(static_cast<uint32_t>(f)) {}
  FLASHMLA_PERM_BODY T* line(uint32_t l, OneDim) const { return start + static_cast<int64_t>(l) * pitch; }
  FLASHMLA_PERM_BODY T* line(uint32_t l, AnyDims) const {
    return at.dims == 1 ? line(l, OneDim{}) : start + at.offset(first + l);
  }
};

// One thread: nl lines of `width` bytes, line l from src + src_at.offset(l0 + l)
// to dst + dst_at.offset(l0 + l) (or packed, `width` apart, where an `at` is null).
FLASHMLA_PERM_BODY void copy_lines_serial(uint8_t* dst, const Lines* dst_at, const uint8_t* src,
                                          const Lines* src_at, int64_t l0, int64_t nl, int64_t width) {
  const bool simple = (!dst_at || dst_at->dims == 1) && (!src_at || src_at->dims == 1);
  if (simple) {
    const int64_t dp = dst_at ? dst_at->pitch[0] : width, sp = src_at ? src_at->pitch[0] : width;
    copy_rect_serial(dst + (dst_at ? l0 * dp : 0), dp, src + (src_at ? l0 * sp : 0), sp, nl, width);
    return;
  }
  for (int64_t l = 0; l < nl; ++l)
    std::memcpy(dst + (dst_at ? dst_at->offset(l0 + l) : l * width),
                src + (src_at ? src_at->offset(l0 + l) : l * width), static_cast<size_t>(width));
}

// ---------------------------------------------------------------------------
// Permutation of units by cycle segments (see docs/design.md).
//
// A unit is `lines` lines of `line_bytes` contiguous bytes, line l at
// line_at.offset(l) from the unit's start; unit u starts at data + u *
// unit_stride. That covers a permuted dim of any strided tensor: unit u is
// the sub-tensor at index u (g consecutive indices where the permutation
// moves blocks of g), its other dims the lines (csrc/strided.h). Rows of a
// contiguous tensor are one line per unit; a permuted dim of stride 1 makes
// units of g elements, one line per index of the other dims (MN-major
// scales, and in-place column permutations too wide for a tile buffer). Destination unit order[k] receives
// source unit order[k + 1] inside a segment; the segment's last destination receives either its own first
// unit (the segment is a whole cycle) or the first unit of the next segment, which the save pass put into
// scratch. A packed segment is several whole cycles of one length c, each of which wraps to its own first
// unit.
//
// A tile is one (segment, line slice, byte slice). Tiles of one segment touch
// disjoint bytes, tiles of different segments disjoint units, so no two
// tiles of a launch ever race.
struct RowJob {
  uint8_t* data;
  int64_t unit_stride;    // bytes from unit u to unit u + 1
  int64_t lines;          // lines per unit
  Lines line_at;          // where line l of a unit starts, from the unit's start
  int64_t line_bytes;     // contiguous bytes of one line
  const int32_t* order;   // units in cycle order, cycle after cycle
  const int32_t* first;   // per segment: first position (and one past the last segment's end)
  const int32_t* tail;    // per cut segment (< num_scratch): the slot its last destination
                        // reads; per packed segment (< num_scratch + num_packed): its cycles' length
  int64_t num_scratch;  // segments cut from longer cycles
  int64_t num_packed;  // then segments of several whole short cycles; later ones: one whole cycle
  uint8_t* scratch;  // slot s: lines x line_bytes, packed
  int64_t slice_lines;  // lines of one tile
  int64_t slice_bytes;  // bytes of each line of one tile
  int64_t line_tiles;  // tiles across the lines of a unit
  int64_t byte_tiles;  // tiles across the bytes of a line
  int64_t step;  // positions a parallel tile stores per pass (>= its segment: one pass)
  int64_t tiles;  // segments * line_tiles * byte_tiles
  int64_t head_tiles;  // tiles of the save pass: scratch segments * line_tiles * byte_tiles
  int64_t stage_bytes;  // two stages (two_stage_loop; launch.cpp set_row_two_stages): bytes from
                        // one tile buffer to the other; 0: one stage
  int vec;  // vector width V
  // [0] for full slices, [1] for the last one (set_row_slices): a tile's
  // vectors a line, to split the save pass's items into lines
  // (save_segment_head); and its lines, to split the row loops' line
  // numbers into buffers and lines (RowLines).
  FastDiv per_line_div[2];
  FastDiv lines_div[2];
  // A tile's segment and line slice by a multiply and a shift, for two-stage
  // launches (set_row_two_stages: under 2^31 tiles), whose tiles each work
  // out their place twice (stage and store): by line_tiles * byte_tiles, and
  // by byte_tiles.
  FastDiv seg_div;
  FastDiv byte_tiles_div;
};

// Tile buffer a row tile needs: the tail source plus up to `step` sources,
// for segments of at most `max_len` units.
inline int64_t row_tile_buffer_bytes(int64_t slice_lines, int64_t slice_bytes, int64_t step,
                                     int64_t max_len) {
  const int64_t sources = step < max_len - 1 ? step : max_len - 1;
  return (1 + (sources > 0 ? sources : 0)) * slice_lines * slice_bytes;
}

// Where one tile of a row job sits.
// `fast`: by the job's FastDivs (two-stage launches only), else by 64-bit
// divisions.
struct RowTileGeometry {
  int64_t seg, line0, col, nl, width;
  FLASHMLA_PERM_BODY RowTileGeometry(const RowJob& p, int64_t tile, bool fast = false) {
    const int64_t per_seg = p.line_tiles * p.byte_tiles;
    int64_t rest, lt;
    if (fast) {
      const uint32_t t = static_cast<uint32_t>(tile);
      const uint32_t q = p.seg_div.div(t);
      const uint32_t r = t - q * static_cast<uint32_t>(per_seg);
      seg = q;
      rest = r;
      lt = p.byte_tiles_div.div(r);
    } else {
      seg = tile / per_seg;
      rest = tile - seg * per_seg;
      lt = rest / p.byte_tiles;
    }
    line0 = lt * p.slice_lines;
    col = (rest - lt * p.byte_tiles) * p.slice_bytes;
    nl = min_of(p.slice_lines, p.lines - line0);
    width = min_of(p.slice_bytes, p.line_bytes - col);
  }
};

// Save pass: scratch slot `seg` <- first unit of segment `seg` (this tile's
// slice). Only segments [0, number of scratch slots) are cut from longer cycles.
template <int V, class Ctx>
FLASHMLA_PERM_BODY void save_segment_head(Ctx& ctx, const RowJob& p, int64_t tile) {
  const RowTileGeometry g(p, tile);
  const uint8_t* src = p.data + int64_t{p.order[p.first[g.seg]]} * p.unit_stride + g.col;
  uint8_t* dst = p.scratch + g.seg * p.lines * p.line_bytes + g.line0 * p.line_bytes + g.col;
  if constexpr (Ctx::kSerial) {
    // Scratch lines are line_bytes apart: copy_lines_serial's packed side
    // would put them `width` apart, so go line by line.
    for (int64_t l = 0; l < g.nl; ++l)
      std::memcpy(dst + l * p.line_bytes, src + p.line_at.offset(g.line0 + l), static_cast<size_t>(g.width));
  } else {
    const uint32_t per_line = static_cast<uint32_t>(g.width / V);
    const FastDiv by_line = g.width == p.slice_bytes ? p.per_line_div[0] : p.per_line_div[1];
    const int64_t sbytes = p.line_bytes;
    const LinesFrom<const uint8_t> lines(src, p.line_at, g.line0);
    store_items<V>(ctx, static_cast<uint32_t>(g.nl) * per_line, p.line_at.dims == 1,
                   [&](uint32_t i, uint8_t*& d, auto dims) {
                     const uint32_t l = by_line.div(i);
                     const int64_t c = static_cast<int64_t>(i - l * per_line) * V;
                     d = dst + l * sbytes + c;
                     return load_vec<V>(lines.line(l, dims) + c);
                   });
  }
}

// What a row tile works on: its geometry, its segment's positions, and
// where its segment's last destination reads (tail < 0: its own first unit,
// else scratch slot `tail`: scratch_src), cycles of `cycle` units (a packed segment:
// several; else one, the whole segment).
struct RowTile {
  RowTileGeometry g;
  const int32_t* pos;
  int64_t len, tail, cycle;
  uint8_t* base;  // the tile's byte slice of unit 0
  const uint8_t* scratch_src;
  FLASHMLA_PERM_BODY RowTile(const RowJob& p, int64_t tile, bool fast = false) : g(p, tile, fast) {
    pos = p.order + p.first[g.seg];
    len = p.first[g.seg + 1] - p.first[g.seg];
    tail = g.seg < p.num_scratch ? p.tail[g.seg] : -1;
    cycle = g.seg >= p.num_scratch && g.seg < p.num_scratch + p.num_packed ? p.tail[g.seg] : len;
    base = p.data + g.col;
    scratch_src =
        tail < 0 ? nullptr : p.scratch + tail * p.lines * p.line_bytes + g.line0 * p.line_bytes + g.col;
  }
  FLASHMLA_PERM_BODY uint8_t* unit(const RowJob& p, int64_t u) const { return base + u * p.unit_stride; }
};

// Parallel contexts, one pass of a row tile: buffer 0 holds the group's own
// first unit (whole cycles), buffer 1 + i the source of position k0 + i. A
// pass stages the sources of up to `step` positions, then stores them;
// reading k0+1..k0+step before writing k0..k0+step-1 never reads a byte this
// tile already overwrote. A group is one cycle (any number of passes), or as
// many whole cycles of a packed segment as one pass holds: there buffer j is
// unit pos[j], and a cycle's last position reads its first, buffer
// k + 1 - cycle. The loops go line by line, one warp per line (Warp).
struct RowPass {
  const int32_t* gp;  // the group's positions
  uint32_t k0;  // the pass's first position in the group
  uint32_t n;  // positions stored: k0 .. k0+n-1
  uint32_t m;  // sources staged: k0+1 .. k0+m
  uint32_t first;  // lowest buffer staged: 0 where the pass reads the group's first unit
  uint32_t cyc;  // cycle length
  uint64_t ends;  // bit k: position k is a cycle's last (segments are at most 64 units)
};

// How the row loops deal a tile's lines to its threads: one warp per line, its
// lanes a vector apart, or for lines of under 32 vectors (the MN-major
// packed scale's: 4) the power of two of lanes at or above the line's
// vectors, several lines to a warp. What a line needs (its position's unit,
// a load from the plan; its address) is then worked out once per line, not
// once per vector, and no vector waits on a load of its own before its copy
// (the line's copies wait on the line's). The first device run had each
// warp issue once every 15.5 cycles in the loops that did it once per vector
// (docs/performance.md, "What falls short and why"). Slot s of `slots` takes
// lines s, s + slots, ... A GPU tile is whole warps (Ctx::kWholeWarps:
// kGpuThreads); a host context may run any number of threads, its last
// warp partial. A pass of fewer lines than warps leaves warps idle (wq_b at
// TP2: cycles of 2, so 2 lines of 4 warps per pass); groups of warps per line
// balanced it but, with their stride known only at run time, took the store
// loop from 22 to 48 instructions per trip (sm_90), more than
// the idle warps cost.
constexpr uint32_t kWarp = 32;
template <class Ctx>
struct Warp {
  uint32_t slot, slots, lane, lanes;  // this thread's line slot, and its lane among the line's lanes
  FLASHMLA_PERM_BODY Warp(Ctx& ctx, uint32_t per_line) {
    const uint32_t t = static_cast<uint32_t>(ctx.thread()), n = static_cast<uint32_t>(ctx.num_threads());
    const uint32_t warp = t / kWarp, warps = (n + kWarp - 1) / kWarp;
    // Lanes a line: s = 2^shift, the power of two at or above per_line, at
    // most a warp (shifts and masks: no divide).
    uint32_t shift = 5;
    while (shift > 0 && (1u << (shift - 1)) >= per_line) --shift;
    const uint32_t s = 1u << shift, subs = kWarp >> shift, sub = (t % kWarp) >> shift;
    slot = warp * subs + sub;
    lane = t % kWarp & (s - 1);
    if (Ctx::kWholeWarps) {
      slots = warps * subs;
      lanes = s;
    } else {
      const uint32_t last = n - (warps - 1) * kWarp;  // the last warp's lanes
      slots = (warps - 1) * subs + (last + s - 1) / s;
      lanes = min_of(s, min_of(kWarp, n - warp * kWarp) - sub * s);
    }
  }
};

// A row tile's lines: nl lines of `width` bytes (a slice: under a tile
// buffer) a unit, per_line vectors of V bytes each, a unit's lines packed
// in its tile buffer (buf_bytes each). Line q of a loop is line q % nl of
// buffer (or position) q / nl: by_lines divides by nl.
template <int V>
struct RowLines {
  uint32_t nl, width, per_line;
  FastDiv by_lines;
  int64_t buf_bytes;
  FLASHMLA_PERM_BODY RowLines(const RowJob& p, const RowTile& t) {
    width = static_cast<uint32_t>(t.g.width);
    per_line = width / V;
    nl = static_cast<uint32_t>(t.g.nl);
    by_lines = t.g.nl == p.slice_lines ? p.lines_div[0] : p.lines_div[1];
    buf_bytes = t.g.nl * width;
  }
};

// One line's lanes: `width` bytes (a multiple of V, under 2^31) from src
// to dst, the lanes a vector apart; each lane reads Batch vectors before it
// stores them, then moves what is left below Batch one at a time (whole
// batches only, as store_items says why).
template <int V, int Batch>
FLASHMLA_PERM_BODY void copy_line(uint32_t lanes, uint32_t lane, uint8_t* dst, const uint8_t* src,
                                  uint32_t width) {
  using T = typename VecOf<V>::type;
  const uint32_t stride = lanes * V;
  uint32_t c = lane * V;
  FLASHMLA_PERM_NO_UNROLL  // a line is a few batches: an unrolled copy would rarely run
      for (; c + (Batch - 1) * stride < width; c += Batch * stride) {
    T v[Batch];
    FLASHMLA_PERM_UNROLL
    for (int u = 0; u < Batch; ++u) v[u] = load_vec<V>(src + c + u * stride);
    FLASHMLA_PERM_UNROLL
    for (int u = 0; u < Batch; ++u) {
      FLASHMLA_PERM_VECTOR_ACCESS(dst + c + u * stride, V, true);
      *reinterpret_cast<T*>(dst + c + u * stride) = v[u];
    }
  }
  FLASHMLA_PERM_NO_UNROLL
  for (; c < width; c += stride) {
    FLASHMLA_PERM_VECTOR_ACCESS(dst + c, V, true);
    *reinterpret_cast<T*>(dst + c) = load_vec<V>(src + c);
  }
}

// A line of a row tile's store loop. A whole warp's line goes kBatch
// vectors per lane at a time, its stride a constant (so that each vector's
// addresses are one base and an offset: 22 instructions per batch on sm_90,
// 48 with a stride known only at run time); a narrower line's lanes (the
// packed scale's 4 vectors per line) need one vector each.
template <int V, class W>
FLASHMLA_PERM_BODY void warp_copy_line(const W& w, uint8_t* dst, const uint8_t* src, uint32_t width) {
  if (w.lanes == kWarp)
    copy_line<V, kBatch>(kWarp, w.lane, dst, src, width);
  else
    copy_line<V, 1>(w.lanes, w.lane, dst, src, width);
}

template <int V, class Ctx>
FLASHMLA_PERM_BODY void row_pass_stage(Ctx& ctx, const RowJob& p, const RowTile& t, const RowPass& ps,
                                       uint8_t* buf) {
  const RowLines<V> rl(p, t);
  const uint32_t lines = (1 + ps.m - ps.first) * rl.nl;
  const Warp<Ctx> w(ctx, rl.per_line);
  const uint32_t stride = w.lanes * V;
  const LinesFrom<const uint8_t> at(t.base, p.line_at, t.g.line0);  // line l of unit 0
  for (uint32_t q = w.slot; q < lines; q += w.slots) {
    const uint32_t jj = rl.by_lines.div(q);
    const uint32_t j = ps.first + jj, l = q - jj * rl.nl;
    const uint8_t* src = at.line(l, AnyDims{}) + ps.gp[j == 0 ? 0 : ps.k0 + j] * p.unit_stride;
    uint8_t* dst = buf + j * rl.buf_bytes + l * rl.width;
    FLASHMLA_PERM_NO_UNROLL  // a line is a few trips (3 on wq_b's slices at TP1): one loop, not an unrolled
                             // one and the rest
        for (uint32_t c = w.lane * V; c < rl.width; c += stride) ctx.template stage<V>(dst + c, src + c);
  }
}

template <int V, class Ctx>
FLASHMLA_PERM_BODY void row_pass_store(Ctx& ctx, const RowJob& p, const RowTile& t, const RowPass& ps,
                                       const uint8_t* buf) {
  const RowLines<V> rl(p, t);
  const uint32_t lines = ps.n * rl.nl;
  const Warp<Ctx> w(ctx, rl.per_line);
  const LinesFrom<uint8_t> at(t.base, p.line_at, t.g.line0);  // line l of unit 0
  for (uint32_t q = w.slot; q < lines; q += w.slots) {
    const uint32_t ii = rl.by_lines.div(q);
    const uint32_t l = q - ii * rl.nl, k = ps.k0 + ii;
    uint8_t* dst = at.line(l, AnyDims{}) + ps.gp[k] * p.unit_stride;
    // A cycle's last position reads its first unit: scratch (a cut
    // segment), or buffer k + 1 - cycle (k0 is 0, or the group is one
    // cycle and that is buffer 0). Two calls, so that the buffer's reads
    // are shared-memory loads (LDS) and only scratch's are global.
    const bool last = (ps.ends >> k) & 1;
    if (last && t.tail >= 0) {
      warp_copy_line<V>(w, dst, t.scratch_src + l * p.line_bytes, rl.width);
    } else {
      const uint32_t from = last ? k + 1 - ps.cyc : 1 + ii;
      warp_copy_line<V>(w, dst, buf + from * rl.buf_bytes + l * rl.width, rl.width);
    }
  }
}

// The positions that end a cycle, among a group's first glen.
FLASHMLA_PERM_HOST_DEVICE uint64_t cycle_ends(uint32_t cyc, uint32_t glen) {
  uint64_t ends = 0;
  for (uint32_t e = cyc - 1; e < glen; e += cyc) ends |= uint64_t{1} << e;
  return ends;
}

template <int V, class Ctx>
FLASHMLA_PERM_BODY void row_segment_tile(Ctx& ctx, const RowJob& p, int64_t tile, uint8_t* buf) {
  const RowTile t(p, tile);
  const RowTileGeometry& g = t.g;
  const int32_t* pos = t.pos;
  const int64_t len = t.len, tail = t.tail, cycle = t.cycle, width = g.width;
  auto unit = [&](int64_t u) { return t.unit(p, u); };

  if constexpr (Ctx::kSerial) {
    // One thread, step 1, a cycle at a time: each unit goes straight from
    // its source to its destination, which the previous step just read
    // (still in cache). Only the first unit of a whole cycle needs the buffer.
    const Lines* at = &p.line_at;
    const int64_t l0 = g.line0, nl = g.nl;
    for (const int32_t* c = pos; c < pos + len; c += cycle) {
      if (tail < 0) copy_lines_serial(buf, nullptr, unit(c[0]), at, l0, nl, width);
      for (int64_t k = 0; k + 1 < cycle; ++k)
        copy_lines_serial(unit(c[k]), at, unit(c[k + 1]), at, l0, nl, width);
      if (tail < 0) {
        copy_lines_serial(unit(c[cycle - 1]), at, buf, nullptr, l0, nl, width);
      } else {
        for (int64_t l = 0; l < nl; ++l)
          std::memcpy(unit(c[cycle - 1]) + at->offset(l0 + l), t.scratch_src + l * p.line_bytes,
                      static_cast<size_t>(width));
      }
    }
    return;
  } else {
    // Groups of passes (RowPass). Positions in 32 bits (a segment is at most
    // 64 units): fewer registers.
    const uint32_t slen = static_cast<uint32_t>(len), cyc = static_cast<uint32_t>(cycle);
    const uint32_t step = static_cast<uint32_t>(p.step);
    const uint32_t group = cyc * (step >= cyc ? step / cyc : 1);
    for (uint32_t g0 = 0; g0 < slen; g0 += group) {
      RowPass ps;
      ps.gp = pos + g0;
      ps.cyc = cyc;
      const uint32_t glen = min_of(group, slen - g0);
      ps.ends = cycle_ends(cyc, glen);
      for (uint32_t k0 = 0; k0 < glen; k0 += step) {
        ps.k0 = k0;
        ps.n = min_of(step, glen - k0);
        ps.m = min_of(step, glen - 1 - k0);
        ps.first = (k0 == 0 && tail < 0) ? 0 : 1;
        row_pass_stage<V>(ctx, p, t, ps, buf);
        ctx.stage_wait();
        ctx.sync();
        row_pass_store<V>(ctx, p, t, ps, buf);
        ctx.sync();  // the next pass (or tile) reuses the buffers
      }
    }
  }
}

// Half of a row tile of one pass (a launch plans two stages only where every
// tile is one pass: launch.cpp set_row_two_stages): its stage loop into
// `buf`, or its store loop from it. In place too: tiles of different
// segments touch disjoint units, and of one segment disjoint bytes, so the
// next tile's loads may fly while this one stores.
template <int V, class Ctx>
FLASHMLA_PERM_BODY void row_segment_half(Ctx& ctx, const RowJob& p, int64_t tile, uint8_t* buf, bool store) {
  const RowTile t(p, tile, true);
  if (t.len > p.step) {  // set_row_two_stages plans no such tile: never leave bytes unwritten
#if defined(__CUDA_ARCH__)
    __trap();
#endif
    return;
  }
  const uint32_t slen = static_cast<uint32_t>(t.len);
  RowPass ps;
  ps.gp = t.pos;
  ps.cyc = static_cast<uint32_t>(t.cycle);
  ps.k0 = 0;
  ps.n = slen;
  ps.m = slen - 1;
  ps.first = t.tail < 0 ? 0 : 1;
  ps.ends = cycle_ends(ps.cyc, slen);
  if (store)
    row_pass_store<V>(ctx, p, t, ps, buf);
  else
    row_pass_stage<V>(ctx, p, t, ps, buf);
}

// ---------------------------------------------------------------------------
// Column permutation within rows, by a byte gather map: destination chunk j
// of a row comes from source byte offset[j] of the same row, chunks of
// 1 << shift bytes (the permutation's runs, at most 64 bytes).
//
// A row is `row_bytes` logical bytes: contiguous, or (run < row_bytes) runs
// of `run` contiguous bytes, `run_pitch` apart; logical byte b sits at
// (b / run) * run_pitch + b % run. That is a permuted dim of stride 1 (one
// run), and a permuted index spread over two dims: the four bytes of each
// int32 word of an MN-major packed scale (run 4, words a row of storage
// apart). Rows sit at src_rows / dst_rows offsets (any strided layout).
//
// Staged tiles (in place, or rows narrow enough): a tile of whole rows is
// staged, logical bytes in order, and written back gathered; in place when
// src == dst (a tile reads only its own rows, all of them before the
// barrier). On a GPU, whole rows of chunks at least 16 bytes wide are staged
// from their gathered sources instead and written back linearly
// (gathers_in_stage). Direct tiles (out of place, any width, run ==
// row_bytes): a slice of destination bytes is staged from its gathered
// sources and written out contiguously; chunks narrower than V are read
// straight from memory and assembled in registers.
struct ColJob {
  const uint8_t* src;
  uint8_t* dst;
  Lines src_rows;  // where row r starts
  Lines dst_rows;
  int64_t rows;
  int64_t row_bytes;  // logical bytes of a row
  int64_t run;  // contiguous bytes (divides row_bytes)
  int64_t run_pitch;  // bytes from one run to the next
  FastDiv run_div;  // by run (set_col_items; parallel tiles of short runs)
  const int32_t* source_offset;  // per destination chunk of a row: source byte offset
  int chunk_shift;  // log2(chunk bytes)
  int staged;  // 1: whole rows staged; 0: direct
  int64_t tile_rows;  // rows of one tile
  int64_t buf_pitch;  // staged: bytes from one row of the tile buffer to the next
  int64_t slice_bytes;  // direct: destination bytes of each row of one tile
  int64_t row_tiles;  // direct: tiles across a row
  FastDiv row_tiles_div;  // direct: by row_tiles (set_col_items; a direct job has under 2^31 tiles)
  int64_t stage_bytes;  // two stages (two_stage_loop; set_two_stages): bytes from one tile
                        // buffer to the other; 0: one stage
  int64_t tiles;
  int vec;  // vector width V
  // Parallel tiles split item i into (row, vector) with one FastDiv, set up
  // on the host (launch.cpp set_col_items): by the vectors of a row (direct
  // tiles: of a slice), or by the tile's rows (rows-fastest staged tiles;
  // [1] for the job's last tile, which may have fewer rows).
  FastDiv items_div[2];
};

// Where logical byte b (a multiple of V, with V dividing run) of a row sits.
// Short runs come only in staged GPU tiles, whose rows fit a tile buffer
// (gpu_cols_staged_fit): 32-bit digits by a FastDiv, no 64-bit divide
// subroutine (which spilled on sm_100) and no 32-bit divide.
FLASHMLA_PERM_HOST_DEVICE int64_t col_run_byte_at(const ColJob& p, uint32_t b);
FLASHMLA_PERM_HOST_DEVICE int64_t col_byte_at(const ColJob& p, uint32_t b) {
  return p.run == p.row_bytes ? b : col_run_byte_at(p, b);
}
// The same for short runs (run < row_bytes).
FLASHMLA_PERM_HOST_DEVICE int64_t col_run_byte_at(const ColJob& p, uint32_t b) {
  const uint32_t i = b, run = static_cast<uint32_t>(p.run);
  const uint32_t k = p.run_div.div(i);
  return static_cast<int64_t>(k) * p.run_pitch + (i - k * run);
}

// One thread, host executors: V is the chunk size, so chunk j is simply
// offset[j]. Locals, not p's fields: byte stores may alias them.
template <int V>
inline void gather_row_serial(const int32_t* offset, int64_t row_bytes, const uint8_t* row, uint8_t* out) {
  const int64_t chunks = row_bytes / V;
  int64_t j = 0;
  if constexpr (V < 8) {
    // Chunks under 8 bytes (the per-32-column scales move byte by byte)
    // are assembled into one 8-byte store in a register; little-endian.
    using T = typename VecOf<V>::type;
    constexpr int kPer = 8 / V;
    for (; j + kPer <= chunks; j += kPer) {
      uint64_t packed = 0;
      for (int i = 0; i < kPer; ++i) {
        T piece;
        std::memcpy(&piece, row + offset[j + i], V);
        packed |= static_cast<uint64_t>(piece) << (8 * V * i);
      }
      std::memcpy(out + j * V, &packed, 8);
    }
  }
  for (; j < chunks; ++j) std::memcpy(out + j * V, row + offset[j], V);
}

// Host executors: `runs` runs of `run` bytes, `pitch` apart in memory and
// packed in a buffer. The packed scales' 4-byte runs move as fixed-size
// copies (a memcpy of a runtime size is a library call per run).
inline void pack_runs(uint8_t* packed, const uint8_t* s, int64_t runs, int64_t run, int64_t pitch) {
  if (run == 4) {
    for (int64_t k = 0; k < runs; ++k) std::memcpy(packed + 4 * k, s + k * pitch, 4);
    return;
  }
  for (int64_t k = 0; k < runs; ++k) std::memcpy(packed + k * run, s + k * pitch, static_cast<size_t>(run));
}
inline void unpack_runs(uint8_t* d, const uint8_t* packed, int64_t runs, int64_t run, int64_t pitch) {
  if (run == 4) {
    for (int64_t k = 0; k < runs; ++k) std::memcpy(d + k * pitch, packed + 4 * k, 4);
    return;
  }
  for (int64_t k = 0; k < runs; ++k) std::memcpy(d + k * pitch, packed + k * run, static_cast<size_t>(run));
}

// Whether a parallel column tile of vector width V gathers in its stage
// loop (col_gathered_slice), rather than from its staged rows or straight
// from memory: chunks at least V wide, and for staged tiles whole rows and
// V = 16 (col_staged_tile says why). launch_info reports it for the model.
// `staged` is p.staged, a constant in the kernels: with V, it keeps the
// gathered form out of the staged kernel's other widths.
FLASHMLA_PERM_HOST_DEVICE bool gathers_in_stage(const ColJob& p, int V, bool staged) {
  if ((int64_t{1} << p.chunk_shift) < V) return false;
  return !staged || (V == 16 && p.run == p.row_bytes);
}

// Parallel contexts: `nrows` rows of a tile from row r0, `per_row` vectors
// of destination bytes each from byte b0 on (`div` divides by per_row),
// where every vector has one contiguous source (chunks of at least V bytes).
// The vectors are staged from their gathered sources in destination order
// (col_gathered_stage), then written out linearly (col_gathered_store): the
// shared-memory reads are conflict-free.
struct GatheredSlice {
  int64_t r0;
  uint32_t nrows;
  int64_t b0;
  uint32_t per_row;
  FastDiv div;
};

template <int V, class Ctx>
FLASHMLA_PERM_BODY void col_gathered_stage(Ctx& ctx, const ColJob& p, const GatheredSlice& g, uint8_t* buf) {
  const int32_t* offset = p.source_offset;
  const int shift = p.chunk_shift;
  const int64_t mask = (int64_t{1} << shift) - 1;
  const LinesFrom<const uint8_t> rows(p.src, p.src_rows, g.r0);
  stage_items<V>(ctx, g.nrows * g.per_row, [&](uint32_t i, uint8_t*& b, const uint8_t*& s) {
    const uint32_t r = g.div.div(i);
    const int64_t c = g.b0 + static_cast<int64_t>(i - r * g.per_row) * V;
    b = buf + static_cast<int64_t>(i) * V;
    s = rows.line(r, AnyDims{}) + offset[c >> shift] + (c & mask);
  });
}

template <int V, class Ctx>
FLASHMLA_PERM_BODY void col_gathered_store(Ctx& ctx, const ColJob& p, const GatheredSlice& g,
                                           const uint8_t* buf) {
  const LinesFrom<uint8_t> rows(p.dst + g.b0, p.dst_rows, g.r0);
  store_items<V>(ctx, g.nrows * g.per_row, p.dst_rows.dims == 1, [&](uint32_t i, uint8_t*& d, auto dims) {
    const uint32_t r = g.div.div(i);
    d = rows.line(r, dims) + static_cast<int64_t>(i - r * g.per_row) * V;
    return load_vec<V>(buf + static_cast<int64_t>(i) * V);
  });
}

// One stage: stage the slice, wait, store it.
template <int V, class Ctx>
FLASHMLA_PERM_BODY void col_gathered_slice(Ctx& ctx, const ColJob& p, const GatheredSlice& g, uint8_t* buf) {
  col_gathered_stage<V>(ctx, p, g, buf);
  ctx.stage_wait();
  ctx.sync();
  col_gathered_store<V>(ctx, p, g, buf);
  ctx.sync();  // the next tile reuses the buffer
}

// A staged tile's rows, as the gathered slice of its whole rows. Only tiles
// of whole runs gather in their stage loop (gathers_in_stage), and those
// divide by a row's vectors, the same for the last tile: items_div[0].
template <int V>
FLASHMLA_PERM_BODY GatheredSlice staged_slice(const ColJob& p, int64_t tile) {
  const int64_t r0 = tile * p.tile_rows;
  return {r0, static_cast<uint32_t>(min_of(p.tile_rows, p.rows - r0)), 0,
          static_cast<uint32_t>(p.row_bytes / V), p.items_div[0]};
}

template <int V, class Ctx>
FLASHMLA_PERM_BODY void col_staged_tile(Ctx& ctx, const ColJob& p, int64_t tile, uint8_t* buf) {
  const int64_t r0 = tile * p.tile_rows;
  const int64_t nr = min_of(p.tile_rows, p.rows - r0);
  const int64_t rb = p.row_bytes;
  if constexpr (Ctx::kSerial) {
    // Rows staged in the buffer (logical bytes in order), gathered into its
    // last row, which goes back out run by run.
    const int64_t run = p.run, pitch = p.run_pitch, runs = rb / run;
    const int32_t* offset = p.source_offset;
    uint8_t* out = buf + nr * rb;
    for (int64_t r = 0; r < nr; ++r) {
      const uint8_t* s = p.src + p.src_rows.offset(r0 + r);
      if (runs == 1)
        std::memcpy(buf + r * rb, s, static_cast<size_t>(rb));
      else
        pack_runs(buf + r * rb, s, runs, run, pitch);
    }
    for (int64_t r = 0; r < nr; ++r) {
      uint8_t* d = p.dst + p.dst_rows.offset(r0 + r);
      if (runs == 1) {
        gather_row_serial<V>(offset, rb, buf + r * rb, d);
      } else {
        gather_row_serial<V>(offset, rb, buf + r * rb, out);
        unpack_runs(d, out, runs, run, pitch);
      }
    }
  } else if (gathers_in_stage(p, V, true)) {
    // Whole rows of chunks at least V wide (the wo_a and wv weights): the
    // gather goes in the cp.async addresses and the store phase is a linear
    // copy. Gathered from the buffer, the wo_a weight's 16-byte pieces sat
    // 512 bytes apart (4-way bank conflicts). In place it is safe: a tile
    // reads only its own rows, all before its barrier. V = 16 only (the
    // other widths keep the gather below): at every other width this form
    // takes the sm_100 build past 255 registers, into spills.
    col_gathered_slice<V>(ctx, p, staged_slice<V>(p, tile), buf);
  } else {
    const uint32_t per_row = static_cast<uint32_t>(rb / V);
    const uint32_t nrows = static_cast<uint32_t>(nr);
    // Offsets into the tile buffer and bytes of a row in 32 bits (both under
    // the buffer's kGpuTileBudget): 64-bit ones cost each item more.
    const uint32_t bp = static_cast<uint32_t>(p.buf_pitch);
    // Item i: row r, vector k of the row. Whole runs: the row's vectors
    // are neighbours in memory (k fastest). Short runs: neighbouring rows
    // are (the words of an MN-major scale), so r goes fastest.
    const bool rows_fastest = p.run < rb;
    const FastDiv div = tile + 1 == p.tiles ? p.items_div[1] : p.items_div[0];
    auto split = [&](uint32_t i, uint32_t& r, uint32_t& b, bool rows_fastest) {
      const uint32_t q = div.div(i);
      uint32_t k;
      if (rows_fastest) {
        k = q;
        r = i - q * nrows;
      } else {
        r = q;
        k = i - q * per_row;
      }
      b = k * V;
    };
    const LinesFrom<const uint8_t> src_rows(p.src, p.src_rows, r0);
    stage_items<V>(ctx, nrows * per_row, [&](uint32_t i, uint8_t*& d, const uint8_t*& s) {
      uint32_t r, b;
      split(i, r, b, rows_fastest);
      d = buf + (r * bp + b);
      s = src_rows.line(r, AnyDims{}) + col_byte_at(p, b);
    });
    ctx.stage_wait();
    ctx.sync();
    const int32_t* offset = p.source_offset;
    const int shift = p.chunk_shift;
    const LinesFrom<uint8_t> dst_rows(p.dst, p.dst_rows, r0);
    // whole: chunks at least V wide (gather_whole), else gather_pieces. The
    // batched loops take rows_fastest as a Flag: a runtime one there let
    // the compiler compute both forms of each item's address, 20 more
    // instructions a batch (sm_90).
    auto gathered = [&](auto whole, auto fastest) {
      return [&, fastest](uint32_t i, uint8_t*& d, auto dims) {
        uint32_t r, b;
        split(i, r, b, fastest);
        d = dst_rows.line(r, dims) + (fastest ? col_run_byte_at(p, b) : b);
        if constexpr (decltype(whole)::value)
          return gather_whole<V>(buf + r * bp, offset, shift, b);
        else
          return gather_pieces<V>(buf + r * bp, offset, shift, b);
      };
    };
    const bool one_dim = p.dst_rows.dims == 1;
    if (V > 1 && (1 << shift) < V) {  // (no chunk is under 1 byte)
      if (rows_fastest)
        store_items<V, 1>(ctx, nrows * per_row, false, gathered(Flag<V == 1>{}, Flag<true>{}));
      else
        store_items<V, 1>(ctx, nrows * per_row, false, gathered(Flag<V == 1>{}, Flag<false>{}));
    } else if (rows_fastest)
      store_items<V>(ctx, nrows * per_row, one_dim, gathered(Flag<true>{}, Flag<true>{}));
    else
      store_items<V>(ctx, nrows * per_row, one_dim, gathered(Flag<true>{}, Flag<false>{}));
    ctx.sync();  // the next tile reuses the buffer
  }
}

// Half of a staged tile at V = 16 that gathers in its stage loop (in a
// launch planned with two stages: col_two_stages): its stage loop into
// `buf`, or its store loop from it. In place too: a tile reads and writes
// only its own rows, so the next tile's loads (other rows) may fly while this
// one stores.
template <int V, class Ctx>
FLASHMLA_PERM_BODY void col_staged_half(Ctx& ctx, const ColJob& p, int64_t tile, uint8_t* buf, bool store) {
  if (!gathers_in_stage(p, V, true)) {  // col_two_stages sends no other job here: never leave bytes unwritten
#if defined(__CUDA_ARCH__)
    __trap();
#endif
    return;
  }
  const GatheredSlice g = staged_slice<V>(p, tile);
  if (store)
    col_gathered_store<V>(ctx, p, g, buf);
  else
    col_gathered_stage<V>(ctx, p, g, buf);
}

// Where direct tile `tile` of vector width V sits: its rows and its slice of
// destination bytes. Divided by a full slice's vectors, also for a row's
// narrower last slice: a row cut into slices makes tiles of one row, whose
// items all lie below per_row, so any divisor at least per_row gives row 0.
template <int V>
FLASHMLA_PERM_BODY GatheredSlice direct_slice(const ColJob& p, int64_t tile) {
  const int64_t rt = p.row_tiles_div.div(static_cast<uint32_t>(tile));
  const int64_t st = tile - rt * p.row_tiles;
  const int64_t r0 = rt * p.tile_rows;
  const int64_t b0 = st * p.slice_bytes;
  return {r0, static_cast<uint32_t>(min_of(p.tile_rows, p.rows - r0)), b0,
          static_cast<uint32_t>(min_of(p.slice_bytes, p.row_bytes - b0) / V), p.items_div[0]};
}

// Direct tiles: parallel contexts only (host executors stage whole rows).
template <int V, class Ctx>
FLASHMLA_PERM_BODY void col_direct_tile(Ctx& ctx, const ColJob& p, int64_t tile, uint8_t* buf) {
  const GatheredSlice g = direct_slice<V>(p, tile);
  if (gathers_in_stage(p, V, false)) {
    col_gathered_slice<V>(ctx, p, g, buf);
    return;
  }
  if constexpr (V > 1) {  // chunks narrower than V (none is under 1 byte)
    const int32_t* offset = p.source_offset;
    const int shift = p.chunk_shift;
    const LinesFrom<uint8_t> dst_rows(p.dst + g.b0, p.dst_rows, g.r0);
    const LinesFrom<const uint8_t> src_rows(p.src, p.src_rows, g.r0);
    const bool one_dim = p.src_rows.dims == 1 && p.dst_rows.dims == 1;
    store_items<V, 1>(ctx, g.nrows * g.per_row, one_dim, [&](uint32_t i, uint8_t*& d, auto dims) {
      const uint32_t r = g.div.div(i);
      const int64_t c = static_cast<int64_t>(i - r * g.per_row) * V;
      d = dst_rows.line(r, dims) + c;
      return gather_pieces<V>(src_rows.line(r, dims), offset, shift, g.b0 + c);
    });
  }
}

// Half of a direct tile that gathers in its stage loop at V = 16 (the
// launch gives a job stage_bytes only then): its stage loop into `buf`, or
// its store loop from it.
template <int V, class Ctx>
FLASHMLA_PERM_BODY void col_direct_half(Ctx& ctx, const ColJob& p, int64_t tile, uint8_t* buf, bool store) {
  if (!gathers_in_stage(p, V,
                        false)) {  // col_two_stages sends no other job here: never leave bytes unwritten
#if defined(__CUDA_ARCH__)
    __trap();
#endif
    return;
  }
  const GatheredSlice g = direct_slice<V>(p, tile);
  if (store)
    col_gathered_store<V>(ctx, p, g, buf);
  else
    col_gathered_stage<V>(ctx, p, g, buf);
}

// Whether a column job's tiles run through two_stage_loop (col_staged_half,
// col_direct_half; `staged`: the kernel that runs it): in a launch planned
// with two tile buffers (`stage_bytes`, every job's: launch.cpp
// set_two_stages, which plans them for direct jobs only where they gather in
// the stage loop), and for staged jobs gathered in the stage loop. Staged
// tiles that gather from their buffer (the per-32 scales) in such a launch
// run one stage, in the first buffer (sized for them): they load nothing
// before their store loop that a second buffer could hold.
FLASHMLA_PERM_HOST_DEVICE bool col_two_stages(int64_t stage_bytes, const ColJob& p, bool staged) {
  return stage_bytes > 0 && (!staged || gathers_in_stage(p, 16, true));
}

// Parallel contexts: the tiles first, first + step, ... below total, through
// two buffers (`buf`, `buf + buf_bytes`): tile t + step's loads are issued
// before tile t stores, so a CTA always has a tile's loads in flight (one
// stage leaves it idle while it stores; the first device run put that
// round trip, exposed once a tile, at the head of what the kernels lose).
// half(t, b, store) issues tile t's stage loop into buffer b (store false)
// or its store loop from b (store true). A tile's loads may fly while
// another tile stores only where no tile reads what another writes: direct
// tiles are out of place (a slice of a row gathers from the whole source
// row, which in place a sibling tile could already have written), staged
// ones read and write only their own whole rows (col_staged_half).
template <class Ctx, class Half>
FLASHMLA_PERM_BODY void two_stage_loop(Ctx& ctx, int64_t first, int64_t step, int64_t total, uint8_t* buf,
                                       int64_t buf_bytes, Half half) {
  if (first >= total) return;
  half(first, buf, false);
  ctx.stage_commit();
  int64_t at = 0;  // the buffer tile t is in: 0 or buf_bytes
  for (int64_t t = first; t < total; t += step) {
    if (t + step < total) {
      half(t + step, buf + (buf_bytes - at), false);
      ctx.stage_commit();
      ctx.template stage_wait_prior<1>();  // every group but the newest: tile t's
    } else {
      ctx.stage_wait();
    }
    ctx.sync();
    half(t, buf + at, true);
    ctx.sync();  // the next pass stages into this buffer
    at = buf_bytes - at;
  }
}

}  // namespace flashmla_perm
