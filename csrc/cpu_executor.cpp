// CPU executor: the tile bodies with one thread per tile, tiles spread over
// ATen's intra-op thread pool. Step 1: each destination is written right after
// its successor was read, while it is still in cache (DESIGN.md, "Order of the
// moves inside a segment").
#include <ATen/Parallel.h>

#include <memory>

#include "executors.h"
#include "serial_tiles.h"

// at::parallel_for is a header template: with torch's OpenMP backend it runs
// its chunks on several threads only where this file is built with OpenMP.
// Without it the executor silently uses one core (it did, and ran 1.6x slower).
#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "csrc/cpu_executor.cpp must be built with -fopenmp (csrc/build_config.txt)"
#endif

namespace flashmla_perm {
namespace {

// A tile's private buffer, 64-byte aligned.
struct Buffer {
  explicit Buffer(int64_t bytes) : raw(new uint8_t[bytes + 64]) {
    data = raw.get() + (64 - reinterpret_cast<uintptr_t>(raw.get()) % 64) % 64;
  }
  std::unique_ptr<uint8_t[]> raw;
  uint8_t* data;
};

}  // namespace

int64_t cpu_row_scratch_bytes(const UnitView& view, const RowPlan& plan) {
  return plan.num_scratch * view.lines * view.line_bytes;
}

void run_rows_cpu(const UnitView& view, const RowPlan& plan, uint8_t* scratch) {
  if (plan.num_segments == 0) return;
  int64_t buffer_bytes = 0;
  RowJob p = cpu_row_job(view, plan, &buffer_bytes);
  p.scratch = scratch;
  at::parallel_for(0, p.head_tiles, 1, [&](int64_t begin, int64_t end) {
    SerialCtx ctx;
    for (int64_t t = begin; t < end; ++t) save_segment_head<1>(ctx, p, t);
  });
  at::parallel_for(0, p.tiles, cpu_grain(p.tiles, buffer_bytes), [&](int64_t begin, int64_t end) {
    SerialCtx ctx;
    Buffer buf(buffer_bytes);
    for (int64_t t = begin; t < end; ++t) row_segment_tile<1>(ctx, p, t, buf.data);
  });
}

void run_cols_cpu(const ColView& view, const ColPlan& plan) {
  if (view.rows == 0 || view.row_bytes == 0) return;
  int64_t buffer_bytes = 0;
  const ColJob p = cpu_col_job(view, plan, &buffer_bytes);
  // In place, the buffers in flight are the call's extra memory: bounded.
  // Out of place the call allocates its whole output anyway: every thread.
  const int64_t grain = view.src == view.dst ? cpu_grain(p.tiles, buffer_bytes) : 1;
  with_chunk_bytes(p.vec, [&](auto v) {
    at::parallel_for(0, p.tiles, grain, [&](int64_t begin, int64_t end) {
      SerialCtx ctx;
      Buffer buf(buffer_bytes);
      for (int64_t t = begin; t < end; ++t) col_staged_tile<decltype(v)::value>(ctx, p, t, buf.data);
    });
  });
}

}  // namespace flashmla_perm
