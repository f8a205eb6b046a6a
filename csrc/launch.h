// Launch planning: which tiles, of what size, on how many CTAs. The one place
// that decides a GPU launch's configuration (grid, threads, shared memory,
// vector widths, steps, tiles) and a CPU run's tiling. Pure C++, no ATen and
// no CUDA: the CUDA launcher, the CPU executor, the host harness (which runs
// the very launches the GPU gets) and device/model.py (through the native
// module) all call it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "device_launch.h"
#include "plan.h"
#include "tile_bodies.h"

namespace flashmla_perm {

// Largest of 16, 8, 4, 2, 1 dividing every value (addresses, pitches, widths).
inline int vector_width(std::initializer_list<int64_t> values) {
  int64_t bits = 16;
  for (int64_t v : values) bits |= v;
  return static_cast<int>(bits & -bits);
}

enum class Kernel : int { kRows = 0, kSaveHeads = 1, kCols = 2 };
const char* kernel_name(Kernel k);

// What a launch is sized from. Defaults: an H200 with the registers NVRTC
// 13.0 gives the kernels for sm_90 (python -m flashmla_perm.images); the
// CUDA launcher fills in the real device's figures and the compiled
// kernels' registers, so the harness and the model see the GPU's launches.
struct DeviceSpec {
  int sm_count = 132;
  int64_t smem_per_sm = 228 * 1024;
  int64_t smem_reserved_per_cta = 1024;  // the runtime's own share per CTA
  int threads_per_sm = 2048;
  int regs_per_sm = 65536;
  int max_ctas_per_sm = 32;
  int regs[3] = {80, 64, 56};  // per thread, by Kernel (kCols: the larger of its two; sm_90)
  int col_stages = 1;  // tile buffers per CTA of staged column tiles cycles through: 1 or 2 (set_two_stages)
  // The same for row tiles (set_row_two_stages, where a launch allows it):
  // two by default, one with FLASHMLA_PERM_ROW_STAGES=1.
  int row_stages = 2;
  int64_t tile_budget = 0;  // bytes a row or staged column tile buffers; 0 (or over it): kGpuTileBudget
};

// GPU figures, kept here so that the harness and the model see what the GPU gets
// (kGpuThreads and kMaxJobs: device_launch.h).
// Tile buffer per CTA: under the 48 KiB that needs no opt-in, and small
// enough that several CTAs share an SM (each stages its whole tile at once).
constexpr int64_t kGpuTileBudget = 32 * 1024;
// What dev.tile_budget leaves of kGpuTileBudget (the device check's sweep
// plans smaller tiles through it: FLASHMLA_PERM_TILE_BUDGET).
inline int64_t tile_budget(const DeviceSpec& dev) {
  return dev.tile_budget > 0 && dev.tile_budget < kGpuTileBudget ? dev.tile_budget : kGpuTileBudget;
}
// Slices of rows are multiples of this, so that no 32-byte sector (nor
// 128-byte line) is split between two CTAs.
constexpr int64_t kGpuSliceAlign = 128;
// Direct (out-of-place) column tiles: destination bytes per tile.
constexpr int64_t kGpuDirectSlice = 16 * 1024;
static_assert(2 * kGpuDirectSlice <= kGpuTileBudget,
              "two direct tile buffers (set_two_stages) within the budget");

// A tensor seen as the units a row plan permutes (see RowJob).
struct UnitView {
  uint8_t* data;
  int64_t unit_stride;
  int64_t lines;
  Lines line_at;
  int64_t line_bytes;
};
// One dim of lines: count lines `pitch` bytes apart.
Lines lines_1d(int64_t count, int64_t pitch);
// Rows of a tensor (row r at data + r * row_stride, row_bytes contiguous),
// in units of unit_rows rows.
UnitView row_units(uint8_t* data, int64_t row_stride, int64_t row_bytes, int64_t unit_rows);

// rows x row_bytes logical bytes read from src and written gathered to dst
// (src == dst: in place); see ColJob for rows and runs.
struct ColView {
  const uint8_t* src;
  uint8_t* dst;
  Lines src_rows;
  Lines dst_rows;
  int64_t rows;
  int64_t row_bytes;
  int64_t run;
  int64_t run_pitch;
};
// Rows of contiguous bytes, a constant stride apart.
ColView col_rows(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t src_row_stride,
                 int64_t dst_row_stride, int64_t row_bytes);

// One kernel launch: up to kMaxJobs jobs sharing one grid, each CTA one
// job's: CTAs [0, first_ctas) job 0's tiles, the rest job 1's
// (device_launch.h cta_tiles; split_grid in launch.cpp says how many).
struct Launch {
  Kernel kernel = Kernel::kRows;
  int num_jobs = 0;
  RowJob rows[kMaxJobs] = {};  // kRows, kSaveHeads
  ColJob cols[kMaxJobs] = {};  // kCols
  int64_t scratch_bytes[kMaxJobs] = {};  // the caller allocates these and calls set_scratch
  // Figures for the performance model, per job.
  int64_t bytes[kMaxJobs] = {};  // bytes read (as many are written)
  int64_t max_tile_bytes[kMaxJobs] = {};  // the largest tile's bytes
  int64_t inflight_bytes[kMaxJobs] = {};  // loads one CTA has in flight at once, at most
  int64_t tiles = 0;
  int threads = kGpuThreads;
  int64_t smem_bytes = 0;
  int stages = 1;  // tile buffers per CTA cycles through (2: two_stage_loop, the jobs' stage_bytes apart)
  int ctas_per_sm = 0;
  int64_t grid = 0;
  int64_t first_ctas = 0;  // CTAs of job 0 (grid where one job)
  int64_t job_tiles(int j) const;
  int vec(int j) const;
};

// The kernels' parameter for a launch (csrc/cuda/kernels.cu): what the CUDA
// launcher passes, and what the host harness runs.
Jobs<RowJob> row_jobs(const Launch& l);  // kRows, kSaveHeads
Jobs<ColJob> col_jobs(const Launch& l);  // kCols

// A row job's slices: slice_lines x slice_bytes, the tile counts across a
// unit, and the divisors of its items' digits. p.vec must divide slice_bytes.
void set_row_slices(RowJob& p, int64_t slice_lines, int64_t slice_bytes);
// A GPU column job's items_div (csrc/tile_bodies.h ColJob), once its tiles are sized.
void set_col_items(ColJob& p);

// Scratch of job j (from its scratch_bytes) for every launch that uses it.
void set_scratch(std::vector<Launch>& launches, int job, uint8_t* scratch);

// GPU: a row plan applied to up to kMaxJobs tensors in one launch (after a
// save launch when the plan has scratch). `index` is the plan's array where
// the kernels read it.
std::vector<Launch> gpu_row_launches(const UnitView* views, int n, const RowPlan& plan, const int32_t* index,
                                     const DeviceSpec& dev);
// GPU: column gathers, up to kMaxJobs in one launch (staged and direct jobs
// go in launches of their own: they are different kernels). Rows of an
// in-place job must fit the tile buffer (gpu_cols_staged_fit); out of place,
// any width.
std::vector<Launch> gpu_col_launches(const ColView* views, const ColPlan* const* plans,
                                     const int32_t* const* offsets, int n, const DeviceSpec& dev);
bool gpu_cols_staged_fit(const ColView& view);

// Resident CTAs per SM for a kernel's launch of `threads` and shared memory.
int ctas_per_sm(const DeviceSpec& dev, Kernel kernel, int threads, int64_t smem_bytes);

// CPU: one thread per tile, step 1 (docs/design.md, "Order of the moves"). The
// tiles' buffers in flight at once stay within kCpuStagingBudget: a run
// stages at most that much, however many threads the machine has.
constexpr int64_t kCpuStagingBudget = 512 * 1024;
// The grain for at::parallel_for over `tiles` tiles of `buffer_bytes` each.
int64_t cpu_grain(int64_t tiles, int64_t buffer_bytes);
// Whether an in-place gather's row fits a CPU tile buffer (else: the row form).
bool cpu_cols_staged_fit(const ColView& view);
RowJob cpu_row_job(const UnitView& view, const RowPlan& plan, int64_t* buffer_bytes);
ColJob cpu_col_job(const ColView& view, const ColPlan& plan, int64_t* buffer_bytes);

}  // namespace flashmla_perm
