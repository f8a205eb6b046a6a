// CUDA executor: three kernels (row segments, their save pass, column
// gathers), each a grid-stride loop over the tiles of up to two jobs, so a
// model op's weight and scale go in one launch. launch.h sizes everything;
// this file only queries the device, allocates scratch and launches on the
// current stream.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <type_traits>

#include "executors.h"

namespace flashmla_perm {
namespace {

struct CudaCtx {
  static constexpr bool kSerial = false;
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

template <class Job>
struct Jobs {
  Job job[kMaxJobs];
  int num;
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
  __device__ int64_t operator()(const Job& j) const { return j.tiles; }
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

// Two stages where the device spec asks (FLASHMLA_PERM_ROW_STAGES).
__global__ void __launch_bounds__(kGpuThreads) flashmla_perm_rows(Jobs<RowJob> p) {
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

__global__ void __launch_bounds__(kGpuThreads) flashmla_perm_save_heads(Jobs<RowJob> p) {
  CudaCtx ctx;
  for_each_tile(p, HeadTiles{}, [&](const RowJob& job, int64_t tile) {
    with_vector_width(job.vec, [&](auto v) { save_segment_head<decltype(v)::value>(ctx, job, tile); });
  });
}

// Half of a column tile at V = 16, for two_stage_loop.
template <bool kStaged>
__device__ __forceinline__ void col_half(CudaCtx& ctx, const ColJob& job, int64_t tile, uint8_t* buf, bool store) {
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
__global__ void __launch_bounds__(kGpuThreads) flashmla_perm_cols(Jobs<ColJob> p) {
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

void launch(const Launch& l, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(l.grid)), block(static_cast<unsigned>(l.threads));
  if (l.kernel == Kernel::kCols) {
    Jobs<ColJob> p{{l.cols[0], l.cols[1]}, l.num_jobs};
    if (l.cols[0].staged)
      flashmla_perm_cols<true><<<grid, block, l.smem_bytes, stream>>>(p);
    else
      flashmla_perm_cols<false><<<grid, block, l.smem_bytes, stream>>>(p);
  } else {
    Jobs<RowJob> p{{l.rows[0], l.rows[1]}, l.num_jobs};
    if (l.kernel == Kernel::kRows)
      flashmla_perm_rows<<<grid, block, l.smem_bytes, stream>>>(p);
    else
      flashmla_perm_save_heads<<<grid, block, 0, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

// The device check's sweep (bench/gpu_check.py) plans launches other than
// the default through these, read with the device's figures, once a
// process: FLASHMLA_PERM_MAX_CTAS_PER_SM=n, at most n CTAs a SM (fewer bytes
// in flight, the same work: it tells the load latency a tile sees from the
// issue rate); FLASHMLA_PERM_COL_STAGES=2, two tile buffers a CTA for staged
// column tiles (the in-place wo_a and wv weights and their scales);
// FLASHMLA_PERM_ROW_STAGES=2, the same for row tiles of one pass (wq_b);
// FLASHMLA_PERM_TILE_BUDGET=bytes, smaller row and staged column tiles.
static int env_whole_number(const char* name, int lowest, int highest, int unset) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return unset;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  TORCH_CHECK(*end == '\0' && n >= lowest && n <= highest, name, " must be a whole number from ", lowest, " to ",
              highest, ", got '", text, "'");
  return static_cast<int>(n);
}

DeviceSpec cuda_device_spec(c10::Device device) {
  // Queried once per device: no driver call on the hot path.
  static std::mutex mu;
  static std::vector<std::pair<int, DeviceSpec>> specs;
  const int index = device.index();
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [i, s] : specs)
    if (i == index) return s;
  const c10::cuda::CUDAGuard guard(device);
  cudaDeviceProp prop;
  C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  DeviceSpec s;
  s.sm_count = prop.multiProcessorCount;
  s.smem_per_sm = static_cast<int64_t>(prop.sharedMemPerMultiprocessor);
  s.smem_reserved_per_cta = static_cast<int64_t>(prop.reservedSharedMemPerBlock);
  s.threads_per_sm = prop.maxThreadsPerMultiProcessor;
  s.regs_per_sm = prop.regsPerMultiprocessor;
  s.max_ctas_per_sm = std::min(prop.maxBlocksPerMultiProcessor,
                               env_whole_number("FLASHMLA_PERM_MAX_CTAS_PER_SM", 1, 1024, 1024));
  s.col_stages = env_whole_number("FLASHMLA_PERM_COL_STAGES", 1, 2, s.col_stages);
  s.row_stages = env_whole_number("FLASHMLA_PERM_ROW_STAGES", 1, 2, s.row_stages);
  s.tile_budget = env_whole_number("FLASHMLA_PERM_TILE_BUDGET", 1024, kGpuTileBudget, kGpuTileBudget);
  auto regs_of = [](const void* kernel) {
    // The plan counts on the whole shared memory per SM (wo_a: 6 CTAs of
    // 33 KiB), so ask for the largest carveout rather than the driver's guess.
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    cudaFuncAttributes attr;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return attr.numRegs;
  };
  s.regs[static_cast<int>(Kernel::kRows)] = regs_of(reinterpret_cast<const void*>(&flashmla_perm_rows));
  s.regs[static_cast<int>(Kernel::kSaveHeads)] =
      regs_of(reinterpret_cast<const void*>(&flashmla_perm_save_heads));
  s.regs[static_cast<int>(Kernel::kCols)] =
      std::max(regs_of(reinterpret_cast<const void*>(&flashmla_perm_cols<true>)),
               regs_of(reinterpret_cast<const void*>(&flashmla_perm_cols<false>)));
  specs.emplace_back(index, s);
  return s;
}

bool cuda_capturing(c10::Device device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()), &status));
  return status != cudaStreamCaptureStatusNone;
}

void run_cuda(std::vector<std::vector<Launch>> groups, c10::Device device,
              const std::vector<at::Tensor>& arrays) {
  const c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  // Scratch from the caching allocator, on this stream: freed (for reuse by
  // this stream's later work) when this function returns.
  std::vector<at::Tensor> scratch;
  for (std::vector<Launch>& launches : groups) {
    if (launches.empty()) continue;
    for (int j = 0; j < launches.front().num_jobs; ++j) {
      const int64_t bytes = launches.front().scratch_bytes[j];
      if (bytes == 0) continue;
      scratch.push_back(at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device)));
      set_scratch(launches, j, scratch.back().data_ptr<uint8_t>());
    }
  }
  for (const std::vector<Launch>& launches : groups)
    for (const Launch& l : launches)
      if (l.tiles > 0) launch(l, stream.stream());
  for (const at::Tensor& a : arrays)
    c10::cuda::CUDACachingAllocator::recordStream(a.storage().data_ptr(), stream);
}

}  // namespace flashmla_perm
