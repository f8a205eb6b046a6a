// The CUDA kernels: three kernels (row segments, their save pass, column
// gathers; the last in a staged and a direct form), each taking up to two
// jobs, so a model op's weight and scale go in one launch: a CTA runs one
// job's tiles, grid-stride over that job's CTAs. launch.h sizes everything;
// this file holds device code only.
//
// torch's NVRTC compiles it at install, a cubin per architecture and a PTX
// image (csrc/cuda/build_kernels.py), and the host loads one and launches the
// kernels through the driver API (csrc/cuda/kernels.cpp) by their extern "C"
// names. It includes nothing but csrc/device_launch.h (and through it
// tile_bodies.h and three standard headers, which NVRTC is given).
#include "device_launch.h"

namespace flashmla_perm {
namespace {

struct CudaCtx {
  static constexpr bool kSerial = false;
  static constexpr bool kWholeWarps = true;  // kGpuThreads threads
  static_assert(kGpuThreads % kWarp == 0, "the row loops' Warp takes a CTA's warps as whole");
  __device__ int thread() const { return threadIdx.x; }
  __device__ int num_threads() const { return blockDim.x; }
  __device__ void sync() { __syncthreads(); }
  // 4, 8 and 16 bytes go global -> shared with cp.async (sm_80+): no
  // register holds them, so a thread can have its whole share of a tile in
  // flight. Narrower ones go through a register.
  template <int V>
  __device__ void stage(uint8_t* buf, const uint8_t* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (V >= 4) {
      const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(buf));
      if constexpr (V == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
      else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(src), "n"(V) : "memory");
      return;
    }
#endif
    *reinterpret_cast<typename VecOf<V>::type*>(buf) = load_vec<V>(src);
  }
  __device__ void stage_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
  }
  __device__ void stage_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
  }
  template <int N>
  __device__ void stage_wait_prior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
  }
};

// Each CTA runs the tiles of one job (device_launch.h cta_tiles: CTAs below
// p.first_ctas job 0's, the rest job 1's), grid-stride over that job's CTAs:
// first, first + stride, ... below its tile count. One copy of each body
// serves both jobs, which read their fields from the parameter in place
// (__grid_constant__, at the job's offset: constant loads, no copy). A copy
// of each body per job, reading its fields at constant offsets, took NVRTC
// 13-21 s of CPU per architecture; here a field a hot loop uses is a
// register, not an operand, so the loops' address math is leaner to make up
// for it (csrc/tile_bodies.h LinesFrom, FastDiv).
template <class Job>
struct CtaJob {
  const Job& job;
  CtaTiles tiles;
  __device__ CtaJob(const Jobs<Job>& p)
      : job(p.job[cta_tiles(blockIdx.x, gridDim.x, p.first_ctas).job]),
        tiles(cta_tiles(blockIdx.x, gridDim.x, p.first_ctas)) {}
  // body(tile) for each of the CTA's tiles below `total`, one stage.
  template <class Body>
  __device__ void each(int64_t total, Body&& body) const {
    for (int64_t t = tiles.first; t < total; t += tiles.stride) body(t);
  }
  // The same through two_stage_loop (two tile buffers, job.stage_bytes
  // apart: launch.cpp set_two_stages and set_row_two_stages plan them for
  // every job of a launch or none); half(tile, buf, store) is one of a
  // tile's two loops, at V = 16 (the launches plan two stages for no other
  // width).
  template <class Half>
  __device__ void two_stages(CudaCtx& ctx, uint8_t* smem, Half&& half) const {
    two_stage_loop(ctx, tiles.first, tiles.stride, job.tiles, smem, job.stage_bytes, half);
  }
};

// CTAs of kGpuThreads per SM each kernel's registers must leave room for
// (__launch_bounds__' second figure: ptxas then uses at most 64K / (this x
// 128) registers per thread, in steps of 8). With the thread count alone
// ptxas picks its own register target, and spills to meet it.
// Each is what the kernel needs on sm_90, so that every architecture gets
// the same budget: rows 80 (6 CTAs: all that 32 KiB tile buffers leave of
// 228 KiB of shared memory), save_heads 64 (no shared memory), cols 56.
constexpr int kSaveHeadsMinCtas = 8;
constexpr int kColsMinCtas = 9;
// NVRTC 12.8 spills at those figures on sm_100 (rows) and sm_120 (rows,
// staged cols), so with CUDA 12 those get more registers, which costs rows
// on sm_100 a CTA per SM. There rows get 88 (__maxnreg__, which cannot go
// with __launch_bounds__), not the 96 that 5 CTAs allow, to stay within
// 1.1x sm_90's. sm_120's 100 KiB of shared memory per SM holds only 3 CTAs
// of 32 KiB tiles anyway.
#if !defined(__CUDA_ARCH__) || __CUDACC_VER_MAJOR__ != 12 || __CUDA_ARCH__ < 1000
constexpr int kRowsMinCtas = 6;
constexpr int kColsStagedMinCtas = kColsMinCtas;
#define FLASHMLA_PERM_ROWS_BOUNDS __launch_bounds__(flashmla_perm::kGpuThreads, flashmla_perm::kRowsMinCtas)
#elif __CUDA_ARCH__ < 1200
constexpr int kRowsMaxRegs = 88;
constexpr int kColsStagedMinCtas = kColsMinCtas;
#define FLASHMLA_PERM_ROWS_BOUNDS __maxnreg__(flashmla_perm::kRowsMaxRegs)
#else
constexpr int kRowsMinCtas = 5;
constexpr int kColsStagedMinCtas = 7;
#define FLASHMLA_PERM_ROWS_BOUNDS __launch_bounds__(flashmla_perm::kGpuThreads, flashmla_perm::kRowsMinCtas)
#endif

// The kernels' bodies; the kernels themselves, below, are extern "C".
// Two stages where the device spec asks (FLASHMLA_PERM_ROW_STAGES).
__device__ __forceinline__ void rows_kernel(const Jobs<RowJob>& p) {
  extern __shared__ uint4 smem[];
  uint8_t* buf = reinterpret_cast<uint8_t*>(smem);
  CudaCtx ctx;
  const CtaJob<RowJob> c(p);
  if (p.job[0].stage_bytes > 0) {  // every job's (set_row_two_stages); job 0's at a constant offset
    c.two_stages(ctx, buf,
                 [&](int64_t t, uint8_t* b, bool store) { row_segment_half<16>(ctx, c.job, t, b, store); });
    return;
  }
  c.each(c.job.tiles, [&](int64_t t) {
    with_vector_width(c.job.vec, [&](auto v) { row_segment_tile<decltype(v)::value>(ctx, c.job, t, buf); });
  });
}

__device__ __forceinline__ void save_heads_kernel(const Jobs<RowJob>& p) {
  CudaCtx ctx;
  const CtaJob<RowJob> c(p);
  c.each(c.job.head_tiles, [&](int64_t t) {
    with_vector_width(c.job.vec, [&](auto v) { save_segment_head<decltype(v)::value>(ctx, c.job, t); });
  });
}

// Staged and direct tiles in kernels of their own (a launch's jobs are all
// one or the other): one body each keeps the registers down. Jobs that
// gather in their stage loop in launches planned with two tile buffers
// (tile_bodies.h col_two_stages) run two_stage_loop, the rest one stage.
template <bool kStaged>
__device__ __forceinline__ void cols_kernel(const Jobs<ColJob>& p) {
  extern __shared__ uint4 smem[];
  uint8_t* buf = reinterpret_cast<uint8_t*>(smem);
  CudaCtx ctx;
  const CtaJob<ColJob> c(p);
  if (col_two_stages(p.job[0].stage_bytes, c.job, kStaged)) {  // (job 0's: a constant offset)
    c.two_stages(ctx, buf, [&](int64_t t, uint8_t* b, bool store) {
      if constexpr (kStaged)
        col_staged_half<16>(ctx, c.job, t, b, store);
      else
        col_direct_half<16>(ctx, c.job, t, b, store);
    });
    return;
  }
  c.each(c.job.tiles, [&](int64_t t) {
    with_vector_width(c.job.vec, [&](auto v) {
      constexpr int V = decltype(v)::value;
      if constexpr (kStaged)
        col_staged_tile<V>(ctx, c.job, t, buf);
      else
        col_direct_tile<V>(ctx, c.job, t, buf);
    });
  });
}

}  // namespace
}  // namespace flashmla_perm

// The entry points, by the names the host looks up (csrc/cuda/kernels.cpp's
// kKernelNames): unmangled, so found by name in any image.
using flashmla_perm::ColJob;
using flashmla_perm::Jobs;
using flashmla_perm::RowJob;
extern "C" {
__global__ void FLASHMLA_PERM_ROWS_BOUNDS flashmla_perm_rows(const __grid_constant__ Jobs<RowJob> p) {
  flashmla_perm::rows_kernel(p);
}
__global__ void __launch_bounds__(flashmla_perm::kGpuThreads, flashmla_perm::kSaveHeadsMinCtas)
    flashmla_perm_save_heads(const __grid_constant__ Jobs<RowJob> p) {
  flashmla_perm::save_heads_kernel(p);
}
__global__ void __launch_bounds__(flashmla_perm::kGpuThreads, flashmla_perm::kColsStagedMinCtas)
    flashmla_perm_cols_staged(const __grid_constant__ Jobs<ColJob> p) {
  flashmla_perm::cols_kernel<true>(p);
}
__global__ void __launch_bounds__(flashmla_perm::kGpuThreads, flashmla_perm::kColsMinCtas)
    flashmla_perm_cols_direct(const __grid_constant__ Jobs<ColJob> p) {
  flashmla_perm::cols_kernel<false>(p);
}
}
