// CUDA executor: one CTA per tile (grid-stride over tiles), shared memory as
// the tile buffer, 128-bit moves where every address and pitch allows them.
// Launches go to the current stream of the tensor's device.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "executors.h"
#include "tiling.h"

namespace flashmla_perm {
namespace {

struct CudaCtx {
  static constexpr bool kSerial = false;
  __device__ int thread() const { return threadIdx.x; }
  __device__ int num_threads() const { return blockDim.x; }
  __device__ void sync() { __syncthreads(); }
};

constexpr int kThreads = 256;
constexpr int64_t kRowBudget = 40 * 1024;  // under the 48 KiB default: no opt-in attribute
constexpr int64_t kColBudget = 32 * 1024;  // several CTAs per SM
constexpr int64_t kStep = 4;               // unit slices in flight per CTA
constexpr int64_t kMaxGrid = 1 << 20;

template <int V>
__global__ void __launch_bounds__(kThreads) save_heads_kernel(RowParams p, int64_t tiles) {
  CudaCtx ctx;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) save_segment_head<V>(ctx, p, t);
}

template <int V>
__global__ void __launch_bounds__(kThreads) row_kernel(RowParams p, int64_t tiles) {
  extern __shared__ uint4 smem[];
  CudaCtx ctx;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x)
    row_segment_tile<V>(ctx, p, t, reinterpret_cast<uint8_t*>(smem));
}

template <int V>
__global__ void __launch_bounds__(kThreads) col_kernel(ColParams p, int64_t tiles) {
  extern __shared__ uint4 smem[];
  CudaCtx ctx;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x)
    col_gather_tile<V>(ctx, p, t, reinterpret_cast<uint8_t*>(smem));
}

unsigned grid_for(int64_t tiles) { return static_cast<unsigned>(std::min(tiles, kMaxGrid)); }

}  // namespace

void run_rows_cuda(const RowTarget& target, const RowPlan& plan, const int64_t* order,
                   const int64_t* segments, c10::Device device) {
  if (plan.num_segments == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
  const RowTiling tiling = row_tiling(plan.unit_rows, target.row_bytes, kStep, kRowBudget);
  at::Tensor scratch;
  if (plan.num_scratch > 0)
    scratch = at::empty({plan.num_scratch * plan.unit_rows * target.row_bytes},
                        at::TensorOptions().dtype(at::kByte).device(device));
  const RowParams p{target.data,        target.row_stride, target.row_bytes,
                    plan.unit_rows,     order,             segments,
                    plan.num_scratch > 0 ? scratch.data_ptr<uint8_t>() : nullptr,
                    tiling.slice_bytes, tiling.num_slices, tiling.step};
  const int v = vector_width({reinterpret_cast<int64_t>(target.data), target.row_stride,
                              target.row_bytes, tiling.slice_bytes});
  with_vector_width(v, [&](auto vw) {
    constexpr int V = decltype(vw)::value;
    const int64_t head_tiles = plan.num_scratch * p.num_slices;
    if (head_tiles > 0) {
      save_heads_kernel<V><<<grid_for(head_tiles), kThreads, 0, stream>>>(p, head_tiles);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const int64_t tiles = plan.num_segments * p.num_slices;
    row_kernel<V><<<grid_for(tiles), kThreads, tiling.smem_bytes, stream>>>(p, tiles);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

bool cols_fit_cuda(int64_t row_bytes) { return row_bytes <= kColBudget; }

void run_cols_cuda(const ColTarget& target, const ColPlan& plan, const int32_t* source_offset,
                   c10::Device device) {
  if (target.rows == 0 || target.row_bytes == 0) return;
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
  const int64_t tile_rows = col_tile_rows(target.row_bytes, target.rows, kColBudget);
  const ColParams p{target.src,  target.dst, target.src_row_stride, target.dst_row_stride,
                    target.rows, target.row_bytes, source_offset, plan.chunk_shift, tile_rows};
  const int v = vector_width({reinterpret_cast<int64_t>(target.src),
                              reinterpret_cast<int64_t>(target.dst), target.src_row_stride,
                              target.dst_row_stride, target.row_bytes,
                              int64_t{1} << plan.chunk_shift});
  const int64_t tiles = (target.rows + tile_rows - 1) / tile_rows;
  with_vector_width(v, [&](auto vw) {
    constexpr int V = decltype(vw)::value;
    col_kernel<V><<<grid_for(tiles), kThreads, tile_rows * target.row_bytes, stream>>>(p, tiles);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace flashmla_perm
