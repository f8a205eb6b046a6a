// Host harness for the tile bodies: runs them as the GPU does, each CTA a
// group of std::threads sharing a std::barrier, and checks every result
// against a naive permutation. Built under ThreadSanitizer in CI: a missing
// barrier in a body shows up as a data race, or as wrong bytes.
//
//   tile_harness            bodies under stress: odd thread counts, forced
//                           small slices and steps, random permutations
//   tile_harness --model    the exact launches the CUDA executor makes for
//                           DeepSeek-V4.1 (launch.h, H200 figures): wq_b and
//                           wo_a at TP 1, 2, 4, 8, permute_q at 64 and 128
//                           heads; every CTA of the grid with its tiles in
//                           grid-stride order, kGpuThreads (128) threads each
//                           and FlashMLA's packed layouts (wq_b with an
//                           MN-major int32 scale, 3-D wv with its packed scale)
//   --quick                 fewer thread counts, or TPs with --model (for sanitizer builds)
// The stress mode also draws random strided layouts (rank 1-4, any dim
// order, steps, padding, offsets) and runs both engines on the views
// csrc/strided.h makes of them, packed int32 words included; and row cycles
// longer than a segment (scratch) with units of several lines cut into
// slices, through both the threaded tile forms and the serial ones the CPU
// executor runs (SerialCtx, cpu_row_job / cpu_col_job).
// Every vector a threaded body stages, loads or stores is checked for the
// alignment its width needs on a GPU (csrc/tile_bodies.h,
// FLASHMLA_PERM_VECTOR_ACCESS); a misaligned load or store aborts the run,
// as it faults on a GPU. Exit 0 when every case matches.
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if __has_include(<cuda_occupancy.h>)  // the CUDA toolkit's, where CMake finds it
#include <cuda_occupancy.h>
#define FLASHMLA_PERM_HARNESS_OCCUPANCY 1
#endif

#include "../../csrc/launch.h"
#include "../../csrc/plan.h"
#include "../../csrc/serial_tiles.h"
#include "../../csrc/strided.h"
#include "../../csrc/tile_bodies.h"

namespace fp = flashmla_perm;

namespace {

// Staged vectors a GPU could not have moved (either end of a cp.async):
// counted, then reported (the harness's stage is a memcpy, which works).
int misaligned = 0;

void count_staged(const void* p, int bytes) {
  if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes))
    __atomic_add_fetch(&misaligned, 1, __ATOMIC_RELAXED);
}

}  // namespace

// Every load and store of a threaded body comes here (csrc/tile_bodies.h),
// before it happens. A misaligned one stops the run, as it would fault on a
// GPU (on a host it may fault too, or quietly work: either way, say which).
void fp::harness_vector_access(const void* p, int bytes, bool store) {
  if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0) return;
  std::fprintf(stderr, "FAIL misaligned %d-byte vector %s at %p\n", bytes, store ? "store" : "load", p);
  std::abort();
}

namespace {

// One thread of a simulated CTA. A stage is what cp.async does: the copy
// lands once a wait has released it, at the thread's next barrier; until
// then the buffer holds poison, so a body that reads its buffer too early
// gets wrong bytes. Both ends of every
// stage are checked for the alignment the GPU's instruction needs (loads
// and stores, through the hook above).
struct ThreadCtx {
  static constexpr bool kSerial = false;
  static constexpr bool kWholeWarps = false;  // odd thread counts too
  int tid;
  int nthreads;
  std::barrier<>* bar;
  // A stage lands only once a wait has released it, and then at this
  // thread's next barrier: the buffer holds poison until then, and the
  // source is read then, so a wait or a barrier missing, or a source
  // overwritten first, shows in the bytes whatever order the threads run
  // in. (cp.async lets a thread read its own stages right after its wait;
  // every body puts a barrier there anyway, since its threads read each
  // other's.) Committed groups, oldest first; the last entry is the group
  // still open.
  struct Pending {
    uint8_t* buf;
    const uint8_t* src;
    int bytes;
  };
  std::vector<std::vector<Pending>> groups{1};
  std::vector<Pending> released;  // waited for, landing at the next barrier
  int thread() const { return tid; }
  int num_threads() const { return nthreads; }
  void sync() {
    for (const Pending& p : released) std::memcpy(p.buf, p.src, p.bytes);
    released.clear();
    bar->arrive_and_wait();
  }
  template <int V>
  void stage(uint8_t* buf, const uint8_t* src) {
    count_staged(buf, V);
    count_staged(src, V);
    std::memset(buf, 0xA5, V);
    groups.back().push_back({buf, src, V});
  }
  void release(size_t group) {
    released.insert(released.end(), groups[group].begin(), groups[group].end());
    groups[group].clear();
  }
  void stage_wait() {  // every stage, committed or not
    for (size_t g = 0; g < groups.size(); ++g) release(g);
    groups.assign(1, {});
  }
  void stage_commit() { groups.emplace_back(); }
  template <int N>
  void stage_wait_prior() {  // all but the newest N committed groups
    const size_t committed = groups.size() - 1;
    const size_t keep = std::min<size_t>(N, committed);
    for (size_t g = 0; g < committed - keep; ++g) release(g);
    groups.erase(groups.begin(), groups.begin() + static_cast<std::ptrdiff_t>(committed - keep));
  }
};

// Runs a row plan as the CPU executor does (the save pass, then every tile
// with a buffer of its own), from cpu_row_job's tiling; slice_lines /
// slice_bytes > 0 cut the tiles smaller than its budget would (units that
// small never reach the 512 KiB it slices at). Tiles run last to first:
// they never race, so any order must give the same bytes.
void run_rows_serial(const fp::UnitView& view, const fp::RowPlan& plan, int64_t slice_lines,
                     int64_t slice_bytes) {
  if (plan.num_segments == 0) return;
  int64_t buffer_bytes = 0;
  fp::RowJob p = fp::cpu_row_job(view, plan, &buffer_bytes);
  fp::set_row_slices(p, slice_lines > 0 ? std::min(p.slice_lines, slice_lines) : p.slice_lines,
                     slice_bytes > 0 ? std::min(p.slice_bytes, slice_bytes) : p.slice_bytes);
  p.tiles = plan.num_segments * p.line_tiles * p.byte_tiles;
  p.head_tiles = plan.num_scratch * p.line_tiles * p.byte_tiles;
  std::vector<uint8_t> scratch(plan.num_scratch * view.lines * view.line_bytes + 1);
  std::vector<uint8_t> buf(p.slice_lines * p.slice_bytes + 1);
  p.scratch = scratch.data();
  fp::SerialCtx ctx;
  for (int64_t t = 0; t < p.head_tiles; ++t) fp::save_segment_head<1>(ctx, p, t);
  for (int64_t t = p.tiles - 1; t >= 0; --t) fp::row_segment_tile<1>(ctx, p, t, buf.data());
}

// Runs a column view as the CPU executor does (cpu_col_job: staged tiles,
// the vector as wide as the plan's chunk, 1 to 64 bytes).
void run_cols_serial(const fp::ColView& view, const fp::ColPlan& plan) {
  if (view.rows == 0 || view.row_bytes == 0) return;
  int64_t buffer_bytes = 0;
  const fp::ColJob p = fp::cpu_col_job(view, plan, &buffer_bytes);
  std::vector<uint8_t> buf(buffer_bytes + 1);
  fp::SerialCtx ctx;
  fp::with_chunk_bytes(p.vec, [&](auto v) {
    for (int64_t t = 0; t < p.tiles; ++t) fp::col_staged_tile<decltype(v)::value>(ctx, p, t, buf.data());
  });
}

// Runs one launch as the GPU would: CTAs [0, grid), each with l.threads
// threads, its own barrier and shared buffer, each running the tiles of one
// job (device_launch.h cta_tiles: the kernels' own mapping) from the
// parameter the CUDA launcher passes (launch.h row_jobs / col_jobs), as
// csrc/cuda/kernels.cu does. `concurrent` CTAs run at a time.
void report(bool ok, const std::string& what);

void run_launch(const fp::Launch& l, int concurrent) {
  const std::string name = fp::kernel_name(l.kernel);
  // A CTA's shared memory stays within the tile budget (under the 48 KiB a
  // launch may take without opting in), whatever its stages.
  if (l.smem_bytes > fp::kGpuTileBudget)
    report(false, name + " launch plans " + std::to_string(l.smem_bytes) +
                      " bytes of shared memory, over the budget");
  // The grid split (launch.cpp split_grid): every job with tiles has a CTA,
  // none has more CTAs than tiles, and one job has them all.
  for (int j = 0; j < l.num_jobs; ++j) {
    const int64_t ctas = j == 0 ? l.first_ctas : l.grid - l.first_ctas;
    if (ctas < 0 || ctas > l.job_tiles(j) || (l.job_tiles(j) > 0 && ctas == 0))
      report(false, name + " launch gives job " + std::to_string(j) + " " + std::to_string(ctas) + " of " +
                        std::to_string(l.grid) + " CTAs for " + std::to_string(l.job_tiles(j)) + " tiles");
  }
  if (l.num_jobs == 1 && l.first_ctas != l.grid) report(false, name + " launch of one job splits its grid");
  const fp::Jobs<fp::RowJob> rows = fp::row_jobs(l);
  const fp::Jobs<fp::ColJob> cols = fp::col_jobs(l);
  const uint32_t first_ctas = l.kernel == fp::Kernel::kCols ? cols.first_ctas : rows.first_ctas;
  // The CUDA launcher picks the kernel by job 0 (kernels.cu: a launch's
  // column jobs are all staged or all direct).
  const bool staged = l.cols[0].staged;
  if (l.kernel == fp::Kernel::kCols && l.num_jobs == 2 && cols.job[1].staged != staged)
    report(false, "cols launch mixes staged and direct jobs");
  // Two tile buffers where job 0's stage_bytes says (every job's), for
  // column jobs only those that gather in the stage loop (col_two_stages).
  const int64_t stage_bytes =
      l.kernel == fp::Kernel::kCols ? cols.job[0].stage_bytes : rows.job[0].stage_bytes;
  if ((l.kernel != fp::Kernel::kSaveHeads && stage_bytes > 0) != (l.stages == 2))
    report(false, name + " launch's stages and its jobs' stage_bytes differ");
  auto two_stages = [&](int j) {
    if (l.kernel == fp::Kernel::kCols) return fp::col_two_stages(stage_bytes, cols.job[j], staged);
    return l.kernel == fp::Kernel::kRows && stage_bytes > 0;
  };
  const int threads = l.threads;
  auto body = [&](ThreadCtx& ctx, int j, int64_t tile, uint8_t* smem) {
    const int vec = l.kernel == fp::Kernel::kCols ? cols.job[j].vec : rows.job[j].vec;
    fp::with_vector_width(vec, [&](auto vw) {
      constexpr int V = decltype(vw)::value;
      switch (l.kernel) {
        case fp::Kernel::kRows: fp::row_segment_tile<V>(ctx, rows.job[j], tile, smem); break;
        case fp::Kernel::kSaveHeads: fp::save_segment_head<V>(ctx, rows.job[j], tile); break;
        case fp::Kernel::kCols:
          if (staged)
            fp::col_staged_tile<V>(ctx, cols.job[j], tile, smem);
          else
            fp::col_direct_tile<V>(ctx, cols.job[j], tile, smem);
          break;
      }
    });
  };
  // A CTA's tiles one after another, or, with two tile buffers (direct
  // gathered tiles; staged gathered and row ones where the device spec
  // asks), through two_stage_loop at V = 16, as the CUDA kernels do.
  auto cta = [&](ThreadCtx& ctx, int64_t b, uint8_t* smem) {
    const fp::CtaTiles c = fp::cta_tiles(static_cast<uint32_t>(b), static_cast<uint32_t>(l.grid), first_ctas);
    const int j = c.job;
    const int64_t total = l.kernel == fp::Kernel::kCols   ? cols.job[j].tiles
                          : l.kernel == fp::Kernel::kRows ? rows.job[j].tiles
                                                          : rows.job[j].head_tiles;
    if (!two_stages(j)) {
      for (int64_t tile = c.first; tile < total; tile += c.stride) body(ctx, j, tile, smem);
      return;
    }
    const int64_t buf_bytes =
        l.kernel == fp::Kernel::kCols ? cols.job[j].stage_bytes : rows.job[j].stage_bytes;
    fp::two_stage_loop(ctx, c.first, c.stride, total, smem, buf_bytes,
                       [&](int64_t t, uint8_t* buf, bool store) {
                         if (l.kernel == fp::Kernel::kRows)
                           fp::row_segment_half<16>(ctx, rows.job[j], t, buf, store);
                         else if (staged)
                           fp::col_staged_half<16>(ctx, cols.job[j], t, buf, store);
                         else
                           fp::col_direct_half<16>(ctx, cols.job[j], t, buf, store);
                       });
  };
  concurrent = static_cast<int>(std::min<int64_t>(concurrent, l.grid));
  std::vector<std::unique_ptr<std::barrier<>>> bars;
  for (int c = 0; c < concurrent; ++c) bars.push_back(std::make_unique<std::barrier<>>(threads));
  std::vector<std::vector<uint8_t>> smem(concurrent, std::vector<uint8_t>(l.smem_bytes + 16));
  std::vector<std::thread> pool;
  for (int c = 0; c < concurrent; ++c)
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, c, t] {
        ThreadCtx ctx{t, threads, bars[c].get()};
        uint8_t* s = smem[c].data() + (16 - reinterpret_cast<uintptr_t>(smem[c].data()) % 16) % 16;
        for (int64_t b = c; b < l.grid; b += concurrent) cta(ctx, b, s);
      });
  for (auto& th : pool) th.join();
}

void run_launches(std::vector<fp::Launch>& launches, std::vector<std::vector<uint8_t>>& scratch,
                  int concurrent) {
  for (int j = 0; !launches.empty() && j < launches.front().num_jobs; ++j) {
    scratch.emplace_back(launches.front().scratch_bytes[j] + 16);
    fp::set_scratch(launches, j, scratch.back().data());
  }
  for (const fp::Launch& l : launches) run_launch(l, concurrent);
}

std::mt19937_64 rng(20261202);

std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<int64_t> random_perm(int64_t n) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), rng);
  return p;
}

std::vector<int64_t> one_cycle(int64_t n) {
  std::vector<int64_t> order = random_perm(n), p(n);
  for (int64_t i = 0; i < n; ++i) p[order[i]] = order[(i + 1) % n];
  return p;
}

// One cycle through `blocks` blocks of g consecutive indices (units of g rows).
std::vector<int64_t> block_cycle(int64_t blocks, int64_t g) {
  const std::vector<int64_t> b = one_cycle(blocks);
  std::vector<int64_t> p;
  for (int64_t x : b)
    for (int64_t i = 0; i < g; ++i) p.push_back(x * g + i);
  return p;
}

// n >= 65: one cycle through 65..n random indices, the rest permuted at
// random (a random permutation's cycles may all be short).
std::vector<int64_t> with_long_cycle(int64_t n) {
  const std::vector<int64_t> order = random_perm(n);
  const int64_t len = 65 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n - 64));
  std::vector<int64_t> p(n), rest(order.begin() + len, order.end());
  for (int64_t i = 0; i < len; ++i) p[order[i]] = order[(i + 1) % len];
  std::vector<int64_t> to = rest;
  std::shuffle(to.begin(), to.end(), rng);
  for (size_t i = 0; i < rest.size(); ++i) p[rest[i]] = to[i];
  return p;
}

// Short cycles of random lengths up to `most` (cycles of one length are
// packed into shared segments), a few fixed points, and the rest one cycle.
std::vector<int64_t> short_cycles(int64_t n, int64_t most) {
  const std::vector<int64_t> order = random_perm(n);
  std::vector<int64_t> p(n);
  int64_t at = 0;
  while (at < n) {
    int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(most));
    if (at + len > n || rng() % 16 == 0) len = n - at;  // the rest, now and then a long cycle
    for (int64_t i = 0; i < len; ++i) p[order[at + i]] = order[at + (i + 1) % len];
    at += len;
  }
  return p;
}

// Short cycles that a plan packing every short cycle packs: drawn again
// while the draw's first "rest" left one long cycle (so that the case keeps
// its point whatever the random draws before it).
std::vector<int64_t> packable_short_cycles(int64_t n, int64_t most) {
  std::vector<int64_t> p = short_cycles(n, most);
  for (int again = 0; again < 8 && fp::make_row_plan(p, fp::kMaxSegment, 0).num_packed == 0; ++again)
    p = short_cycles(n, most);
  return p;
}

std::vector<int64_t> reversal(int64_t n) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = n - 1 - i;
  return p;
}

std::vector<int64_t> identity(int64_t n) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

int failures = 0, cases = 0;

void report(bool ok, const std::string& what) {
  ++cases;
  if (!ok) {
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

// A tensor of `rows` rows of `row_bytes`, `row_stride` apart, from byte
// `offset` of a random buffer; bytes between rows must stay put.
struct Rows {
  std::vector<uint8_t> buf;
  int64_t rows, row_bytes, row_stride, offset;
  Rows(int64_t r, int64_t rb, int64_t rs, int64_t off)
      : buf(random_bytes(off + r * rs + 8)), rows(r), row_bytes(rb), row_stride(rs), offset(off) {}
  uint8_t* data() { return buf.data() + offset; }
  // The reference: rows gathered (dim 0) or each row's elements gathered (last dim).
  std::vector<uint8_t> rows_gathered(const std::vector<int64_t>& perm) const {
    std::vector<uint8_t> e = buf;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(&e[offset + r * row_stride], &buf[offset + perm[r] * row_stride], row_bytes);
    return e;
  }
  // (into_offset: where the rows start in `into`, when not at `offset`.)
  std::vector<uint8_t> cols_gathered(const std::vector<int64_t>& perm, int64_t esize,
                                     const std::vector<uint8_t>& from, std::vector<uint8_t> into,
                                     int64_t into_offset = -1) const {
    const int64_t to = into_offset < 0 ? offset : into_offset;
    for (int64_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < perm.size(); ++c)
        std::memcpy(&into[to + r * row_stride + c * esize], &from[offset + r * row_stride + perm[c] * esize],
                    esize);
    return into;
  }
};

// A small device, so that a few tiles already make several waves: a CTA
// runs several tiles (with two stages, through both buffers).
fp::DeviceSpec small_device(int col_stages = 1, int row_stages = 1) {
  fp::DeviceSpec d;
  d.sm_count = 2;
  d.max_ctas_per_sm = 2;
  d.col_stages = col_stages;
  d.row_stages = row_stages;
  return d;
}

// Shrinks a planned row job to force several slices and passes (the
// bodies must be correct for any consistent parameters, not only the
// planner's).
void shrink(fp::Launch& l, int64_t slice_lines, int64_t slice_bytes, int64_t step) {
  for (int j = 0; j < l.num_jobs; ++j) {
    fp::RowJob& p = l.rows[j];
    p.step = std::min(p.step, step);
    const int64_t segments = p.tiles / (p.line_tiles * p.byte_tiles);
    const int64_t heads = p.head_tiles / (p.line_tiles * p.byte_tiles);
    fp::set_row_slices(p, std::min(p.slice_lines, slice_lines),
                       slice_bytes < p.slice_bytes && slice_bytes % p.vec == 0 ? slice_bytes : p.slice_bytes);
    p.tiles = segments * p.line_tiles * p.byte_tiles;
    p.head_tiles = heads * p.line_tiles * p.byte_tiles;
    l.smem_bytes = std::max(l.smem_bytes, (p.step + 1) * p.slice_lines * p.slice_bytes);
  }
  l.tiles = 0;
  for (int j = 0; j < l.num_jobs; ++j) l.tiles += l.job_tiles(j);
}

// Rows of a padded tensor (units of several lines where the plan groups
// rows), threaded; with `serial` also as the CPU executor runs them. Slices
// of slice_lines (0: whole units) x slice_bytes, passes of `step`.
void check_rows(const std::vector<int64_t>& perm, int64_t row_bytes, int64_t row_stride, int64_t offset,
                int threads, int64_t slice_lines, int64_t slice_bytes, int64_t step, bool serial,
                const std::string& name, int64_t max_segment = fp::kMaxSegment,
                int64_t pack_above = fp::kPackCyclesAbove) {
  Rows t(static_cast<int64_t>(perm.size()), row_bytes, row_stride, offset);
  const Rows before = t;
  const std::vector<uint8_t> expected = t.rows_gathered(perm);
  const fp::RowPlan plan = fp::make_row_plan(perm, max_segment, pack_above);
  const fp::UnitView view = fp::row_units(t.data(), row_stride, row_bytes, plan.unit_rows);
  std::vector<fp::Launch> launches = fp::gpu_row_launches(&view, 1, plan, plan.index.data(), small_device());
  for (auto& l : launches) {
    l.threads = threads;
    shrink(l, slice_lines > 0 ? slice_lines : plan.unit_rows, slice_bytes, step);
  }
  std::vector<std::vector<uint8_t>> scratch;
  run_launches(launches, scratch, 3);
  const std::string what = "rows " + name + " rows=" + std::to_string(perm.size()) +
                           " bytes=" + std::to_string(row_bytes) +
                           " unit_rows=" + std::to_string(plan.unit_rows);
  report(t.buf == expected, what + " threads=" + std::to_string(threads));
  if (serial) {
    Rows s = before;
    run_rows_serial(fp::row_units(s.data(), row_stride, row_bytes, plan.unit_rows), plan, slice_lines,
                    slice_bytes);
    report(s.buf == expected, what + " serial");
  }
}

// Rows through two tile buffers per CTA (FLASHMLA_PERM_ROW_STAGES=2), as the
// planner makes them (one pass a tile, V = 16) for a padded tensor of
// 16-byte aligned rows; the save pass first where cycles are cut. With a
// tile budget (0: the default), tiles may need several passes, and rows not
// a multiple of 16 bytes take narrower vectors: the planner must refuse two
// stages there and plan one. Returns whether the launch got two stages.
bool check_rows_two_stages(const std::vector<int64_t>& perm, int64_t row_bytes, int64_t row_stride,
                           int threads, const std::string& name, int64_t pack_above = fp::kPackCyclesAbove,
                           int64_t tile_budget = 0) {
  Rows t(static_cast<int64_t>(perm.size()), row_bytes, row_stride, 16);
  const std::vector<uint8_t> expected = t.rows_gathered(perm);
  const fp::RowPlan plan = fp::make_row_plan(perm, fp::kMaxSegment, pack_above);
  if (pack_above == 0 && plan.num_packed == 0) report(false, "rows two stages " + name + ": nothing packed");
  const fp::UnitView view = fp::row_units(t.data(), row_stride, row_bytes, plan.unit_rows);
  fp::DeviceSpec dev = small_device(1, 2);
  dev.tile_budget = tile_budget;
  std::vector<fp::Launch> launches = fp::gpu_row_launches(&view, 1, plan, plan.index.data(), dev);
  for (auto& l : launches) l.threads = threads;
  std::vector<std::vector<uint8_t>> scratch;
  run_launches(launches, scratch, 3);
  const bool two = !launches.empty() && launches.back().stages == 2;
  report(t.buf == expected, "rows two stages " + name + " rows=" + std::to_string(perm.size()) +
                                " bytes=" + std::to_string(row_bytes) +
                                " threads=" + std::to_string(threads) + (two ? "" : " (planned one stage)"));
  return two;
}

// Columns: in place or out of place, elements of `esize` bytes; in place
// rows too wide for a tile buffer go through the row plan over column blocks.
// Out of place, the destination sits at `dst_offset`, by default 1-4 bytes
// off the source's alignment: the vector width must follow both addresses
// (a store checks it); an aligned one gives 16-byte vectors.
int staged_two_stage_runs = 0;  // check_cols runs that asked for two staged stages and got them

// col_stages 2: staged tiles through two buffers where the launch allows it
// (V = 16), as FLASHMLA_PERM_COL_STAGES=2 plans them on a GPU.
void check_cols(const std::vector<int64_t>& perm, int64_t esize, int64_t rows, int64_t offset, bool in_place,
                int threads, const std::string& name, int64_t dst_offset = -1, int col_stages = 1) {
  const int64_t row_bytes = static_cast<int64_t>(perm.size()) * esize;
  Rows src(rows, row_bytes, row_bytes + (offset % 3) * 16, offset);
  const Rows dst_rows(rows, row_bytes, src.row_stride,
                      dst_offset >= 0 ? dst_offset : offset + 1 + offset % 4);
  Rows dst = in_place ? src : dst_rows;
  const std::vector<uint8_t> expected = src.cols_gathered(perm, esize, src.buf, dst.buf, dst.offset);
  const fp::ColPlan plan = fp::make_col_plan(perm, esize);
  std::vector<fp::Launch> launches;
  fp::RowPlan units;
  const fp::ColView view = fp::col_rows(in_place ? dst.data() : src.data(), dst.data(), rows, src.row_stride,
                                        src.row_stride, row_bytes);
  if (in_place && !fp::gpu_cols_staged_fit(view)) {
    units = fp::make_row_plan(perm);
    const fp::UnitView uv = fp::unit_views(dst.data(), {static_cast<int64_t>(perm.size()), esize},
                                           units.unit_rows, {{rows, src.row_stride}}, esize)
                                .front();
    launches = fp::gpu_row_launches(&uv, 1, units, units.index.data(), small_device());
  } else {
    const fp::ColPlan* plans[] = {&plan};
    const int32_t* offsets[] = {plan.source_offset.data()};
    launches = fp::gpu_col_launches(&view, plans, offsets, 1, small_device(col_stages));
  }
  for (auto& l : launches) l.threads = threads;
  std::vector<std::vector<uint8_t>> scratch;
  run_launches(launches, scratch, 3);
  const int stages = launches.empty() ? 1 : launches.front().stages;
  if (col_stages > 1 && stages > 1) ++staged_two_stage_runs;  // all but the 8-byte aligned case
  report(dst.buf == expected, "cols " + name + (in_place ? " in place" : " out of place") +
                                  " cols=" + std::to_string(perm.size()) + " esize=" + std::to_string(esize) +
                                  " threads=" + std::to_string(threads) + (stages > 1 ? " two stages" : ""));
}

// Two out-of-place jobs in one launch, both gathered in the stage loop at
// V = 16: two stages over each job's tiles, the grid split between the jobs
// as the direct kernel splits it.
void check_two_direct_jobs(int threads) {
  const std::vector<int64_t> pa = fp::o_fused_permutation(4, 1024), pb = fp::q_fused_permutation(16, 64);
  Rows a(37, 4096, 4096, 0), b(29, 2048, 2048 + 32, 16);  // bf16 rows of 16 heads x 64
  Rows da(37, 4096, 4096, 16), db(29, 2048, 2048 + 32, 0);
  const auto ea = a.cols_gathered(pa, 1, a.buf, da.buf, da.offset);
  const auto eb = b.cols_gathered(pb, 2, b.buf, db.buf, db.offset);
  const fp::ColPlan plan_a = fp::make_col_plan(pa, 1), plan_b = fp::make_col_plan(pb, 2);
  const fp::ColView views[] = {fp::col_rows(a.data(), da.data(), 37, 4096, 4096, 4096),
                               fp::col_rows(b.data(), db.data(), 29, b.row_stride, db.row_stride, 2048)};
  const fp::ColPlan* plans[] = {&plan_a, &plan_b};
  const int32_t* offsets[] = {plan_a.source_offset.data(), plan_b.source_offset.data()};
  std::vector<fp::Launch> launches = fp::gpu_col_launches(views, plans, offsets, 2, small_device());
  for (auto& l : launches) l.threads = threads;
  std::vector<std::vector<uint8_t>> scratch;
  run_launches(launches, scratch, 3);
  report(launches.size() == 1 && launches[0].stages == 2 && da.buf == ea && db.buf == eb,
         "cols two direct jobs, two stages, threads=" + std::to_string(threads));
}

// A launch of a big and a tiny in-place column job, either first, on the
// small device's 4 CTAs: the tiny one's share of the grid by its work rounds
// to no CTA, and launch.cpp split_grid still gives it one (each CTA runs one
// job's tiles, so a job without a CTA would never move).
void check_grid_split(int threads) {
  const std::vector<int64_t> perm = fp::o_fused_permutation(4, 1024);
  const fp::ColPlan plan = fp::make_col_plan(perm, 1);
  for (bool big_first : {true, false}) {
    Rows big(64, 4096, 4096, 0), tiny(1, 4096, 4096, 16);
    const auto eb = big.cols_gathered(perm, 1, big.buf, big.buf),
               et = tiny.cols_gathered(perm, 1, tiny.buf, tiny.buf);
    const fp::ColView vb = fp::col_rows(big.data(), big.data(), 64, 4096, 4096, 4096);
    const fp::ColView vt = fp::col_rows(tiny.data(), tiny.data(), 1, 4096, 4096, 4096);
    const fp::ColView views[] = {big_first ? vb : vt, big_first ? vt : vb};
    const fp::ColPlan* plans[] = {&plan, &plan};
    const int32_t* offsets[] = {plan.source_offset.data(), plan.source_offset.data()};
    std::vector<fp::Launch> launches = fp::gpu_col_launches(views, plans, offsets, 2, small_device());
    for (auto& l : launches) l.threads = threads;
    std::vector<std::vector<uint8_t>> scratch;
    run_launches(launches, scratch, 3);
    const bool split =
        launches.size() == 1 && launches[0].grid == 4 && launches[0].first_ctas == (big_first ? 3 : 1);
    report(split && big.buf == eb && tiny.buf == et, std::string("cols grid split, the tiny job ") +
                                                         (big_first ? "second" : "first") +
                                                         " threads=" + std::to_string(threads));
  }
}

// ---------------------------------------------------------------------------
// Random strided layouts: both engines on the views csrc/strided.h makes.

// A strided tensor in a random buffer: logical dims outer first, pitches in
// bytes, at byte `offset`; bytes the view does not cover must stay put.
struct Strided {
  std::vector<int64_t> size, pitch;
  int64_t esize = 1, offset = 0;
  std::vector<uint8_t> buf;
  uint8_t* data() { return buf.data() + offset; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t x : size) n *= x;
    return n;
  }
  // Byte offset (from data()) of element `linear` (row-major), and of the
  // same element with index `value` along dim `d`.
  int64_t at(int64_t linear, int d = -1, int64_t value = 0) const {
    int64_t off = 0;
    for (int i = static_cast<int>(size.size()) - 1; i >= 0; --i) {
      const int64_t idx = linear % size[i];
      linear /= size[i];
      off += (i == d ? value : idx) * pitch[i];
    }
    return off;
  }
  int64_t index(int64_t linear, int d) const {
    for (int i = static_cast<int>(size.size()) - 1; i > d; --i) linear /= size[i];
    return linear % size[d];
  }
  // Every dim but d, innermost first (as layout.cpp's dims_except).
  std::vector<fp::Dim> others(int d) const {
    std::vector<fp::Dim> o;
    for (int i = static_cast<int>(size.size()) - 1; i >= 0; --i)
      if (i != d) o.push_back({size[i], pitch[i]});
    return o;
  }
};

// Rank-r layout: random sizes (some 1), a random memory order of the dims,
// steps and padding between them, a random offset.
// `order`: the dims innermost (in memory) first; `step`: the innermost pitch
// in elements (2: a stepped slice); `align` > 0: every outer pitch a
// multiple of it (padding in whole `align`s) and no offset.
Strided strided_of(std::vector<int64_t> sizes, int64_t esize, const std::vector<int>& order, int64_t step,
                   int64_t align = 0) {
  Strided t;
  t.esize = esize;
  t.size = std::move(sizes);
  t.pitch.resize(t.size.size());
  int64_t pitch = esize * step;
  int64_t span = 0;
  for (int d : order) {
    t.pitch[d] = pitch;
    span = (t.size[d] - 1) * pitch + std::max(span, esize);
    pitch = align ? (span + align - 1) / align * align + align * static_cast<int64_t>(rng() % 2)
                  : span + esize * static_cast<int64_t>(rng() % 3);  // padding
  }
  t.offset = align ? 0 : esize * static_cast<int64_t>(rng() % 5);
  t.buf = random_bytes(t.offset + span + 16);
  return t;
}

Strided random_strided(int rank, int64_t esize) {
  std::vector<int64_t> sizes(rank);
  const int64_t most = rank > 4 ? 4 : 9;  // ranks 5 and 6: more line dims than a Lines holds
  for (auto& x : sizes) x = 1 + static_cast<int64_t>(rng() % most);
  std::vector<int> order(rank);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  return strided_of(std::move(sizes), esize, order, rng() % 4 == 0 ? 2 : 1);  // stepped now and then
}

// The reference: dim d gathered by perm, element by element.
std::vector<uint8_t> gathered(const Strided& t, int d, const std::vector<int64_t>& perm) {
  std::vector<uint8_t> e = t.buf;
  for (int64_t i = 0; i < t.numel(); ++i)
    std::memcpy(&e[t.offset + t.at(i)], &t.buf[t.offset + t.at(i, d, perm[t.index(i, d)])], t.esize);
  return e;
}

// Views of up to kMaxJobs per launch, in order, on the small device, with
// the row stages a GPU plans by default (two where every tile is one pass).
int row_view_two_stage_launches = 0;  // of those, launches planned with two
void run_row_views(const std::vector<fp::UnitView>& views, const fp::RowPlan& plan, int threads) {
  for (size_t k = 0; k < views.size(); k += fp::kMaxJobs) {
    const int n = static_cast<int>(std::min<size_t>(fp::kMaxJobs, views.size() - k));
    auto launches = fp::gpu_row_launches(views.data() + k, n, plan, plan.index.data(),
                                         small_device(1, fp::DeviceSpec{}.row_stages));
    for (auto& l : launches) l.threads = threads;
    if (!launches.empty() && launches.back().stages == 2) ++row_view_two_stage_launches;
    std::vector<std::vector<uint8_t>> scratch;
    run_launches(launches, scratch, 3);
  }
}

void run_col_views(const std::vector<fp::ColView>& views, const fp::ColPlan& plan, int threads) {
  for (const fp::ColView& v : views) {
    const fp::ColPlan* plans[] = {&plan};
    const int32_t* offsets[] = {plan.source_offset.data()};
    auto launches = fp::gpu_col_launches(&v, plans, offsets, 1, small_device());
    for (auto& l : launches) l.threads = threads;
    std::vector<std::vector<uint8_t>> scratch;
    run_launches(launches, scratch, 3);
  }
}

void run_col_views_serial(const std::vector<fp::ColView>& views, const fp::ColPlan& plan) {
  for (const fp::ColView& v : views) run_cols_serial(v, plan);
}

// Rank 2-4 layouts whose lines are whole 16-byte vectors (the innermost dim
// 16-byte multiples, every pitch too, no offset): the row launches a GPU
// plans for them by default take two stages, over units of multi-dim lines,
// with cut cycles (short segments: the save pass and scratch tails) now and
// then. Each must plan two stages and give the gathered bytes.
void check_strided_two_stages(int threads, int trials) {
  for (int trial = 0; trial < trials; ++trial) {
    const int rank = 2 + static_cast<int>(rng() % 3);
    const int64_t esize = int64_t{1} << (rng() % 4);
    std::vector<int> order(rank);  // innermost first
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const int d = order[1 + rng() % (rank - 1)];  // not the innermost: lines of whole vectors
    std::vector<int64_t> sizes(rank);
    for (auto& x : sizes) x = 1 + static_cast<int64_t>(rng() % 9);
    sizes[order.front()] = 16 / esize * (1 + static_cast<int64_t>(rng() % 4));
    sizes[d] = std::max<int64_t>(sizes[d], 2);
    Strided t = strided_of(std::move(sizes), esize, order, 1, 16);
    const int64_t n = t.size[d];
    std::vector<int64_t> perm = random_perm(n);
    if (rng() % 2 || std::is_sorted(perm.begin(), perm.end())) perm = one_cycle(n);  // never the identity
    const std::vector<uint8_t> expected = gathered(t, d, perm);
    const fp::RowPlan plan = fp::make_row_plan(perm, rng() % 2 ? 4 : fp::kMaxSegment);
    const int before = row_view_two_stage_launches;
    const auto views = fp::unit_views(t.data(), {n, t.pitch[d]}, plan.unit_rows, t.others(d), esize);
    run_row_views(views, plan, threads);
    std::string what = "strided two stages rank=" + std::to_string(rank) + " dim=" + std::to_string(d) +
                       " esize=" + std::to_string(esize) + " threads=" + std::to_string(threads) +
                       " scratch=" + std::to_string(plan.num_scratch) + " sizes/pitches";
    for (int i = 0; i < rank; ++i) what += " " + std::to_string(t.size[i]) + "/" + std::to_string(t.pitch[i]);
    report(t.buf == expected, what);
    const int launches = static_cast<int>((views.size() + fp::kMaxJobs - 1) / fp::kMaxJobs);  // run_row_views
    report(row_view_two_stage_launches - before == launches, what + ": planned two stages");
  }
}

void check_strided(int threads, int trials, bool serial) {
  for (int trial = 0; trial < trials; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 6);
    const int64_t esize = int64_t{1} << (rng() % 4);
    const Strided base = random_strided(rank, esize);
    const int d = static_cast<int>(rng() % rank);
    const int64_t n = base.size[d];
    const std::vector<int64_t> perm = rng() % 3 == 0 ? one_cycle(n) : random_perm(n);
    const std::vector<uint8_t> expected = gathered(base, d, perm);
    // Now and then a tiny limit on the lines of a multi-dim view: the
    // outer dim cut into chunk views, as above 2^31 lines.
    const int64_t most = rng() % 3 == 0 ? 2 + static_cast<int64_t>(rng() % 20) : fp::kMaxMixedLines;
    std::string what = "strided rank=" + std::to_string(rank) + " dim=" + std::to_string(d) +
                       " esize=" + std::to_string(esize) + " threads=" + std::to_string(threads) +
                       " most=" + std::to_string(most) + " sizes/pitches";
    for (int i = 0; i < rank; ++i)
      what += " " + std::to_string(base.size[i]) + "/" + std::to_string(base.pitch[i]);

    Strided t = base;  // the row engine: any layout
    const fp::RowPlan rplan = fp::make_row_plan(perm, 4);  // short segments: scratch too
    run_row_views(fp::unit_views(t.data(), {n, t.pitch[d]}, rplan.unit_rows, t.others(d), esize, most), rplan,
                  threads);
    report(t.buf == expected, what + " rows");
    if (serial) {  // the CPU executor's form, its slices forced small
      Strided r = base;
      for (const fp::UnitView& v :
           fp::unit_views(r.data(), {n, r.pitch[d]}, rplan.unit_rows, r.others(d), esize, most))
        run_rows_serial(v, rplan, 1 + static_cast<int64_t>(rng() % 3),
                        esize * (1 + static_cast<int64_t>(rng() % 3)));
      report(r.buf == expected, what + " rows serial");
    }

    if (t.pitch[d] == esize) {  // the column engine: in place, and out of place
      const fp::ColPlan cplan = fp::make_col_plan(perm, esize);
      const int64_t rb = n * esize;
      for (bool serial_form : {false, true}) {
        if (serial_form && !serial) continue;
        const std::string form = serial_form ? " serial" : "";
        Strided c = base;
        const auto in_place = fp::col_views_in_place(c.data(), c.others(d), rb, rb, rb, most);
        serial_form ? run_col_views_serial(in_place, cplan) : run_col_views(in_place, cplan, threads);
        report(c.buf == expected, what + " cols in place" + form);
        if (d == rank - 1) {  // out of place rows: packed in the tensor's order
          Strided o = base;
          std::vector<uint8_t> out(o.numel() * esize + 16, 0x5A), want(out);
          for (int64_t i = 0; i < o.numel(); ++i)
            std::memcpy(&want[i * esize], &expected[o.offset + o.at(i)], esize);
          const auto views = fp::col_views_out(o.data(), out.data(), o.others(d), rb, most);
          serial_form ? run_col_views_serial(views, cplan) : run_col_views(views, cplan, threads);
          report(out == want && o.buf == base.buf, what + " cols out of place" + form);
        }
      }
    }
  }
}

// int32 words of four packed bytes, any strides: the bytes of each row of
// the last dim permuted (runs of 4 where the words are not contiguous).
void check_packed_words(int threads, int trials, bool serial) {
  for (int trial = 0; trial < trials; ++trial) {
    const int rank = 1 + static_cast<int>(rng() % 3);
    Strided t = random_strided(rank, 4);
    const int last = rank - 1;
    const int64_t row_bytes = 4 * t.size[last];
    const std::vector<int64_t> perm = random_perm(row_bytes);
    std::vector<uint8_t> expected = t.buf;
    const int64_t rows = t.numel() / t.size[last];
    auto byte_at = [&](int64_t row, int64_t b) {
      return t.offset + t.at(row * t.size[last]) + (b / 4) * t.pitch[last] + b % 4;
    };
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < row_bytes; ++b) expected[byte_at(r, b)] = t.buf[byte_at(r, perm[b])];
    const fp::ColPlan plan = fp::make_col_plan(perm, 1);
    const int64_t run = t.size[last] == 1 || t.pitch[last] == 4 ? row_bytes : 4;
    const std::string what = "packed words rank=" + std::to_string(rank) +
                             " words=" + std::to_string(t.size[last]) +
                             " pitch=" + std::to_string(t.pitch[last]);
    if (serial) {  // the CPU executor's form (runs of 4: pack, gather, unpack)
      Strided c = t;
      run_col_views_serial(fp::col_views_in_place(c.data(), c.others(last), row_bytes, run, t.pitch[last]),
                           plan);
      report(c.buf == expected, what + " serial");
    }
    run_col_views(fp::col_views_in_place(t.data(), t.others(last), row_bytes, run, t.pitch[last]), plan,
                  threads);
    report(t.buf == expected, what + " threads=" + std::to_string(threads));
  }
}

// Row cycles longer than a segment (kMaxSegment units: scratch), units of
// several lines, each line wider than a 128-byte GPU slice (so cut into
// slices): the path a transposed [200, 2, 409600] uint8 view permuted along
// dim 0 by one 200-cycle takes, at a size the harness affords. The GPU
// planner's own launches, then (`serial`) the CPU executor's tile form with
// its slices forced small (it slices only units over 512 KiB).
void check_long_cycles(int threads, int trials, bool serial) {
  for (int trial = 0; trial < trials; ++trial) {
    const int rank = 2 + static_cast<int>(rng() % 2);
    const int64_t esize = int64_t{1} << (rng() % 4);
    const int d = static_cast<int>(rng() % rank);
    std::vector<int64_t> sizes(rank);
    for (auto& x : sizes) x = 2 + static_cast<int64_t>(rng() % 3);
    sizes[d] = 65 + static_cast<int64_t>(rng() % 236);
    // Memory order: a dim other than d innermost, contiguous, its lines
    // 130-520 bytes wide.
    std::vector<int> order(rank);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    if (order.front() == d) std::swap(order.front(), order.back());
    sizes[order.front()] = (130 + static_cast<int64_t>(rng() % 391)) / esize + 1;
    const Strided base = strided_of(sizes, esize, order, 1);
    const int64_t n = sizes[d];
    const std::vector<int64_t> perm = rng() % 2 ? one_cycle(n) : with_long_cycle(n);
    const std::vector<uint8_t> expected = gathered(base, d, perm);
    std::string what = "long cycles rank=" + std::to_string(rank) + " dim=" + std::to_string(d) +
                       " esize=" + std::to_string(esize) + " sizes/pitches";
    for (int i = 0; i < rank; ++i)
      what += " " + std::to_string(base.size[i]) + "/" + std::to_string(base.pitch[i]);
    const fp::RowPlan plan = fp::make_row_plan(perm);
    if (plan.num_scratch == 0) {
      report(false, what + ": no cycle longer than a segment (the case lost its point)");
      continue;
    }
    Strided t = base;
    const auto views = fp::unit_views(t.data(), {n, t.pitch[d]}, plan.unit_rows, t.others(d), esize);
    run_row_views(views, plan, threads);
    report(t.buf == expected, what + " threads=" + std::to_string(threads));
    if (serial) {
      for (int64_t slice : {int64_t{0}, 16 * esize}) {
        Strided c = base;
        for (const fp::UnitView& v :
             fp::unit_views(c.data(), {n, c.pitch[d]}, plan.unit_rows, c.others(d), esize))
          run_rows_serial(v, plan, slice ? 2 : 0, slice);
        report(c.buf == expected, what + " serial slice=" + std::to_string(slice));
      }
    }
  }
}

// Short cycles packed into shared segments (every short cycle: pack_above
// 0), with segments of 4 to 64 units, passes of 1 to 70 positions (a pass
// that holds several cycles, or only part of one), rows of 1 to 4 lines.
void check_packed_cycles(int threads, int trials, bool serial) {
  for (int trial = 0; trial < trials; ++trial) {
    const int64_t max_segment = int64_t{4} << (rng() % 5);
    const int64_t n = 100 + static_cast<int64_t>(rng() % 500);
    const int64_t most = 2 + static_cast<int64_t>(rng() % std::min<int64_t>(40, max_segment / 2 - 1 + 1));
    std::vector<int64_t> perm = short_cycles(n, most);
    fp::RowPlan plan = fp::make_row_plan(perm, max_segment, 0);
    for (int again = 0; again < 4 && plan.num_packed == 0; ++again)  // the rest drawn first: all one cycle
      plan = fp::make_row_plan(perm = short_cycles(n, most), max_segment, 0);
    const int64_t bytes = 8 * (1 + static_cast<int64_t>(rng() % 40));
    const std::string name = "packed cycles seg=" + std::to_string(max_segment);
    if (plan.num_packed == 0) {
      report(false, name + ": nothing packed (the case lost its point)");
      continue;
    }
    check_rows(perm, bytes, bytes + 8 * static_cast<int64_t>(rng() % 3), static_cast<int64_t>(rng() % 8),
               threads, 0, 8 * (1 + static_cast<int64_t>(rng() % 8)), 1 + static_cast<int64_t>(rng() % 70),
               serial, name, max_segment, 0);
  }
}

// Plans keep no copy of perm: each must give it back exactly
// (permutation_of) and recognise it, and no other (applies).
void check_plans_give_back_perm() {
  std::vector<std::pair<std::string, std::vector<int64_t>>> perms = {
      {"random 1000", random_perm(1000)},
      {"one cycle 1000", one_cycle(1000)},
      {"with long cycle", with_long_cycle(300)},
      {"blocks 70x4", block_cycle(70, 4)},
      {"q 8x64", fp::q_fused_permutation(8, 64)},
      {"o 4x96", fp::o_fused_permutation(4, 96)},
      {"reversal", reversal(300)},
      {"identity", identity(50)},
      {"short cycles", short_cycles(400, 9)},
  };
  for (const auto& [name, perm] : perms) {
    const int64_t n = static_cast<int64_t>(perm.size());
    std::vector<int64_t> other = perm;
    std::swap(other[rng() % n], other[n - 1 - rng() % (n / 2)]);  // may swap an index with itself
    const bool differs = other != perm;
    for (int64_t pack_above : {fp::kPackCyclesAbove, int64_t{0}}) {  // short cycles packed too
      const fp::RowPlan rows = fp::make_row_plan(perm, 4, pack_above);  // short segments: cut cycles too
      report(fp::permutation_of(rows) == perm && fp::applies(rows, perm.data(), n) &&
                 fp::applies(rows, other.data(), n) != differs && !fp::applies(rows, perm.data(), n - 1),
             "row plan gives back " + name + (pack_above ? "" : " packed"));
    }
    for (int64_t esize : {1, 2, 8}) {
      const fp::ColPlan cols = fp::make_col_plan(perm, esize);
      report(fp::permutation_of(cols) == perm && fp::applies(cols, perm.data(), n) &&
                 fp::applies(cols, other.data(), n) != differs,
             "col plan (" + std::to_string(esize) + "-byte elements) gives back " + name);
    }
  }
}

// What a row plan must be whatever built it: segments of 1..max_segment
// units in their three kinds (cut segments of at least half a segment, so
// that scratch stays under 1/32 of the tensor; packed segments of whole
// cycles of their word's length; whole cycles), the array exactly sized, and
// the permutation given back.
bool plan_well_formed(const fp::RowPlan& p, const std::vector<int64_t>& perm, int64_t max_segment) {
  const int64_t words = p.num_scratch + p.num_packed;
  if (static_cast<int64_t>(p.index.size()) != p.moved + p.num_segments + 1 + words) return false;
  if (p.first()[0] != 0 || p.first()[p.num_segments] != p.moved) return false;
  const bool packs = p.num_packed > 0;
  for (int64_t s = 0; s < p.num_segments; ++s) {
    const int64_t len = p.length(s);
    if (len < 1 || len > max_segment) return false;
    if (s < p.num_scratch) {
      if (p.word()[s] < 0 || p.word()[s] >= p.num_scratch || 2 * len < max_segment) return false;
    } else if (s < words) {
      const int64_t c = p.word()[s];
      if (c < 2 || 2 * c > max_segment || len % c != 0) return false;
    } else if (len < 2 || (packs && 2 * len <= max_segment)) {
      return false;
    }
  }
  return fp::permutation_of(p) == perm;
}

// The plan builder's walks start at landmarks (units 0, L, 2L, ..., L a
// power of two from 64, more than 64 once there are over 16 Ki landmarks),
// and from the least unit of each cycle through none: permutations built
// against both, at sizes either side of where L doubles, units of 1 and of
// several rows.
void check_plan_builder() {
  auto cycle_through = [](const std::vector<int64_t>& order, std::vector<int64_t>& p) {
    for (size_t i = 0; i < order.size(); ++i) p[order[i]] = order[(i + 1) % order.size()];
  };
  auto landmark_free = [&](int64_t n, int64_t stride, bool landmarks_too) {
    // One cycle through every unit but the landmarks in random order, the
    // landmarks fixed (no walk from a landmark meets it) or one more cycle.
    std::vector<int64_t> p = identity(n), others, marks;
    for (int64_t u = 0; u < n; ++u) (u % stride ? others : marks).push_back(u);
    std::shuffle(others.begin(), others.end(), rng);
    cycle_through(others, p);
    if (landmarks_too) cycle_through(marks, p);
    return p;
  };
  auto shifted = [](int64_t n, int64_t by) {
    std::vector<int64_t> p(n);
    for (int64_t u = 0; u < n; ++u) p[u] = (u + by) % n;
    return p;
  };
  auto consecutive_cycles = [](int64_t n, int64_t len) {  // (0 1 .. len-1)(len ..) ...: least unit first
    std::vector<int64_t> p(n);
    for (int64_t u = 0; u < n; ++u) p[u] = (u % len == len - 1 || u == n - 1) ? u - u % len : u + 1;
    return p;
  };
  auto descending_cycles = [](int64_t n, int64_t len) {  // each walk meets a smaller unit at once
    std::vector<int64_t> p(n);
    for (int64_t u = 0; u < n; ++u) {
      const int64_t base = u - u % len, end = std::min(n, base + len);
      p[u] = u == base ? end - 1 : u - 1;
    }
    return p;
  };
  auto pairs = [](int64_t n) {
    std::vector<int64_t> order = random_perm(n), p = identity(n);
    for (int64_t i = 0; i + 1 < n; i += 2) std::swap(p[order[i]], p[order[i + 1]]);
    return p;
  };
  auto blocks = [](const std::vector<int64_t>& units, int64_t g) {
    std::vector<int64_t> p;
    for (int64_t x : units)
      for (int64_t i = 0; i < g; ++i) p.push_back(x * g + i);
    return p;
  };
  std::vector<std::pair<std::string, std::vector<int64_t>>> perms;
  for (int64_t n : {0, 1, 2, 3, 63, 64, 65, 129, 1000, 4099}) {
    const std::string at = " n=" + std::to_string(n);
    perms.push_back({"random" + at, random_perm(n)});
    perms.push_back({"one cycle" + at, one_cycle(n)});
    perms.push_back({"identity" + at, identity(n)});
    perms.push_back({"reversal" + at, reversal(n)});
    if (n < 2) continue;
    perms.push_back({"pairs" + at, pairs(n)});
    perms.push_back({"landmark-free cycle" + at, landmark_free(n, 64, false)});
    perms.push_back({"landmark-free cycle and landmarks" + at, landmark_free(n, 64, true)});
    perms.push_back({"shift by 64" + at, shifted(n, 64)});
    perms.push_back({"shift by 1" + at, shifted(n, 1)});
    perms.push_back({"consecutive 63-cycles" + at, consecutive_cycles(n, 63)});
    perms.push_back({"consecutive 200-cycles" + at, consecutive_cycles(n, 200)});
    perms.push_back({"descending 100-cycles" + at, descending_cycles(n, 100)});
    perms.push_back({"short cycles" + at, short_cycles(n, 9)});
    perms.push_back({"blocks of 3" + at, blocks(random_perm(n), 3)});
    perms.push_back({"blocks of 64, landmark-free" + at, blocks(landmark_free(n, 64, false), 64)});
  }
  // Landmarks 128 apart past 2^20 units: a cycle free of those but not of 64's.
  const int64_t big = (int64_t{1} << 20) + 4097;
  perms.push_back({"random n=2^20+4097", random_perm(big)});
  perms.push_back({"landmark-free (128) cycle n=2^20+4097", landmark_free(big, 128, false)});
  perms.push_back({"pairs n=2^20+4097", pairs(big)});
  for (const auto& [name, perm] : perms) {
    const bool small = perm.size() < 10000;
    for (int64_t max_segment : {fp::kMaxSegment, int64_t{4}}) {
      for (int64_t pack_above : {fp::kPackCyclesAbove, int64_t{0}}) {
        if (!small && (max_segment != fp::kMaxSegment || pack_above == 0)) continue;
        for (int threads : {1, 2}) {
          if (small && threads == 2) continue;  // (a second thread only past kThreadedUnits units)
          const fp::RowPlan p = fp::make_row_plan(perm.data(), static_cast<int64_t>(perm.size()), max_segment,
                                                  pack_above, threads);
          report(plan_well_formed(p, perm, max_segment),
                 "row plan of " + name + " max_segment=" + std::to_string(max_segment) +
                     (pack_above ? "" : " packing every short cycle") +
                     " threads=" + std::to_string(threads));
        }
      }
    }
  }
}

// FastDiv against the divide it replaces: small divisors with every n near
// their multiples, and random divisors and n below 2^31.
void check_fast_div() {
  bool ok = true;
  std::mt19937_64 draw(31);  // its own: the other cases' draws stay as they were
  auto check = [&](uint32_t d, uint32_t n) { ok = ok && fp::FastDiv(d).div(n) == n / d; };
  for (uint32_t d = 1; d <= 3000; ++d)
    for (uint32_t k : {0u, 1u, 2u, 7u, 1000u, (0x7FFFFFFFu / d) - 1, 0x7FFFFFFFu / d})
      for (uint32_t e = 0; e < 3 && k * d + e <= 0x7FFFFFFFu; ++e) {
        check(d, k * d + e);
        if (k * d >= 1 + e) check(d, k * d - 1 - e);
      }
  for (int t = 0; t < 200000; ++t) {
    const uint32_t d = 1 + static_cast<uint32_t>(draw() % 0x7FFFFFFFu);
    check(d, static_cast<uint32_t>(draw() % 0x80000000u));
    check(d, d - 1);
    check(d, d);
  }
  check(0x7FFFFFFFu, 0x7FFFFFFFu);
  report(ok, "FastDiv equals n / d for n < 2^31");
}

void stress(const std::vector<int>& thread_counts) {
  check_plans_give_back_perm();
  check_plan_builder();
  check_fast_div();
  for (int threads : thread_counts) {
    const bool serial = threads == thread_counts.front();  // the serial forms once
    // Row permutations: small slices and steps force several tiles per row
    // and several passes per segment.
    struct RowCase {
      std::string name;
      std::vector<int64_t> perm;
      int64_t bytes, stride_pad, offset, slice, step, lines = 0;
    };
    std::vector<RowCase> rc = {
        {"q 8x64", fp::q_fused_permutation(8, 64), 40, 0, 0, 16, 4},
        {"q 64x512", fp::q_fused_permutation(64, 512), 24, 8, 3, 128, 64},
        {"q 3x32", fp::q_fused_permutation(3, 32), 1000, 24, 1, 256, 2},
        {"random", random_perm(777), 37, 5, 7, 16, 4},
        {"one cycle 1000", one_cycle(1000), 16, 0, 0, 16, 3},
        {"one cycle 65", one_cycle(65), 48, 16, 16, 16, 64},
        {"one cycle 129", one_cycle(129), 8, 0, 2, 8, 1},
        {"reversal", reversal(300), 64, 0, 0, 32, 4},
        {"identity", identity(100), 32, 0, 0, 32, 4},
        {"blocks",
         [] {
           auto b = random_perm(40);
           std::vector<int64_t> p;
           for (auto x : b)
             for (int i = 0; i < 16; ++i) p.push_back(x * 16 + i);
           return p;
         }(),
         20, 4, 5, 16, 4},
        // Cycles over 64 units of 4 padded rows (4 lines each), lines cut
        // into 128-byte slices and units into 2-line slices: scratch read
        // line by line at a slice's column.
        {"block cycle 70x4", block_cycle(70, 4), 200, 8, 8, 128, 8, 2},
        {"block cycle 130x2", block_cycle(130, 2), 392, 8, 0, 128, 64},
    };
    for (auto& c : rc)
      check_rows(c.perm, c.bytes, c.bytes + c.stride_pad, c.offset, threads, c.lines, c.slice, c.step, serial,
                 c.name);
    struct ColCase {
      std::string name;
      std::vector<int64_t> perm;
      int64_t esize, rows, offset;
    };
    std::vector<ColCase> cc = {
        {"o 8x512", fp::o_fused_permutation(8, 512), 1, 9, 0},
        {"o chunks 8x512", fp::o_fused_chunk_permutation(8, 512), 1, 100, 0},
        {"q 16x64 bf16", fp::q_fused_permutation(16, 64), 2, 5, 6},
        {"o 4x96 fp32", fp::o_fused_permutation(4, 96), 4, 7, 1},
        {"random", random_perm(301), 1, 33, 3},
        {"reversal", reversal(64), 8, 10, 0},
        {"identity", identity(48), 2, 4, 0},
        {"wide q 64x512 bf16", fp::q_fused_permutation(64, 512), 2, 3, 0},  // 64 KiB rows
        {"wide random", random_perm(40000), 1, 2, 5},
    };
    for (auto& c : cc)
      for (bool in_place : {true, false})
        check_cols(c.perm, c.esize, c.rows, c.offset, in_place, threads, c.name);
    // Aligned rows and destinations, so the vectors are as wide as the layout
    // allows (an unaligned destination above takes 1-byte vectors). Gathered
    // slices (chunks of 16+ bytes gathered in the stage loop, V = 16):
    // staged in place with a short last tile, padded row pitches, chunks of
    // 16 to 64 bytes; direct out of place with rows cut into slices (a
    // narrower last one) or several rows a tile. Beside them, the other
    // gathers: from the staged rows (in place at V = 8; out of place with
    // rows that fit a tile) and from memory (rows wider than a tile).
    auto blocks = [](int64_t n, int64_t g) {
      std::vector<int64_t> p;
      for (int64_t b : random_perm(n))
        for (int64_t i = 0; i < g; ++i) p.push_back(b * g + i);
      return p;
    };
    struct AlignedCase {
      std::string name;
      std::vector<int64_t> perm;
      int64_t esize, rows, offset;
      bool in_place;
    };
    std::vector<AlignedCase> gc = {
        {"o 8x512, 10 rows", fp::o_fused_permutation(8, 512), 1, 10, 0, true},
        {"o 8x512, pitch +16", fp::o_fused_permutation(8, 512), 1, 10, 16, true},
        {"o 8x512, pitch +32", fp::o_fused_permutation(8, 512), 1, 11, 32, true},
        {"16-byte blocks", blocks(64, 16), 1, 13, 0, true},
        {"64-byte blocks", blocks(32, 64), 1, 13, 48, true},
        {"16-byte blocks bf16", blocks(100, 8), 2, 9, 0, true},
        {"wide random", random_perm(40000), 1, 3, 0, false},
        {"wide random bf16", random_perm(20000), 2, 3, 0, false},
        {"wide o 8x5024", fp::o_fused_permutation(8, 5024), 1, 3, 0, false},
        {"random fp32", random_perm(3000), 4, 7, 0, false},
        {"o 4x1024", fp::o_fused_permutation(4, 1024), 1, 23, 0, false},
        {"wide 32-byte blocks", blocks(1250, 32), 1, 3, 0, false},
        {"o 8x512, offset 8", fp::o_fused_permutation(8, 512), 1, 10, 8, true},
        {"random 1000, 40 rows", random_perm(1000), 1, 40, 0, false},
        {"o 4x1024, 61 rows", fp::o_fused_permutation(4, 1024), 1, 61, 0, false},  // 16 two-stage tiles
    };
    for (auto& c : gc)
      check_cols(c.perm, c.esize, c.rows, c.offset, c.in_place, threads, "aligned " + c.name, 16);
    // Staged tiles through two buffers (FLASHMLA_PERM_COL_STAGES=2): in place,
    // gathered in the stage loop (weights) and from the buffer (per-32 scales),
    // CTAs with several tiles on the small device.
    for (auto& c : gc)
      if (c.in_place)
        check_cols(c.perm, c.esize, 4 * c.rows, c.offset, true, threads, "aligned " + c.name, 16, 2);
    check_cols(fp::o_fused_chunk_permutation(8, 512), 1, 90, 0, true, threads, "aligned o chunks 8x16", 16,
               2);
    report(staged_two_stage_runs == 7,
           "staged two-stage launches planned: " + std::to_string(staged_two_stage_runs));
    staged_two_stage_runs = 0;
    // Row tiles through two buffers (FLASHMLA_PERM_ROW_STAGES=2): whole
    // cycles, packed short ones, cut ones (the save pass, scratch tails),
    // units of several lines; every CTA of the small device runs several.
    struct TwoStageRows {
      std::string name;
      std::vector<int64_t> perm;
      int64_t bytes, stride, pack_above = fp::kPackCyclesAbove;
    };
    const std::vector<TwoStageRows> tr = {
        {"q 8x64", fp::q_fused_permutation(8, 64), 48, 48},
        {"q 64x512", fp::q_fused_permutation(64, 512), 32, 32},
        {"short cycles, packed", packable_short_cycles(900, 9), 64, 64, 0},
        {"random", random_perm(777), 16, 16},
        {"one cycle 1000", one_cycle(1000), 32, 48},
        {"block cycle 70x4", block_cycle(70, 4), 208, 224},
    };
    int two_stage_rows = 0;
    for (const auto& c : tr)
      two_stage_rows += check_rows_two_stages(c.perm, c.bytes, c.stride, threads, c.name, c.pack_above);
    report(two_stage_rows == static_cast<int>(tr.size()),
           "row two-stage launches planned: " + std::to_string(two_stage_rows) + " of " +
               std::to_string(tr.size()));
    // Refused, planned with one stage, right bytes: 40-byte rows (V = 8);
    // 64-unit segments of 128-byte slices in 2 KiB buffers (several passes).
    const bool narrow = check_rows_two_stages(fp::q_fused_permutation(8, 64), 40, 48, threads, "V = 8");
    const bool passes = check_rows_two_stages(one_cycle(1000), 256, 256, threads, "several passes",
                                              fp::kPackCyclesAbove, 4096);
    report(!narrow && !passes, "row two stages refused where a tile is not one pass at V = 16");
    check_two_direct_jobs(threads);
    check_grid_split(threads);
    check_strided(threads, 40, serial);
    check_strided_two_stages(threads, 12);
    check_packed_words(threads, 10, serial);
    check_long_cycles(threads, 3, serial);
    check_packed_cycles(threads, 12, serial);
  }
  // The random layouts and long cycles ran the GPU's default row plan:
  // some of their launches must have taken two stages, or that plan went
  // untested here.
  report(row_view_two_stage_launches > 0,
         "random layouts' row launches with two stages: " + std::to_string(row_view_two_stage_launches));
}

// ---------------------------------------------------------------------------
// The exact GPU launches for the model's tensors (H200 figures).

constexpr int64_t kHeads = 64, kHeadDim = 512, kQLora = 1280, kOLora = 1024, kGroups = 8;

void print_launch(const std::string& what, const fp::Launch& l) {
  std::printf("  %-22s %-10s grid %5lld  threads %d  smem %6lld  ctas/SM %d  tiles %6lld", what.c_str(),
              fp::kernel_name(l.kernel), static_cast<long long>(l.grid), l.threads,
              static_cast<long long>(l.smem_bytes), l.ctas_per_sm, static_cast<long long>(l.tiles));
  for (int j = 0; j < l.num_jobs; ++j)
    std::printf("  job%d: V=%d ctas=%lld tiles=%lld max_tile=%lld", j, l.vec(j),
                static_cast<long long>(j == 0 ? l.first_ctas : l.grid - l.first_ctas),
                static_cast<long long>(l.job_tiles(j)), static_cast<long long>(l.max_tile_bytes[j]));
  std::printf("\n");
}

// Launches whose CTAs per SM were held against CUDA's occupancy calculator.
int resident_checked = 0;

#ifdef FLASHMLA_PERM_HARNESS_OCCUPANCY
// CTAs of `kernel` per SM by CUDA's calculator on a part of compute capability
// `major`.0 with `dev`'s figures, capped as the executor caps them; -1 where
// the calculator refuses its input.
int cuda_ctas_per_sm(const fp::DeviceSpec& dev, int major, fp::Kernel kernel, int threads,
                     int64_t smem_bytes) {
  cudaOccDeviceProp prop;
  prop.computeMajor = major;
  prop.computeMinor = 0;
  prop.maxThreadsPerBlock = 1024;
  prop.maxThreadsPerMultiprocessor = dev.threads_per_sm;
  prop.regsPerBlock = dev.regs_per_sm;
  prop.regsPerMultiprocessor = dev.regs_per_sm;
  prop.warpSize = 32;
  prop.sharedMemPerBlock = 48 * 1024;
  prop.sharedMemPerMultiprocessor = static_cast<size_t>(dev.smem_per_sm);
  prop.numSms = dev.sm_count;
  prop.sharedMemPerBlockOptin = static_cast<size_t>(dev.smem_per_sm - dev.smem_reserved_per_cta);
  prop.reservedSharedMemPerBlock = static_cast<size_t>(dev.smem_reserved_per_cta);
  cudaOccDeviceState state;
  state.carveoutConfig = SHAREDMEM_CARVEOUT_MAX_SHARED;  // the executor's cudaSharedmemCarveoutMaxShared
  cudaOccFuncAttributes attr;
  attr.maxThreadsPerBlock = fp::kGpuThreads;  // __launch_bounds__
  attr.numRegs = dev.regs[static_cast<int>(kernel)];
  attr.sharedSizeBytes = 0;  // dynamic shared memory only
  attr.maxDynamicSharedSizeBytes = 48 * 1024;
  attr.numBlockBarriers = 1;
  cudaOccResult r;
  if (cudaOccMaxActiveBlocksPerMultiprocessor(&r, &prop, &attr, &state, threads,
                                              static_cast<size_t>(smem_bytes)) != CUDA_OCC_SUCCESS)
    return -1;
  return std::min(r.activeBlocksPerMultiprocessor, dev.max_ctas_per_sm);
}
#endif

// Each launch's CTAs per SM (launch.cpp ctas_per_sm) against the CUDA
// toolkit's occupancy calculator (cuda_occupancy.h: what
// cudaOccupancyMaxActiveBlocksPerMultiprocessor computes) for an sm_90 part
// with `dev`'s figures and registers, and the carveout the executor asks for
// (the most shared memory): the same count, or a grid of SMs x ctas_per_sm
// is not one wave. Whether the driver grants that carveout is the device's
// to say (tests/test_cuda_runtime.py asks the runtime there).
bool resident_as_cuda_counts(const std::string& what, const std::vector<fp::Launch>& launches,
                             const fp::DeviceSpec& dev) {
#ifdef FLASHMLA_PERM_HARNESS_OCCUPANCY
  for (const fp::Launch& l : launches) {
    const int cuda = cuda_ctas_per_sm(dev, 9, l.kernel, l.threads, l.smem_bytes);
    if (cuda != l.ctas_per_sm) {
      std::printf("FAIL %s: %s planned %d CTAs per SM, CUDA's occupancy calculator gives %d\n", what.c_str(),
                  fp::kernel_name(l.kernel), l.ctas_per_sm, cuda);
      return false;
    }
    ++resident_checked;
  }
#else
  (void)what, (void)launches, (void)dev;
#endif
  return true;
}

// ctas_per_sm where each limit binds in turn (in the model's launches the
// registers do), on an sm_90 part (228 KiB per SM) and an sm_80 one (164 KiB),
// against CUDA's calculator: registers 16 to 255, dynamic shared memory up
// to the 48 KiB a launch may ask without opting in, capped or not.
void check_ctas_per_sm_grid() {
#ifdef FLASHMLA_PERM_HARNESS_OCCUPANCY
  int wrong = 0, points = 0;
  for (const auto& [major, smem_per_sm] : {std::pair<int, int64_t>{9, 228 * 1024}, {8, 164 * 1024}})
    for (int regs = 16; regs <= 255; regs += 7)
      for (int64_t smem : {0, 16, 1000, 4096, 10240, 12416, 16384, 20480, 26112, 30976, 32768, 40960, 49152})
        for (int cap : {32, 3}) {
          fp::DeviceSpec d;
          d.smem_per_sm = smem_per_sm;
          d.max_ctas_per_sm = cap;
          d.regs[static_cast<int>(fp::Kernel::kCols)] = regs;
          const int ours = fp::ctas_per_sm(d, fp::Kernel::kCols, fp::kGpuThreads, smem);
          const int cuda = cuda_ctas_per_sm(d, major, fp::Kernel::kCols, fp::kGpuThreads, smem);
          ++points;
          if (ours != cuda && wrong++ < 5)
            std::printf(
                "  sm_%d0, %d registers, %lld bytes of shared memory, at most %d: ours %d, CUDA's %d\n",
                major, regs, static_cast<long long>(smem), cap, ours, cuda);
        }
  report(wrong == 0, "ctas_per_sm as CUDA's occupancy calculator counts, " + std::to_string(points) +
                         " points (" + std::to_string(wrong) + " differ)");
#endif
}

// Prints a model op's launches; whether their CTAs per SM are CUDA's count.
bool show_launches(const std::string& what, const std::vector<fp::Launch>& launches,
                   const fp::DeviceSpec& dev) {
  for (const auto& l : launches) print_launch(what, l);
  return resident_as_cuda_counts(what, launches, dev);
}

// A device spec as the sweep's environment plans it, and its name.
struct Variant {
  int col_stages = 1;
  int64_t tile_budget = 0;
  int row_stages = fp::DeviceSpec{}.row_stages;  // the default plan's
  fp::DeviceSpec spec() const {
    fp::DeviceSpec d;
    d.col_stages = col_stages;
    d.tile_budget = tile_budget;
    d.row_stages = row_stages;
    return d;
  }
  std::string name() const {
    const bool rows_default = row_stages == fp::DeviceSpec{}.row_stages;
    return std::string(col_stages > 1 ? " col_stages 2" : "") +
           (rows_default ? "" : " row_stages " + std::to_string(row_stages)) +
           (tile_budget ? " budget " + std::to_string(tile_budget) : "");
  }
};

void model_wq_b(int tp, Variant variant = {}) {
  const int64_t heads = kHeads / tp, rows = heads * kHeadDim;
  const std::vector<int64_t> perm = fp::q_fused_permutation(heads, kHeadDim);
  Rows w(rows, kQLora, kQLora, 0), s(rows, kQLora / 32, kQLora / 32, 0);
  const auto ew = w.rows_gathered(perm), es = s.rows_gathered(perm);
  const fp::RowPlan plan = fp::make_row_plan(perm);
  const fp::UnitView views[] = {fp::row_units(w.data(), kQLora, kQLora, plan.unit_rows),
                                fp::row_units(s.data(), kQLora / 32, kQLora / 32, plan.unit_rows)};
  std::vector<fp::Launch> launches = fp::gpu_row_launches(views, 2, plan, plan.index.data(), variant.spec());
  const std::string name = "wq_b tp" + std::to_string(tp) + variant.name();
  const bool resident = show_launches(name, launches, variant.spec());
  std::vector<std::vector<uint8_t>> scratch;
  run_launches(launches, scratch, 2);
  // The default budget plans the stages asked for at every TP; a smaller
  // one may leave a tile several passes, which two stages refuse.
  const int stages = launches.empty() ? 0 : launches[0].stages;
  const bool stages_ok =
      variant.tile_budget ? stages >= 1 && stages <= variant.row_stages : stages == variant.row_stages;
  report(resident && launches.size() == 1 && stages_ok && w.buf == ew && s.buf == es, "model " + name);
}

void model_wo_a(int tp, Variant variant = {}) {
  const int64_t rows = kGroups / tp * kOLora, cols = 8 * kHeadDim;
  const std::vector<int64_t> wp = fp::o_fused_permutation(8, kHeadDim);
  const std::vector<int64_t> sp = fp::o_fused_chunk_permutation(8, kHeadDim);
  Rows w(rows, cols, cols, 0), s(rows, cols / 32, cols / 32, 0);
  const auto ew = w.cols_gathered(wp, 1, w.buf, w.buf), es = s.cols_gathered(sp, 1, s.buf, s.buf);
  const fp::ColPlan wplan = fp::make_col_plan(wp, 1), splan = fp::make_col_plan(sp, 1);
  const fp::ColView views[] = {fp::col_rows(w.data(), w.data(), rows, cols, cols, cols),
                               fp::col_rows(s.data(), s.data(), rows, cols / 32, cols / 32, cols / 32)};
  const fp::ColPlan* plans[] = {&wplan, &splan};
  const int32_t* offsets[] = {wplan.source_offset.data(), splan.source_offset.data()};
  std::vector<fp::Launch> launches = fp::gpu_col_launches(views, plans, offsets, 2, variant.spec());
  const std::string name = "wo_a tp" + std::to_string(tp) + variant.name();
  const bool resident = show_launches(name, launches, variant.spec());
  std::vector<std::vector<uint8_t>> scratch;
  run_launches(launches, scratch, 2);
  report(resident && launches.size() == 1 && launches[0].stages == variant.col_stages && w.buf == ew &&
             s.buf == es,
         "model " + name);
}

// DeepGEMM's packed scale: int32 [rows, K / 128] (gran 32), MN-major
// (strides (1, align4(rows))), permuted with the weight's rows in one launch.
void model_wq_b_packed(int tp) {
  const int64_t heads = kHeads / tp, rows = heads * kHeadDim, words = kQLora / 128, a = (rows + 3) / 4 * 4;
  const std::vector<int64_t> perm = fp::q_fused_permutation(heads, kHeadDim);
  Rows w(rows, kQLora, kQLora, 0);
  Strided s;
  s.size = {rows, words};
  s.pitch = {4, 4 * a};
  s.esize = 4;
  s.buf = random_bytes(4 * a * words + 16);
  const auto ew = w.rows_gathered(perm), es = gathered(s, 0, perm);
  const fp::RowPlan plan = fp::make_row_plan(perm);
  const fp::UnitView views[] = {
      fp::unit_views(w.data(), {rows, kQLora}, plan.unit_rows, {{kQLora, 1}}, 1).front(),
      fp::unit_views(s.data(), {rows, 4}, plan.unit_rows, s.others(0), 4).front()};
  std::vector<fp::Launch> launches =
      fp::gpu_row_launches(views, 2, plan, plan.index.data(), fp::DeviceSpec{});
  const bool resident = show_launches("wq_b packed tp" + std::to_string(tp), launches, fp::DeviceSpec{});
  std::vector<std::vector<uint8_t>> scratch;
  run_launches(launches, scratch, 2);
  report(resident && launches.size() == 1 && w.buf == ew && s.buf == es,
         "model wq_b packed MN-major scale tp" + std::to_string(tp));
}

// FlashMLA's wv: fp8 [n_groups, out, 8 * 512] and its packed scale int32
// [n_groups, out, 32] with stride(1) == 1 (storage [n_groups, 32, out]).
void model_wv_packed(int tp) {
  const int64_t groups = kGroups / tp, out = kOLora, cols = 8 * kHeadDim, words = cols / 128;
  const std::vector<int64_t> wp = fp::o_fused_permutation(8, kHeadDim);
  const std::vector<int64_t> sp = fp::o_fused_chunk_permutation(8, kHeadDim);
  Rows w(groups * out, cols, cols, 0);
  const auto ew = w.cols_gathered(wp, 1, w.buf, w.buf);
  Strided s;
  s.size = {groups, out, words};
  s.pitch = {4 * out * words, 4, 4 * out};
  s.esize = 4;
  s.buf = random_bytes(4 * groups * out * words + 16);
  std::vector<uint8_t> es = s.buf;
  for (int64_t r = 0; r < groups * out; ++r)
    for (int64_t b = 0; b < 4 * words; ++b) {
      auto at = [&](int64_t byte) { return s.at(r * words) + (byte / 4) * s.pitch[2] + byte % 4; };
      es[at(b)] = s.buf[at(sp[b])];
    }
  const fp::ColPlan wplan = fp::make_col_plan(wp, 1), splan = fp::make_col_plan(sp, 1);
  const fp::ColView views[] = {
      fp::col_views_in_place(w.data(), {{out, cols}, {groups, out * cols}}, cols, cols, cols).front(),
      fp::col_views_in_place(s.data(), s.others(2), 4 * words, 4, s.pitch[2]).front()};
  const fp::ColPlan* plans[] = {&wplan, &splan};
  const int32_t* offsets[] = {wplan.source_offset.data(), splan.source_offset.data()};
  std::vector<fp::Launch> launches = fp::gpu_col_launches(views, plans, offsets, 2, fp::DeviceSpec{});
  const bool resident = show_launches("wv packed tp" + std::to_string(tp), launches, fp::DeviceSpec{});
  std::vector<std::vector<uint8_t>> scratch;
  run_launches(launches, scratch, 2);
  report(resident && launches.size() == 1 && w.buf == ew && s.buf == es,
         "model wv packed scale tp" + std::to_string(tp));
}

void model_permute_q(int64_t heads, int64_t tokens) {
  const int64_t row_bytes = heads * kHeadDim * 2;  // bf16
  const std::vector<int64_t> perm = fp::q_fused_permutation(heads, kHeadDim);
  Rows src(tokens, row_bytes, row_bytes, 0), dst(tokens, row_bytes, row_bytes, 0);
  const auto expected = src.cols_gathered(perm, 2, src.buf, dst.buf);
  const fp::ColPlan plan = fp::make_col_plan(perm, 2);
  const fp::ColView view = fp::col_rows(src.data(), dst.data(), tokens, row_bytes, row_bytes, row_bytes);
  const fp::ColPlan* plans[] = {&plan};
  const int32_t* offsets[] = {plan.source_offset.data()};
  std::vector<fp::Launch> launches = fp::gpu_col_launches(&view, plans, offsets, 1, fp::DeviceSpec{});
  const bool resident = show_launches("permute_q h" + std::to_string(heads), launches, fp::DeviceSpec{});
  std::vector<std::vector<uint8_t>> scratch;
  run_launches(launches, scratch, 2);
  report(resident && launches.size() == 1 && dst.buf == expected,
         "model permute_q heads=" + std::to_string(heads));
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, model = false;
  for (int i = 1; i < argc; ++i) {
    quick |= std::string(argv[i]) == "--quick";
    model |= std::string(argv[i]) == "--model";
  }
  if (model) {
    check_ctas_per_sm_grid();
    // --quick (under TSan in CI): TP1 and TP4 take the code paths of TP2 and
    // TP8 with more tiles, and TP1 was half of the run's time.
    const std::vector<int> tps = quick ? std::vector<int>{2, 8} : std::vector<int>{1, 2, 4, 8};
    for (int tp : tps) model_wq_b(tp);
    for (int tp : tps) model_wo_a(tp);
    // The device check's sweep variants (FLASHMLA_PERM_COL_STAGES, _ROW_STAGES, _TILE_BUDGET):
    // every plan at TP8, and the two-stage wo_a at TP1 too (CTAs with three
    // tiles). TP1's small tiles only cost time here, under TSan in CI.
    for (int64_t budget : {8192, 16384}) model_wq_b(8, {1, budget});
    for (int64_t budget : {8192, 16384}) model_wq_b(8, {1, budget, 1});
    for (int tp : {2, 8}) model_wq_b(tp, {1, 0, 1});  // one stage (TP2: CTAs with three tiles)
    for (Variant v : {Variant{2, 0}, Variant{1, 8192}, Variant{1, 16384}, Variant{2, 16384}})
      model_wo_a(8, v);
    model_wo_a(1, {2, 0});
    for (int tp : {1, 8}) {
      if (quick && tp == 1) continue;
      model_wq_b_packed(tp);
      model_wv_packed(tp);
    }
    model_permute_q(64, 256);  // 1024 tiles on 792 CTAs: CTAs with two, through both buffers
    model_permute_q(128, 32);  // (more tokens only cost time, under TSan in CI)
  } else {
    // 40 and 100: a partial warp after whole ones (the row loops' Warp).
    stress(quick ? std::vector<int>{1, 7, 32, 40} : std::vector<int>{1, 2, 7, 32, 128, 40, 100});
  }
  if (misaligned) {
    std::printf("FAIL %d staged vectors misaligned for their width\n", misaligned);
    ++failures;
  }
  if (model) {
#ifdef FLASHMLA_PERM_HARNESS_OCCUPANCY
    std::printf("%d launches' CTAs per SM as CUDA's occupancy calculator counts them\n", resident_checked);
#else
    std::printf("NOTE CTAs per SM not held against CUDA's occupancy calculator: no cuda_occupancy.h\n");
#endif
  }
  std::printf("%d passed, %d failed\n", cases - failures, failures);
  return failures == 0 ? 0 : 1;
}
