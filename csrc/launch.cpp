#include "launch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace flashmla_perm {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Row jobs with at least this many tiles keep one stage (FastDiv takes n < 2^31).
constexpr int64_t kTwoStageMaxTiles = int64_t{1} << 31;

// CPU tiling. Row tiles: one thread walks the chain straight from unit to
// unit and keeps only the first unit of a cycle in its buffer; slices cap
// that buffer for wide rows (four tiles in flight within kCpuStagingBudget).
constexpr int64_t kCpuRowBudget = kCpuStagingBudget / 4;
// Column tiles: the staged rows and the destination lines they are written
// back to both stay in a 32 KiB L1. Measured on the wo_a TP1 weight (4 KiB
// rows, 2 threads): 4 KiB tiles ran at 0.67x the time of a plain copy, 8 KiB
// at 0.75-0.78x, 16 KiB at 0.82-0.84x, 32 KiB at 0.77x.
constexpr int64_t kCpuColBudget = 4 * 1024;

// The pitches of lines that more than one line uses, OR-ed (for vector widths).
int64_t pitches_of(const Lines& at, int64_t count) {
  if (count <= 1) return 0;
  int64_t bits = 0;
  for (int i = 0; i < at.dims; ++i) bits |= at.pitch[i];
  return bits;
}

int64_t longest_segment(const RowPlan& plan) {
  int64_t longest = 0;
  for (int64_t s = 0; s < plan.num_segments; ++s) longest = std::max(longest, plan.length(s));
  return longest;
}

// `count` items cut into pieces of at most `most`, as even as possible, each
// a multiple of `align` (unless it is the whole; never more than the whole:
// a line narrower than `align` stays one piece).
int64_t even_piece(int64_t count, int64_t most, int64_t align) {
  if (count <= most) return count;
  most = std::max(align, most / align * align);
  return std::min(count, round_up(ceil_div(count, ceil_div(count, most)), align));
}

// `index`: the plan's array where the job reads it (host or device).
RowJob row_job(const UnitView& v, const RowPlan& plan, const int32_t* index, int64_t slice_lines,
               int64_t slice_bytes, int64_t step) {
  RowJob p{};
  p.data = v.data;
  p.unit_stride = v.unit_stride;
  p.lines = v.lines;
  p.line_at = v.line_at;
  p.line_bytes = v.line_bytes;
  p.order = index;
  p.first = index + plan.moved;
  p.tail = p.first + plan.num_segments + 1;
  p.num_scratch = plan.num_scratch;
  p.num_packed = plan.num_packed;
  p.scratch = nullptr;
  p.step = step;
  p.vec = vector_width({reinterpret_cast<int64_t>(v.data), v.unit_stride, pitches_of(v.line_at, v.lines),
                        v.line_bytes, slice_bytes});
  set_row_slices(p, slice_lines, slice_bytes);
  p.tiles = plan.num_segments * p.line_tiles * p.byte_tiles;
  p.head_tiles = plan.num_scratch * p.line_tiles * p.byte_tiles;
  return p;
}

// A column job's view and map; the caller sizes its tiles.
ColJob col_job(const ColView& v, const ColPlan& plan, const int32_t* offsets) {
  ColJob p{};
  p.src = v.src;
  p.dst = v.dst;
  p.src_rows = v.src_rows;
  p.dst_rows = v.dst_rows;
  p.rows = v.rows;
  p.row_bytes = v.row_bytes;
  p.run = v.run;
  p.run_pitch = v.run_pitch;
  p.source_offset = offsets;
  p.chunk_shift = plan.chunk_shift;
  return p;
}

// Rows of a staged tile whose buffer holds `budget` bytes: enough tiles for
// every SM twice over, each within the budget.
int64_t staged_tile_rows(int64_t rows, int64_t buf_pitch, int64_t budget, const DeviceSpec& dev) {
  return std::clamp<int64_t>(ceil_div(rows, 2 * int64_t{dev.sm_count}), 1,
                             std::max<int64_t>(1, budget / buf_pitch));
}

// Two tile buffers per CTA: it stages its next tile while it stores this one
// (two_stage_loop). The first device run found the kernels waiting on each
// tile's round trip (docs/performance.md, "What falls short and why"). For direct jobs that all gather in
// their stage loop (permute_q) always; for staged jobs (in place: the wo_a and
// wv weights and their scales) where dev.col_stages asks, each buffer half
// the budget, until a device run says which is faster. All of a launch's jobs
// or none, and V = 16 only: the loop at every width took the sm_80 build
// into spills.
void set_two_stages(Launch& l, const DeviceSpec& dev) {
  const bool staged = l.cols[0].staged;
  for (int j = 0; j < l.num_jobs; ++j) {
    const ColJob& p = l.cols[j];
    if (p.staged != staged || p.vec != 16) return;
    if (staged ? dev.col_stages < 2 || p.buf_pitch > tile_budget(dev) / 2 : !gathers_in_stage(p, 16, false))
      return;
  }
  int64_t buf = 0;
  for (int j = 0; j < l.num_jobs; ++j) {
    ColJob& p = l.cols[j];
    if (staged) {
      p.tile_rows = staged_tile_rows(p.rows, p.buf_pitch, tile_budget(dev) / 2, dev);
      p.tiles = ceil_div(p.rows, p.tile_rows);
      set_col_items(p);
      l.max_tile_bytes[j] = p.tile_rows * p.row_bytes;
      buf = std::max(buf, round_up(p.tile_rows * p.buf_pitch, 16));
    } else {
      buf = std::max(buf, round_up(p.tile_rows * p.slice_bytes, 16));
    }
    l.inflight_bytes[j] = 2 * l.max_tile_bytes[j];  // the next tile's loads while this one's land
  }
  for (int j = 0; j < l.num_jobs; ++j) l.cols[j].stage_bytes = buf;
  l.smem_bytes = 2 * buf;
  l.stages = 2;
}

// A tile's cost beyond its bytes, in bytes: its round trip. A CTA's share of
// the copy bandwidth moves about 23 KB in one memory latency (device/model.py's
// figures fitted to an H200: 4.07 TB/s, 4.55 us, over 132 SMs of 6 CTAs), and
// every tile, however small, waits at least one.
constexpr int64_t kTileRoundTripBytes = 16 * 1024;

// The CTAs of job 0 in a grid of `grid` (CTAs [0, first) run job 0's tiles,
// the rest job 1's: device_launch.h cta_tiles). In proportion to each job's
// work, counted as its bytes plus a round trip per tile, so that the busiest
// CTA of either job has about the work each had when every CTA took tiles of
// both jobs in turn. By bytes alone a scale's many small tiles would queue on
// a few CTAs (wq_b at TP2: 496 tiles of at most 1.25 KiB on 28 CTAs); by
// tiles alone a weight beside as many scale tiles would get half the grid.
// Each job with tiles gets a CTA, and none more CTAs than tiles (a CTA
// without a tile would hold its place on an SM for nothing).
int64_t split_grid(const Launch& l, int64_t grid) {
  if (l.num_jobs < 2) return grid;
  const int64_t t0 = l.job_tiles(0), t1 = l.job_tiles(1);
  const int64_t w0 = l.bytes[0] + t0 * kTileRoundTripBytes, w1 = l.bytes[1] + t1 * kTileRoundTripBytes;
  int64_t first = w0 + w1 > 0 ? static_cast<int64_t>(static_cast<double>(grid) * w0 / (w0 + w1) + 0.5) : grid;
  first = std::min(first, std::min(t0, grid - (t1 > 0 ? 1 : 0)));
  return std::max(first, std::max<int64_t>(t0 > 0 ? 1 : 0, grid - t1));
}

void finish(Launch& l, const DeviceSpec& dev) {
  l.tiles = 0;
  int busy = 0;  // jobs with tiles: each needs a CTA of its own
  for (int j = 0; j < l.num_jobs; ++j) {
    l.tiles += l.job_tiles(j);
    busy += l.job_tiles(j) > 0;
  }
  l.ctas_per_sm = ctas_per_sm(dev, l.kernel, l.threads, l.smem_bytes);
  l.grid = std::max<int64_t>(busy, std::min<int64_t>(l.tiles, int64_t{dev.sm_count} * l.ctas_per_sm));
  l.first_ctas = split_grid(l, l.grid);
}

}  // namespace

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kRows: return "rows";
    case Kernel::kSaveHeads: return "save_heads";
    default: return "cols";
  }
}

void set_row_slices(RowJob& p, int64_t slice_lines, int64_t slice_bytes) {
  p.slice_lines = slice_lines;
  p.slice_bytes = slice_bytes;
  p.line_tiles = ceil_div(p.lines, slice_lines);
  p.byte_tiles = ceil_div(p.line_bytes, slice_bytes);
  // The last slice of a line or of a unit's lines may be narrower.
  const int64_t last_bytes = p.line_bytes - (p.byte_tiles - 1) * slice_bytes;
  const int64_t last_lines = p.lines - (p.line_tiles - 1) * slice_lines;
  p.per_line_div[0] = FastDiv(static_cast<uint32_t>(std::max<int64_t>(1, slice_bytes / p.vec)));
  p.per_line_div[1] = FastDiv(static_cast<uint32_t>(std::max<int64_t>(1, last_bytes / p.vec)));
  p.lines_div[0] = FastDiv(static_cast<uint32_t>(std::max<int64_t>(1, slice_lines)));
  p.lines_div[1] = FastDiv(static_cast<uint32_t>(std::max<int64_t>(1, last_lines)));
  // A two-stage tile's place (set_row_two_stages plans them only for jobs
  // of under 2^31 tiles, so a unit's tiles number under that too).
  if (p.line_tiles * p.byte_tiles < kTwoStageMaxTiles) {
    p.seg_div = FastDiv(static_cast<uint32_t>(p.line_tiles * p.byte_tiles));
    p.byte_tiles_div = FastDiv(static_cast<uint32_t>(p.byte_tiles));
  }
}

Lines lines_1d(int64_t count, int64_t pitch) {
  Lines at{};
  at.dims = 1;
  at.size[0] = count;
  at.pitch[0] = pitch;
  set_line_divs(at);
  return at;
}

UnitView row_units(uint8_t* data, int64_t row_stride, int64_t row_bytes, int64_t unit_rows) {
  if (row_stride == row_bytes)  // contiguous rows: a unit is one line
    return UnitView{data, unit_rows * row_stride, 1, lines_1d(1, 0), unit_rows * row_bytes};
  return UnitView{data, unit_rows * row_stride, unit_rows, lines_1d(unit_rows, row_stride), row_bytes};
}

ColView col_rows(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t src_row_stride,
                 int64_t dst_row_stride, int64_t row_bytes) {
  return ColView{
      src,       dst,      lines_1d(rows, src_row_stride), lines_1d(rows, dst_row_stride), rows, row_bytes,
      row_bytes, row_bytes};
}

int64_t Launch::job_tiles(int j) const {
  if (kernel == Kernel::kCols) return cols[j].tiles;
  return kernel == Kernel::kRows ? rows[j].tiles : rows[j].head_tiles;
}

Jobs<RowJob> row_jobs(const Launch& l) {
  Jobs<RowJob> p{};
  for (int j = 0; j < l.num_jobs; ++j) p.job[j] = l.rows[j];
  p.first_ctas = static_cast<uint32_t>(l.first_ctas);
  return p;
}

Jobs<ColJob> col_jobs(const Launch& l) {
  Jobs<ColJob> p{};
  for (int j = 0; j < l.num_jobs; ++j) p.job[j] = l.cols[j];
  p.first_ctas = static_cast<uint32_t>(l.first_ctas);
  return p;
}

int Launch::vec(int j) const { return kernel == Kernel::kCols ? cols[j].vec : rows[j].vec; }

void set_scratch(std::vector<Launch>& launches, int job, uint8_t* scratch) {
  for (Launch& l : launches)
    if (l.kernel != Kernel::kCols && job < l.num_jobs) l.rows[job].scratch = scratch;
}

int ctas_per_sm(const DeviceSpec& dev, Kernel kernel, int threads, int64_t smem_bytes) {
  const int warps = (threads + 31) / 32;
  const int regs = dev.regs[static_cast<int>(kernel)];
  if (regs < 1 || threads < 1)  // a kernel that reports no registers is not one to plan for
    throw std::invalid_argument(std::string("flashmla_perm: cannot plan ") + kernel_name(kernel) + " with " +
                                std::to_string(regs) + " registers per thread and " +
                                std::to_string(threads) + " threads");
  const int regs_per_warp = (regs * 32 + 255) / 256 * 256;  // allocation unit: 256
  int n = std::min(dev.max_ctas_per_sm, dev.threads_per_sm / threads);
  n = std::min(n, dev.regs_per_sm / (regs_per_warp * warps));
  if (smem_bytes > 0) n = std::min<int64_t>(n, dev.smem_per_sm / (smem_bytes + dev.smem_reserved_per_cta));
  return std::max(n, 1);
}

namespace {

// The main row launch with tile buffers of `budget` bytes.
Launch row_launch(const UnitView* views, int n, const RowPlan& plan, const int32_t* index, int64_t budget,
                  const DeviceSpec& dev) {
  const int64_t max_len = longest_segment(plan);
  Launch main;
  main.kernel = Kernel::kRows;
  main.num_jobs = n;
  // The whole segment in one pass where it fits: narrow the byte slices
  // first (whole 128-byte lines), then the lines.
  auto fits = [&](int64_t lines, int64_t bytes) { return max_len * lines * bytes <= budget; };
  int64_t slice_lines[kMaxJobs], slice_bytes[kMaxJobs], tiles = 0;
  for (int j = 0; j < n; ++j) {
    const UnitView& v = views[j];
    int64_t lines = v.lines, bytes = v.line_bytes;
    if (!fits(lines, bytes))
      bytes = even_piece(v.line_bytes, std::max<int64_t>(1, budget / (max_len * lines)), kGpuSliceAlign);
    if (!fits(lines, bytes)) lines = even_piece(v.lines, std::max<int64_t>(1, budget / (max_len * bytes)), 1);
    slice_lines[j] = lines;
    slice_bytes[j] = bytes;
    tiles += plan.num_segments * ceil_div(v.lines, lines) * ceil_div(v.line_bytes, bytes);
  }
  for (int j = 0; j < n; ++j) {
    const UnitView& v = views[j];
    int64_t lines = slice_lines[j], bytes = slice_bytes[j];
    // A launch of few tiles (small shards): thinner slices, so that every SM
    // gets tiles (at least two per SM where the lines allow), every job's
    // cut by the factor the launch falls short by. Counted over the
    // launch's jobs: a scale beside its weight needs no tiles of its own,
    // and thin slices cost the row loops a line's setup for few vectors
    // (csrc/tile_bodies.h Warp: counted a job at a time, wq_b's scale went
    // to 16 vectors a line at TP1, 8 at TP4 and TP8).
    const int64_t want = 2 * int64_t{dev.sm_count};
    if (tiles < want && bytes > kGpuSliceAlign) {
      const int64_t slices = ceil_div(v.line_bytes, bytes) * ceil_div(want, tiles);
      bytes = std::min(bytes, even_piece(v.line_bytes, ceil_div(v.line_bytes, slices), kGpuSliceAlign));
    }
    const int64_t step = fits(lines, bytes) ? max_len : std::max<int64_t>(1, budget / (lines * bytes) - 1);
    main.rows[j] = row_job(v, plan, index, lines, bytes, step);
    const int64_t smem = row_tile_buffer_bytes(lines, bytes, step, max_len);
    main.smem_bytes = std::max(main.smem_bytes, smem);
    main.scratch_bytes[j] = plan.num_scratch * v.lines * v.line_bytes;
    main.bytes[j] = plan.moved * v.lines * v.line_bytes;
    main.max_tile_bytes[j] = std::min(max_len, step + 1) * lines * bytes;
    main.inflight_bytes[j] = smem;
  }
  return main;
}

// Two tile buffers of half the budget a CTA, where dev.row_stages asks (by
// default; FLASHMLA_PERM_ROW_STAGES=1 plans one, for the device check's
// sweep): the next tile's loads in flight while this one stores
// (two_stage_loop), as set_two_stages does for column tiles. With one, a
// CTA of two or three tiles (wq_b at TP1 and TP2) has nothing in flight
// while it stores, which the model fitted to the first device run puts at
// 13 % of wq_b's time at TP1 (docs/performance.md, "What falls short and why"). Only where every tile of
// every job is one pass (a pass's stores must follow its own loads), V = 16 (the kernel's two-stage loop is
// compiled for no other width) and the tiles number under 2^31 (their places by FastDiv: set_row_slices).
bool set_row_two_stages(Launch& main, const RowPlan& plan) {
  const int64_t max_len = longest_segment(plan);
  for (int j = 0; j < main.num_jobs; ++j) {
    const RowJob& p = main.rows[j];
    if (p.vec != 16 || p.step < max_len || p.tiles >= kTwoStageMaxTiles) return false;
  }
  const int64_t buf = round_up(main.smem_bytes, 16);
  for (int j = 0; j < main.num_jobs; ++j) {
    main.rows[j].stage_bytes = buf;
    main.inflight_bytes[j] *= 2;  // the next tile's loads while this one's land
  }
  main.smem_bytes = 2 * buf;
  main.stages = 2;
  return true;
}

}  // namespace

std::vector<Launch> gpu_row_launches(const UnitView* views, int n, const RowPlan& plan, const int32_t* index,
                                     const DeviceSpec& dev) {
  if (plan.num_segments == 0 || n == 0) return {};
  Launch main;
  if (dev.row_stages >= 2) {
    main = row_launch(views, n, plan, index, tile_budget(dev) / 2, dev);
    if (!set_row_two_stages(main, plan)) main = Launch{};
  }
  if (main.stages == 1) main = row_launch(views, n, plan, index, tile_budget(dev), dev);
  finish(main, dev);
  if (plan.num_scratch == 0) return {main};

  Launch save = main;
  save.kernel = Kernel::kSaveHeads;
  save.smem_bytes = 0;
  save.stages = 1;
  for (int j = 0; j < n; ++j) save.rows[j].stage_bytes = 0;
  for (int j = 0; j < n; ++j) {
    const RowJob& p = main.rows[j];
    save.bytes[j] = main.scratch_bytes[j];
    save.max_tile_bytes[j] = p.slice_lines * p.slice_bytes;
    save.inflight_bytes[j] =
        std::min<int64_t>(save.max_tile_bytes[j], int64_t{kBatch} * p.vec * save.threads);
  }
  finish(save, dev);
  return {save, main};
}

void set_col_items(ColJob& p) {
  auto at_least_1 = [](int64_t n) { return FastDiv(static_cast<uint32_t>(std::max<int64_t>(1, n))); };
  p.run_div = at_least_1(p.run);
  if (!p.staged) {  // by the vectors of a slice (rows cut into slices: one row a tile)
    p.items_div[0] = p.items_div[1] = at_least_1(p.slice_bytes / p.vec);
    // A direct tile holds at least 8 KiB of a row or of whole rows (a slice
    // of kGpuDirectSlice, or rows filling at least half of it), so 2^31
    // tiles would be 16 TiB: the tile index fits the FastDiv.
    p.row_tiles_div = at_least_1(p.row_tiles);
  } else if (p.run < p.row_bytes) {  // rows fastest: by the tile's rows; the last tile may have fewer
    p.items_div[0] = at_least_1(p.tile_rows);
    p.items_div[1] = at_least_1(p.rows - (p.tiles - 1) * p.tile_rows);
  } else {  // by the vectors of a row
    p.items_div[0] = p.items_div[1] = at_least_1(p.row_bytes / p.vec);
  }
}

// A staged tile holds whole rows (short runs: padded, see col_buf_pitch).
int64_t col_buf_pitch(int64_t row_bytes, int64_t run, int vec) {
  // Rows of short runs are staged rows-fastest: a pad of one vector puts
  // neighbouring rows in different shared-memory banks.
  return run < row_bytes ? row_bytes + vec : row_bytes;
}

bool gpu_cols_staged_fit(const ColView& v) { return col_buf_pitch(v.row_bytes, v.run, 16) <= kGpuTileBudget; }

std::vector<Launch> gpu_col_launches(const ColView* views, const ColPlan* const* plans,
                                     const int32_t* const* offsets, int n, const DeviceSpec& dev) {
  if (n == 0) return {};
  Launch l;
  l.kernel = Kernel::kCols;
  l.num_jobs = n;
  for (int j = 0; j < n; ++j) {
    const ColView& v = views[j];
    ColJob& p = l.cols[j];
    p = col_job(v, *plans[j], offsets[j]);
    // Chunks narrower than the vector are assembled from pieces: the vector
    // follows the addresses, not the chunks (a 1-byte scale gather still
    // stages and stores 16 bytes at a time).
    p.vec = vector_width({reinterpret_cast<int64_t>(v.src), reinterpret_cast<int64_t>(v.dst),
                          pitches_of(v.src_rows, v.rows), pitches_of(v.dst_rows, v.rows), v.row_bytes, v.run,
                          v.run < v.row_bytes ? v.run_pitch : 0});
    const int64_t chunk = int64_t{1} << p.chunk_shift;
    const bool in_place = v.src == v.dst;
    // Out of place, a destination vector with one contiguous source is
    // staged straight from it (direct); narrower chunks gather from a
    // staged row where the row fits.
    p.staged = in_place || v.run < v.row_bytes || (chunk < p.vec && gpu_cols_staged_fit(v));
    int64_t smem;
    if (p.staged) {
      // Enough tiles for every SM twice over, each at most the budget.
      p.buf_pitch = col_buf_pitch(v.row_bytes, v.run, p.vec);
      p.tile_rows = staged_tile_rows(v.rows, p.buf_pitch, tile_budget(dev), dev);
      p.slice_bytes = v.row_bytes;
      p.row_tiles = 1;
      smem = round_up(p.tile_rows * p.buf_pitch, 16);
      l.inflight_bytes[j] = p.tile_rows * v.row_bytes;
    } else {
      p.slice_bytes = std::min(v.row_bytes, kGpuDirectSlice);
      p.tile_rows = v.row_bytes >= kGpuDirectSlice ? 1 : std::max<int64_t>(1, kGpuDirectSlice / v.row_bytes);
      p.tile_rows = std::min(p.tile_rows, std::max<int64_t>(1, v.rows));
      p.row_tiles = ceil_div(v.row_bytes, p.slice_bytes);
      const bool gathered_stage = chunk >= p.vec;
      smem = gathered_stage ? p.tile_rows * p.slice_bytes : 0;
      l.inflight_bytes[j] = gathered_stage ? p.tile_rows * p.slice_bytes
                                           : std::min<int64_t>(p.tile_rows * p.slice_bytes,
                                                               int64_t{kBatch} * p.vec * l.threads);
    }
    p.tiles = ceil_div(v.rows, p.tile_rows) * p.row_tiles;
    set_col_items(p);
    l.smem_bytes = std::max(l.smem_bytes, smem);
    l.bytes[j] = v.rows * v.row_bytes;
    l.max_tile_bytes[j] = p.tile_rows * p.slice_bytes;
  }
  set_two_stages(l, dev);
  finish(l, dev);
  if (n == 2 && l.cols[0].staged != l.cols[1].staged) {
    std::vector<Launch> apart;
    for (int j = 0; j < 2; ++j) {
      const std::vector<Launch> one = gpu_col_launches(views + j, plans + j, offsets + j, 1, dev);
      apart.insert(apart.end(), one.begin(), one.end());
    }
    return apart;
  }
  return {l};
}

RowJob cpu_row_job(const UnitView& v, const RowPlan& plan, int64_t* buffer_bytes) {
  // Only the tail unit is buffered (step 1), so the budget bounds one slice.
  const int64_t bytes = even_piece(v.line_bytes, std::max<int64_t>(16, kCpuRowBudget / v.lines), 16);
  const int64_t lines = even_piece(v.lines, std::max<int64_t>(1, kCpuRowBudget / bytes), 1);
  RowJob p = row_job(v, plan, plan.index.data(), lines, bytes, 1);
  p.vec = 1;
  *buffer_bytes = lines * bytes;
  return p;
}

int64_t cpu_grain(int64_t tiles, int64_t buffer_bytes) {
  const int64_t at_once = std::max<int64_t>(1, kCpuStagingBudget / std::max<int64_t>(1, buffer_bytes));
  return std::max<int64_t>(1, ceil_div(tiles, at_once));  // at most at_once chunks, one thread each
}

// A tile stages at least one row (plus one more for rows of short runs).
bool cpu_cols_staged_fit(const ColView& v) {
  return (v.run < v.row_bytes ? 2 : 1) * v.row_bytes <= kCpuStagingBudget;
}

ColJob cpu_col_job(const ColView& v, const ColPlan& plan, int64_t* buffer_bytes) {
  ColJob p = col_job(v, plan, plan.source_offset.data());
  p.staged = 1;
  p.tile_rows =
      std::clamp<int64_t>(kCpuColBudget / std::max<int64_t>(1, v.row_bytes), 1, std::max<int64_t>(1, v.rows));
  p.slice_bytes = v.row_bytes;
  p.row_tiles = 1;
  p.tiles = ceil_div(v.rows, p.tile_rows);
  p.vec = 1 << plan.chunk_shift;  // host moves whole chunks (no alignment needed)
  p.buf_pitch = v.row_bytes;
  // Short runs gather each row into one more buffer row, then scatter it.
  *buffer_bytes = (p.tile_rows + (v.run < v.row_bytes ? 1 : 0)) * v.row_bytes;
  return p;
}

}  // namespace flashmla_perm
