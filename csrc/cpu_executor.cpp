// CPU executor: the tile bodies with one thread per tile, tiles spread over
// ATen's intra-op thread pool. Step 1: each destination is written right after
// its successor was read, while it is still in cache (docs/design.md, "Order of the
// moves inside a segment").
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
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

// A tile's buffer of its own, 64-byte aligned: only for a thread the job's
// plan did not count (ThreadTiles).
struct Buffer {
  explicit Buffer(int64_t bytes) : raw(new uint8_t[bytes + 64]) {
    data = raw.get() + (64 - reinterpret_cast<uintptr_t>(raw.get()) % 64) % 64;
  }
  std::unique_ptr<uint8_t[]> raw;
  uint8_t* data;
};

// One job's tile buffers, a thread each, carved from the call's arena, which
// the caller allocates before any job of the call moves a byte: a failed
// allocation then leaves every tensor as it was (buffers allocated inside the
// loop could fail after other threads had written).
// ATen's loop runs min(threads, chunks) threads numbered from 0 (one chunk
// run inline: thread 0), so `count` buffers cover them. But the count can
// change between the caller's sizing and the loop (the first parallel_for
// from this library on a thread resets its OpenMP count to torch's global
// one: at::internal::lazy_init_num_threads, inlined here with a flag of its
// own), so a thread takes a slot only where the arena holds it, and past
// it a buffer of its own (allocated in the loop: the rare case).
struct ThreadTiles {
  int64_t bytes, grain, count, stride;
  ThreadTiles(int64_t tile_bytes, int64_t tiles, int64_t loop_grain)
      : bytes(tile_bytes),
        grain(loop_grain),
        count(std::min<int64_t>(at::get_num_threads(), (tiles + loop_grain - 1) / loop_grain)),
        stride((tile_bytes + 63) / 64 * 64) {}
  int64_t arena_bytes() const { return count * stride; }

  // body(ctx, tile, buffer) for every tile in [0, tiles), the buffers from
  // `arena` of `arena_bytes`.
  template <class F>
  void run(int64_t tiles, uint8_t* arena, int64_t arena_bytes, F&& body) const {
    at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
      const int64_t t = at::get_thread_num();
      std::unique_ptr<Buffer> own;
      uint8_t* buf = arena + t * stride;
      if ((t + 1) * stride > arena_bytes) {
        own = std::make_unique<Buffer>(bytes);
        buf = own->data;
      }
      SerialCtx ctx;
      for (int64_t i = begin; i < end; ++i) body(ctx, i, buf);
    });
  }
};

ThreadTiles row_tiles(const RowJob& p, int64_t buffer_bytes) {
  return ThreadTiles(buffer_bytes, p.tiles, cpu_grain(p.tiles, buffer_bytes));
}

ThreadTiles col_tiles(const ColView& view, const ColJob& p, int64_t buffer_bytes) {
  // In place, the buffers in flight are the call's extra memory: bounded.
  // Out of place the call allocates its whole output anyway: every thread.
  return ThreadTiles(buffer_bytes, p.tiles, view.src == view.dst ? cpu_grain(p.tiles, buffer_bytes) : 1);
}

// Narrow units (one line of at most kNarrowUnitBytes): a tile a unit costs
// more than the unit's move, and a random permutation's moves wait on memory
// one after another where nothing prefetches them. So a thread takes a run
// of segments, whose positions are consecutive in the plan's array, and
// moves each unit with one fixed-size copy, the source unit kAhead
// positions on prefetched (its address is in the array).
constexpr int64_t kNarrowUnitBytes = 64;
constexpr int64_t kAhead = 16;
// Segments a chunk of ATen's loop.
constexpr int64_t kNarrowGrain = 256;

bool narrow_units(const UnitView& v) { return v.lines == 1 && v.line_bytes <= kNarrowUnitBytes; }

template <int W>
void move_narrow(const UnitView& v, const RowPlan& plan, uint8_t* scratch) {
  const int64_t w = W > 0 ? W : v.line_bytes;
  const int32_t* order = plan.order();
  const int32_t* first = plan.first();
  const int32_t* word = plan.word();
  auto unit = [&](int64_t u) { return v.data + u * v.unit_stride; };
  auto copy = [&](uint8_t* dst, const uint8_t* src) {
    std::memcpy(dst, src, static_cast<size_t>(W > 0 ? W : w));
  };
  // Each cut segment's first unit into its scratch slot before any moves.
  at::parallel_for(0, plan.num_scratch, kNarrowGrain * 16, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      if (s + kAhead < end) __builtin_prefetch(unit(order[first[s + kAhead]]));
      copy(scratch + s * w, unit(order[first[s]]));
    }
  });
  at::parallel_for(0, plan.num_segments, kNarrowGrain, [&](int64_t begin, int64_t end) {
    const int64_t stop = first[end];
    uint8_t held[kNarrowUnitBytes];
    for (int64_t s = begin; s < end; ++s) {
      const int64_t len = plan.length(s), cycle = plan.cycle_length(s);
      const bool cut = s < plan.num_scratch;
      for (int64_t c = first[s]; c < first[s] + len; c += cycle) {
        if (!cut) copy(held, unit(order[c]));
        for (int64_t k = c; k + 1 < c + cycle; ++k) {
          if (k + kAhead < stop) __builtin_prefetch(unit(order[k + kAhead]));
          copy(unit(order[k]), unit(order[k + 1]));
        }
        copy(unit(order[c + cycle - 1]), cut ? scratch + int64_t{word[s]} * w : held);
      }
    }
  });
}

}  // namespace

int64_t cpu_row_scratch_bytes(const UnitView& view, const RowPlan& plan) {
  return plan.num_scratch * view.lines * view.line_bytes;
}

int64_t cpu_row_tile_bytes(const UnitView& view, const RowPlan& plan) {
  if (plan.num_segments == 0 || narrow_units(view)) return 0;
  int64_t buffer_bytes = 0;
  const RowJob p = cpu_row_job(view, plan, &buffer_bytes);
  return row_tiles(p, buffer_bytes).arena_bytes();
}

int64_t cpu_col_tile_bytes(const ColView& view, const ColPlan& plan) {
  if (view.rows == 0 || view.row_bytes == 0) return 0;
  int64_t buffer_bytes = 0;
  const ColJob p = cpu_col_job(view, plan, &buffer_bytes);
  return col_tiles(view, p, buffer_bytes).arena_bytes();
}

void run_rows_cpu(const UnitView& view, const RowPlan& plan, uint8_t* scratch, uint8_t* arena,
                  int64_t arena_bytes) {
  if (plan.num_segments == 0) return;
  if (narrow_units(view)) {
    switch (view.line_bytes) {
      case 8: return move_narrow<8>(view, plan, scratch);
      case 16: return move_narrow<16>(view, plan, scratch);
      case 32: return move_narrow<32>(view, plan, scratch);
      case 64: return move_narrow<64>(view, plan, scratch);
      default: return move_narrow<0>(view, plan, scratch);
    }
  }
  int64_t buffer_bytes = 0;
  RowJob p = cpu_row_job(view, plan, &buffer_bytes);
  p.scratch = scratch;
  at::parallel_for(0, p.head_tiles, 1, [&](int64_t begin, int64_t end) {
    SerialCtx ctx;
    for (int64_t t = begin; t < end; ++t) save_segment_head<1>(ctx, p, t);
  });
  row_tiles(p, buffer_bytes).run(p.tiles, arena, arena_bytes, [&](SerialCtx& ctx, int64_t t, uint8_t* buf) {
    row_segment_tile<1>(ctx, p, t, buf);
  });
}

void run_cols_cpu(const ColView& view, const ColPlan& plan, uint8_t* arena, int64_t arena_bytes) {
  if (view.rows == 0 || view.row_bytes == 0) return;
  int64_t buffer_bytes = 0;
  const ColJob p = cpu_col_job(view, plan, &buffer_bytes);
  const ThreadTiles tiles = col_tiles(view, p, buffer_bytes);
  with_chunk_bytes(p.vec, [&](auto v) {
    tiles.run(p.tiles, arena, arena_bytes, [&](SerialCtx& ctx, int64_t t, uint8_t* buf) {
      col_staged_tile<decltype(v)::value>(ctx, p, t, buf);
    });
  });
}

}  // namespace flashmla_perm
