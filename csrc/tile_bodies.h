// Tile bodies: the only code that moves bytes. Written once, compiled by nvcc
// (CUDA threads, __syncthreads) and by the host compiler (one thread per tile,
// or std::threads with a std::barrier in the host harness). No ATen in here:
// plain pointers, sizes and strides in small params structs.
//
// An execution context `Ctx` provides:
//   static constexpr bool kSerial;  // one thread runs the whole tile
//   int thread() const;             // this thread's index in the tile
//   int num_threads() const;
//   void sync();                    // barrier across the tile's threads
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FLASHMLA_PERM_BODY __device__ __forceinline__
#else
#define FLASHMLA_PERM_BODY inline
#endif

namespace flashmla_perm {

// Unit of a cooperative copy: V bytes moved by one load and one store.
template <int V> struct VecOf;
#if defined(__CUDACC__)
template <> struct VecOf<16> { using type = uint4; };  // 128-bit ld/st
template <> struct VecOf<8> { using type = uint2; };
#else
struct alignas(16) Bytes16 { uint64_t lo, hi; };
template <> struct VecOf<16> { using type = Bytes16; };
template <> struct VecOf<8> { using type = uint64_t; };
#endif
template <> struct VecOf<4> { using type = uint32_t; };
template <> struct VecOf<2> { using type = uint16_t; };
template <> struct VecOf<1> { using type = uint8_t; };

template <class T>
FLASHMLA_PERM_BODY T min_of(T a, T b) { return a < b ? a : b; }

// Vectors a thread of a parallel context loads before it stores them.
constexpr int kBatch = 4;

// Parallel contexts: item i < total moves V bytes from src + s to dst + d,
// where offsets(i, d, s) says d and s. Items are spread over the threads, and
// each thread issues kBatch loads before it stores them, so that several are
// in flight at once. Sources and destinations never overlap.
template <int V, class Ctx, class Offsets>
FLASHMLA_PERM_BODY void move_items(Ctx& ctx, uint8_t* dst, const uint8_t* src, uint32_t total,
                                   Offsets offsets) {
  using T = typename VecOf<V>::type;
  const uint32_t stride = ctx.num_threads();
  for (uint32_t base = ctx.thread(); base < total; base += kBatch * stride) {
    T v[kBatch];
    int64_t d[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (base + u * stride < total) {
        int64_t s;
        offsets(base + u * stride, d[u], s);
        v[u] = *reinterpret_cast<const T*>(src + s);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (base + u * stride < total) *reinterpret_cast<T*>(dst + d[u]) = v[u];
  }
}

// dst[r * dst_pitch + c] = src[r * src_pitch + c] for r < rows, c < bytes.
// Parallel contexts need every address, pitch and `bytes` to be a multiple of
// V; `rows * bytes / V` fits 32 bits (a tile, never a whole tensor).
template <int V, class Ctx>
FLASHMLA_PERM_BODY void copy_rect(Ctx& ctx, uint8_t* dst, int64_t dst_pitch,
                                  const uint8_t* src, int64_t src_pitch,
                                  int64_t rows, int64_t bytes) {
  if constexpr (Ctx::kSerial) {
    if (dst_pitch == bytes && src_pitch == bytes) {
      std::memcpy(dst, src, static_cast<size_t>(rows * bytes));
      return;
    }
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dst_pitch, src + r * src_pitch, static_cast<size_t>(bytes));
  } else {
    // Flatten (row, vector) over the threads so that narrow rows still keep
    // every thread busy.
    const uint32_t per_row = static_cast<uint32_t>(bytes / V);
    move_items<V>(ctx, dst, src, static_cast<uint32_t>(rows) * per_row,
                  [=](uint32_t i, int64_t& d, int64_t& s) {
                    const uint32_t r = i / per_row;
                    const int64_t c = static_cast<int64_t>(i - r * per_row) * V;
                    d = r * dst_pitch + c;
                    s = r * src_pitch + c;
                  });
  }
}

// ---------------------------------------------------------------------------
// Row permutation by cycle segments (see DESIGN.md).
//
// Rows are moved in units of `unit_rows` consecutive rows (a block of the
// permutation). Destination unit order[k] receives source unit order[k + 1]
// inside a segment; the segment's last destination receives either its own
// first unit (the segment is a whole cycle: the tile saves it before writing)
// or the first unit of the next segment, which phase A saved to scratch.
struct RowParams {
  uint8_t* data;                 // row 0, column byte 0
  int64_t row_stride;            // bytes from one row to the next
  int64_t row_bytes;             // contiguous bytes of one row
  int64_t unit_rows;             // rows that move together
  const int64_t* order;          // units in cycle order, cycle after cycle
  const int64_t* segments;       // per segment: first position, length, tail slot (-1: own first unit)
  uint8_t* scratch;              // slot s: unit_rows x row_bytes, packed
  int64_t slice_bytes;           // column bytes of one tile
  int64_t num_slices;            // tiles per segment
  int64_t step;                  // positions loaded before they are stored
};

// Shared memory a row tile needs: the saved tail source plus `step` buffers.
inline int64_t row_tile_smem_bytes(int64_t unit_rows, int64_t slice_bytes, int64_t step) {
  return (step + 1) * unit_rows * slice_bytes;
}

// Phase A: scratch slot `seg` <- first unit of segment `seg` (column slice).
// Only segments [0, number of scratch slots) are cut from longer cycles.
template <int V, class Ctx>
FLASHMLA_PERM_BODY void save_segment_head(Ctx& ctx, const RowParams& p, int64_t tile) {
  const int64_t seg = tile / p.num_slices;
  const int64_t col = (tile - seg * p.num_slices) * p.slice_bytes;
  const int64_t width = min_of(p.slice_bytes, p.row_bytes - col);
  const int64_t head = p.order[p.segments[3 * seg]];
  copy_rect<V>(ctx, p.scratch + seg * p.unit_rows * p.row_bytes + col, p.row_bytes,
               p.data + head * p.unit_rows * p.row_stride + col, p.row_stride,
               p.unit_rows, width);
}

// Phase B: one (segment, column slice) tile. Walks the chain in steps: load
// the sources of the next `step` positions, barrier, store them. Position k's
// destination was position k-1's source, so it is still cached when written,
// and reading k+1..k+step before writing k..k+step-1 never reads a byte that
// this tile already overwrote. Other tiles touch other units or columns.
template <int V, class Ctx>
FLASHMLA_PERM_BODY void row_segment_tile(Ctx& ctx, const RowParams& p, int64_t tile,
                                         uint8_t* smem) {
  const int64_t seg = tile / p.num_slices;
  const int64_t col = (tile - seg * p.num_slices) * p.slice_bytes;
  const int64_t width = min_of(p.slice_bytes, p.row_bytes - col);
  const int64_t* pos = p.order + p.segments[3 * seg];
  const int64_t len = p.segments[3 * seg + 1];
  const int64_t tail = p.segments[3 * seg + 2];
  const int64_t g = p.unit_rows;
  const int64_t pitch = p.slice_bytes;
  const int64_t buf_bytes = g * pitch;
  auto unit = [&](int64_t u) { return p.data + u * g * p.row_stride + col; };

  uint8_t* tail_src = smem;
  if (tail < 0)
    copy_rect<V>(ctx, tail_src, pitch, unit(pos[0]), p.row_stride, g, width);
  else
    copy_rect<V>(ctx, tail_src, pitch, p.scratch + tail * g * p.row_bytes + col, p.row_bytes,
                 g, width);

  if constexpr (Ctx::kSerial) {
    // One thread, step 1: each load is stored at once, so it can go straight
    // from its source unit to its destination (distinct units of a cycle).
    for (int64_t k = 0; k + 1 < len; ++k)
      copy_rect<V>(ctx, unit(pos[k]), p.row_stride, unit(pos[k + 1]), p.row_stride, g, width);
    copy_rect<V>(ctx, unit(pos[len - 1]), p.row_stride, tail_src, pitch, g, width);
    return;
  }
  for (int64_t k0 = 0; k0 < len; k0 += p.step) {
    const int64_t n = min_of(p.step, len - k0);
    for (int64_t i = 0; i < n; ++i)
      if (k0 + i + 1 < len)
        copy_rect<V>(ctx, smem + (1 + i) * buf_bytes, pitch, unit(pos[k0 + i + 1]),
                     p.row_stride, g, width);
    ctx.sync();
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* src = (k0 + i + 1 < len) ? smem + (1 + i) * buf_bytes : tail_src;
      copy_rect<V>(ctx, unit(pos[k0 + i]), p.row_stride, src, pitch, g, width);
    }
    ctx.sync();  // the next step reuses the buffers
  }
}

// ---------------------------------------------------------------------------
// Column permutation within rows: a tile of whole rows is staged in shared
// memory and written back gathered. In place when src == dst (a tile reads
// only its own rows, all of them before the barrier).
struct ColParams {
  const uint8_t* src;
  uint8_t* dst;
  int64_t src_row_stride;        // bytes
  int64_t dst_row_stride;        // bytes
  int64_t rows;
  int64_t row_bytes;
  const int32_t* source_offset;  // per destination chunk of a row: source byte offset
  int chunk_shift;               // log2(chunk bytes); chunks are the permutation's runs cut to <= 64 bytes
  int64_t tile_rows;
};

template <int V, class Ctx>
FLASHMLA_PERM_BODY void col_gather_tile(Ctx& ctx, const ColParams& p, int64_t tile,
                                        uint8_t* smem) {
  const int64_t r0 = tile * p.tile_rows;
  const int64_t nr = min_of(p.tile_rows, p.rows - r0);
  const int64_t rb = p.row_bytes;
  uint8_t* dst = p.dst + r0 * p.dst_row_stride;
  copy_rect<V>(ctx, smem, rb, p.src + r0 * p.src_row_stride, p.src_row_stride, nr, rb);
  ctx.sync();
  if constexpr (Ctx::kSerial) {
    // Host executors pass V == the chunk size, so chunk j is simply
    // offset[j]. memcpy: host addresses may be unaligned. Locals, not p's
    // fields: byte stores may alias them and force reloads.
    const int32_t* offset = p.source_offset;
    const int64_t chunks = rb / V;
    const int64_t dst_stride = p.dst_row_stride;
    for (int64_t r = 0; r < nr; ++r) {
      const uint8_t* row = smem + r * rb;
      uint8_t* out = dst + r * dst_stride;
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
  } else {
    const int64_t mask = (int64_t{1} << p.chunk_shift) - 1;
    const uint32_t per_row = static_cast<uint32_t>(rb / V);
    const int32_t* offset = p.source_offset;
    const int shift = p.chunk_shift;
    const int64_t dst_stride = p.dst_row_stride;
    move_items<V>(ctx, dst, smem, static_cast<uint32_t>(nr) * per_row,
                  [=](uint32_t i, int64_t& d, int64_t& s) {
                    const uint32_t r = i / per_row;
                    const int64_t b = static_cast<int64_t>(i - r * per_row) * V;
                    d = r * dst_stride + b;
                    s = r * rb + offset[b >> shift] + (b & mask);
                  });
  }
  ctx.sync();  // the context's next tile reuses the buffer
}

}  // namespace flashmla_perm
