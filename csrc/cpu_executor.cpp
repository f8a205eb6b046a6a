// CPU executor: the tile bodies with one thread per tile, tiles spread over
// ATen's intra-op thread pool. Step 1: each destination is written right after
// its successor was read, while it is still in cache (DESIGN.md, "Order of the
// moves inside a segment").
#include <ATen/Parallel.h>
#include <ATen/ATen.h>

#include <memory>

#include "executors.h"
#include "tiling.h"

// at::parallel_for is a header template: with torch's OpenMP backend it runs
// its chunks on several threads only where this file is built with OpenMP.
// Without it the executor silently uses one core (it did, and ran 1.6x slower).
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "csrc/cpu_executor.cpp must be built with -fopenmp (csrc/build_config.txt)"
#endif

namespace flashmla_perm {
namespace {

struct SerialCtx {
  static constexpr bool kSerial = true;
  int thread() const { return 0; }
  int num_threads() const { return 1; }
  void sync() {}
};

// Row tiles: one thread walks the chain straight from unit to unit and keeps
// only the saved tail unit in its buffer; slices cap that buffer for wide rows.
constexpr int64_t kRowBudget = 512 * 1024;
// Column tiles: the staged rows and the destination lines they are written
// back to both stay in a 32 KiB L1. Measured on the wo_a TP1 weight (4 KiB
// rows, 2 threads): 4 KiB tiles ran at 0.67x the time of a plain copy, 8 KiB
// at 0.75-0.78x, 16 KiB at 0.82-0.84x, 32 KiB at 0.77x.
constexpr int64_t kColBudget = 4 * 1024;
constexpr int64_t kStep = 1;

// A tile's private buffer, 64-byte aligned.
struct Buffer {
  explicit Buffer(int64_t bytes) : raw(new uint8_t[bytes + 64]) {
    data = raw.get() + (64 - reinterpret_cast<uintptr_t>(raw.get()) % 64) % 64;
  }
  std::unique_ptr<uint8_t[]> raw;
  uint8_t* data;
};

// Calls f(std::integral_constant<int, bytes>{}) for a chunk of 1..kMaxChunk bytes.
template <class F>
void with_chunk_bytes(int bytes, F&& f) {
  static_assert(kMaxChunk == 64, "cases below cover 1..64");
  switch (bytes) {
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    default: with_vector_width(bytes, f); break;
  }
}

}  // namespace

void run_rows_cpu(const RowTarget& target, const RowPlan& plan) {
  if (plan.num_segments == 0) return;
  const RowTiling tiling = row_tiling(plan.unit_rows, target.row_bytes, kStep, kRowBudget);
  at::Tensor scratch;
  if (plan.num_scratch > 0)
    scratch = at::empty({plan.num_scratch * plan.unit_rows * target.row_bytes}, at::kByte);
  const RowParams p{target.data,        target.row_stride, target.row_bytes,
                    plan.unit_rows,     plan.order.data(), plan.segments.data(),
                    plan.num_scratch > 0 ? scratch.data_ptr<uint8_t>() : nullptr,
                    tiling.slice_bytes, tiling.num_slices, tiling.step};
  at::parallel_for(0, plan.num_scratch * p.num_slices, 1, [&](int64_t begin, int64_t end) {
    SerialCtx ctx;
    for (int64_t t = begin; t < end; ++t) save_segment_head<1>(ctx, p, t);
  });
  at::parallel_for(0, plan.num_segments * p.num_slices, 1, [&](int64_t begin, int64_t end) {
    SerialCtx ctx;
    Buffer smem(tiling.smem_bytes);
    for (int64_t t = begin; t < end; ++t) row_segment_tile<1>(ctx, p, t, smem.data);
  });
}

void run_cols_cpu(const ColTarget& target, const ColPlan& plan) {
  if (target.rows == 0 || target.row_bytes == 0) return;
  const int64_t tile_rows = std::max<int64_t>(1, col_tile_rows(target.row_bytes, target.rows, kColBudget));
  const ColParams p{target.src,  target.dst, target.src_row_stride, target.dst_row_stride,
                    target.rows, target.row_bytes, plan.source_offset.data(), plan.chunk_shift,
                    tile_rows};
  const int64_t tiles = (target.rows + tile_rows - 1) / tile_rows;
  // Host loads and stores need no alignment: move whole chunks.
  with_chunk_bytes(1 << plan.chunk_shift, [&](auto v) {
    at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
      SerialCtx ctx;
      Buffer smem(tile_rows * target.row_bytes);
      for (int64_t t = begin; t < end; ++t) col_gather_tile<decltype(v)::value>(ctx, p, t, smem.data);
    });
  });
}

}  // namespace flashmla_perm
