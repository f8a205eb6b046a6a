// CUDA executor, the host side: queries the device once, allocates scratch
// from the caching allocator and launches cuda_kernels.cu's kernels on the
// current stream, as nvcc built them (FLASHMLA_PERM_NVCC_KERNELS) or as NVRTC
// builds them at first use on a device (nvrtc_kernels.h). Built only with the
// CUDA kernels (FLASHMLA_PERM_WITH_CUDA), by the host compiler.
#ifdef FLASHMLA_PERM_WITH_CUDA

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#ifdef FLASHMLA_PERM_NVCC_KERNELS
#include "cuda_kernels.h"
#endif
#include "executors.h"
#include "launch_info.h"
#include "nvrtc_kernels.h"

namespace flashmla_perm {

namespace {

// Whether the kernels launched are NVRTC's (nvrtc_kernels.h).
bool by_nvrtc() { return std::string(nvrtc::cuda_compiler()) == "nvrtc"; }

// NVRTC's kernels for the device, compiled (or read from the cache) and
// loaded on its first use. Not under graph capture: loading a module is no
// work a capture can record, so that first use must come before it, as a
// plan's upload must (apply.cpp).
void load_nvrtc_kernels(c10::Device device, const cudaDeviceProp& prop) {
  if (nvrtc::loaded(device.index())) return;
  TORCH_CHECK(!cuda_capturing(device), "flashmla_perm: the CUDA kernels are not compiled for ", device,
              " yet, and the stream is capturing a CUDA graph; call the op once before capture (warm-up) so "
              "that NVRTC compiles and loads them outside it");
  // Relaxed: another thread capturing in the global mode must not have its
  // capture invalidated by this load.
  const c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  C10_CUDA_CHECK(cudaFree(nullptr));  // the device's primary context, current on this thread
  nvrtc::load(device.index(), prop.major, prop.minor);
}

}  // namespace

// The device check's sweep (device/check.py) plans launches other than
// the default through these, read with the device's figures, once a
// process: FLASHMLA_PERM_MAX_CTAS_PER_SM=n, at most n CTAs per SM (fewer bytes
// in flight, the same work: it tells the load latency a tile sees from the
// issue rate); FLASHMLA_PERM_COL_STAGES=2, two tile buffers per CTA for staged
// column tiles (the in-place wo_a and wv weights and their scales);
// FLASHMLA_PERM_ROW_STAGES=1, one tile buffer per CTA for row tiles (wq_b),
// which take two by default where every tile is one pass;
// FLASHMLA_PERM_TILE_BUDGET=bytes, smaller row and staged column tiles.
static int env_whole_number(const char* name, int lowest, int highest, int unset) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return unset;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  TORCH_CHECK(*end == '\0' && n >= lowest && n <= highest, name, " must be a whole number from ", lowest,
              " to ", highest, ", got '", text, "'");
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
  if (by_nvrtc()) {
    load_nvrtc_kernels(device, prop);
    nvrtc::query_kernel_registers(index, s);
  } else {
#ifdef FLASHMLA_PERM_NVCC_KERNELS
    C10_CUDA_CHECK(query_kernel_registers(s));
#endif
  }
  specs.emplace_back(index, s);
  return s;
}

DeviceFields cuda_device_fields(int index) {
  return device_fields(cuda_device_spec(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index))));
}

int cuda_resident_ctas_per_sm(const std::string& kernel, int threads, int64_t smem_bytes, int index) {
  const Kernel kernels[] = {Kernel::kRows, Kernel::kSaveHeads, Kernel::kCols};
  const Kernel* k = std::find_if(std::begin(kernels), std::end(kernels),
                                 [&](Kernel each) { return kernel == kernel_name(each); });
  TORCH_CHECK_VALUE(k != std::end(kernels),
                    "cuda_resident_ctas_per_sm: kernel must be 'rows', 'save_heads' or "
                    "'cols', got '",
                    kernel, "'");
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  cuda_device_spec(device);  // sets the kernels' carveout preference, once per device
  const c10::cuda::CUDAGuard guard(device);
  if (by_nvrtc()) return nvrtc::resident_ctas_per_sm(index, *k, threads, smem_bytes);
  int ctas = 0;
#ifdef FLASHMLA_PERM_NVCC_KERNELS
  C10_CUDA_CHECK(resident_ctas_per_sm(*k, threads, smem_bytes, &ctas));
#endif
  return ctas;
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
  const bool nvrtc_kernels = by_nvrtc();
  for (const std::vector<Launch>& launches : groups)
    for (const Launch& l : launches)
      if (l.tiles > 0) {
        if (nvrtc_kernels) {
          nvrtc::launch_kernel(device.index(), l, stream.stream());
        } else {
#ifdef FLASHMLA_PERM_NVCC_KERNELS
          launch_kernel(l, stream.stream());
#endif
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
  for (const at::Tensor& a : arrays)
    c10::cuda::CUDACachingAllocator::recordStream(a.storage().data_ptr(), stream);
}

}  // namespace flashmla_perm

#endif  // FLASHMLA_PERM_WITH_CUDA
