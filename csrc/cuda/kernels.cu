// The CUDA kernels: three kernels (row segments, their save pass, column
// gathers; the last in a staged and a direct form), each a grid-stride loop
// over the tiles of up to two jobs, so a model op's weight and scale go in
// one launch. launch.h sizes everything; this file holds device code only.
//
// One source, two compilers, one way to run it: nvcc (-cubin) or NVRTC
// compiles it for each architecture, at install or at first use
// (docs/design.md, "Kernels: built at install, compiled at first use"), and
// the host loads the cubin and launches the kernels through the driver API
// (csrc/cuda/kernels.cpp) by their extern "C" names, the same whichever
// compiler built them. It includes nothing but csrc/device_launch.h (and
// through it tile_bodies.h and three standard headers, which NVRTC is given).
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

// Tile t of the launch: job 0's tiles first, then job 1's. Each job is read
// in place from the kernel's parameters (two inlined copies of the body): a
// copy selected at run time would hold the whole job in registers, and an
// indexed parameter would need a stack frame.
template <class Job, class TilesOf, class Body>
__device__ __forceinline__ void for_each_tile(const Jobs<Job>& p, TilesOf tiles_of, Body&& body) {
  const int64_t split = tiles_of(p.job[0]);
  const int64_t total = split + (p.num > 1 ? tiles_of(p.job[1]) : 0);
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    if (t < split)
      body(p.job[0], t);
    else
      body(p.job[1], t - split);
  }
}

struct AllTiles {
  template <class Job>
  __device__ int64_t operator()(const Job& j) const {
    return j.tiles;
  }
};
struct HeadTiles {
  __device__ int64_t operator()(const RowJob& j) const { return j.head_tiles; }
};

// Jobs planned with two tile buffers (stage_bytes: launch.cpp set_two_stages
// and set_row_two_stages) run the tiles of both through two_stage_loop;
// half(job, tile, buf, store) is one of a tile's two loops, at V = 16 (the
// launches plan two stages for no other width).
template <class Job, class Half>
__device__ __forceinline__ void two_stage_tiles(CudaCtx& ctx, const Jobs<Job>& p, uint8_t* smem, Half half) {
  const int64_t split = p.job[0].tiles;
  const int64_t total = split + (p.num > 1 ? p.job[1].tiles : 0);
  two_stage_loop(ctx, blockIdx.x, gridDim.x, total, smem, p.job[0].stage_bytes,
                 [&](int64_t t, uint8_t* buf, bool store) {
                   if (t < split)
                     half(p.job[0], t, buf, store);
                   else
                     half(p.job[1], t - split, buf, store);
                 });
}

// CTAs of kGpuThreads per SM each kernel's registers must leave room for
// (__launch_bounds__' second figure: ptxas then uses at most 64K / (this x
// 128) registers per thread, in steps of 8). With the thread count alone ptxas
// chose its own register target, and spilled to meet it (sm_90 and sm_100).
// Each is what the kernel needs on sm_90, so that every architecture gets
// the same budget: rows 80 (6 CTAs: all that 32 KiB tile buffers leave of
// 228 KiB of shared memory), save_heads 64 (no shared memory), cols 56.
constexpr int kRowsMinCtas = 6;
constexpr int kSaveHeadsMinCtas = 8;
constexpr int kColsMinCtas = 9;

// The kernels' bodies; the kernels themselves, below, are extern "C".
// Two stages where the device spec asks (FLASHMLA_PERM_ROW_STAGES).
__device__ __forceinline__ void rows_kernel(const Jobs<RowJob>& p) {
  extern __shared__ uint4 smem[];
  CudaCtx ctx;
  if (p.job[0].stage_bytes > 0) {
    two_stage_tiles(ctx, p, reinterpret_cast<uint8_t*>(smem),
                    [&](const RowJob& job, int64_t t, uint8_t* buf, bool store) {
                      row_segment_half<16>(ctx, job, t, buf, store);
                    });
    return;
  }
  for_each_tile(p, AllTiles{}, [&](const RowJob& job, int64_t tile) {
    with_vector_width(job.vec, [&](auto v) {
      row_segment_tile<decltype(v)::value>(ctx, job, tile, reinterpret_cast<uint8_t*>(smem));
    });
  });
}

__device__ __forceinline__ void save_heads_kernel(const Jobs<RowJob>& p) {
  CudaCtx ctx;
  for_each_tile(p, HeadTiles{}, [&](const RowJob& job, int64_t tile) {
    with_vector_width(job.vec, [&](auto v) { save_segment_head<decltype(v)::value>(ctx, job, tile); });
  });
}

// Half of a column tile at V = 16, for two_stage_loop.
template <bool kStaged>
__device__ __forceinline__ void col_half(CudaCtx& ctx, const ColJob& job, int64_t tile, uint8_t* buf,
                                         bool store) {
  if constexpr (kStaged)
    col_staged_half<16>(ctx, job, tile, buf, store);
  else
    col_direct_half<16>(ctx, job, tile, buf, store);
}

// Staged and direct tiles in kernels of their own (a launch's jobs are all
// one or the other): one body each keeps the registers down. Jobs planned
// with two tile buffers (stage_bytes, launch.cpp set_two_stages: direct
// tiles that gather in their stage loop; staged ones where the device spec
// asks, FLASHMLA_PERM_COL_STAGES) run two_stage_loop.
template <bool kStaged>
__device__ __forceinline__ void cols_kernel(const Jobs<ColJob>& p) {
  extern __shared__ uint4 smem[];
  CudaCtx ctx;
  if (p.job[0].stage_bytes > 0) {
    two_stage_tiles(ctx, p, reinterpret_cast<uint8_t*>(smem),
                    [&](const ColJob& job, int64_t t, uint8_t* buf, bool store) {
                      col_half<kStaged>(ctx, job, t, buf, store);
                    });
    return;
  }
  for_each_tile(p, AllTiles{}, [&](const ColJob& job, int64_t tile) {
    with_vector_width(job.vec, [&](auto v) {
      constexpr int V = decltype(v)::value;
      uint8_t* buf = reinterpret_cast<uint8_t*>(smem);
      if constexpr (kStaged)
        col_staged_tile<V>(ctx, job, tile, buf);
      else
        col_direct_tile<V>(ctx, job, tile, buf);
    });
  });
}

}  // namespace
}  // namespace flashmla_perm

// The entry points, by the names the host looks up (csrc/cuda/kernels.cpp's
// kKernelNames): unmangled, so the same for nvcc and NVRTC.
using flashmla_perm::ColJob;
using flashmla_perm::Jobs;
using flashmla_perm::RowJob;
extern "C" {
__global__ void __launch_bounds__(flashmla_perm::kGpuThreads, flashmla_perm::kRowsMinCtas)
    flashmla_perm_rows(Jobs<RowJob> p) {
  flashmla_perm::rows_kernel(p);
}
__global__ void __launch_bounds__(flashmla_perm::kGpuThreads, flashmla_perm::kSaveHeadsMinCtas)
    flashmla_perm_save_heads(Jobs<RowJob> p) {
  flashmla_perm::save_heads_kernel(p);
}
__global__ void __launch_bounds__(flashmla_perm::kGpuThreads, flashmla_perm::kColsMinCtas)
    flashmla_perm_cols_staged(Jobs<ColJob> p) {
  flashmla_perm::cols_kernel<true>(p);
}
__global__ void __launch_bounds__(flashmla_perm::kGpuThreads, flashmla_perm::kColsMinCtas)
    flashmla_perm_cols_direct(Jobs<ColJob> p) {
  flashmla_perm::cols_kernel<false>(p);
}
}
