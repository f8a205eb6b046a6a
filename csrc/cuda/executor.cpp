// CUDA executor, the host side: queries each device once, allocates scratch
// from torch's caching allocator and launches the kernels (cuda/kernels.h) on
// torch's current stream. No CUDA header: the device through the driver API
// (cuda/driver.h), the stream through torch's C shim, the guard and the
// allocator through torch's device-generic API. Built only with the CUDA
// kernels (FLASHMLA_PERM_WITH_CUDA), by the host compiler.
#include <ATen/ops/empty.h>
#include <ATen/ops/record_stream.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/driver.h"
#include "cuda/kernels.h"
#include "cuda/torch_stream.h"
#include "executors.h"
#include "launch_info.h"

namespace flashmla_perm {

namespace {

cuda::CUstream current_stream(c10::Device device) {
  void* stream = nullptr;
  TORCH_CHECK(aoti_torch_get_current_cuda_stream(device.index(), &stream) == 0,
              "flashmla_perm: torch did not give the current CUDA stream of ", device);
  return static_cast<cuda::CUstream>(stream);
}

// The device's kernels, loaded on its first use; whether it has them. Not
// under graph capture: loading a module is no work a capture can record, so
// that first use must come before it, as a plan's upload must (apply.cpp).
bool load_kernels(c10::Device device) {
  if (cuda::loaded(device.index())) return true;
  TORCH_CHECK(!cuda_capturing(device), "flashmla_perm: the CUDA kernels are not loaded on ", device,
              " yet, and the stream is capturing a CUDA graph; call the op once before capture (warm-up) so "
              "that they are loaded outside it");
  return cuda::load(device.index());  // throws std::runtime_error, torch's RuntimeError
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

namespace {

// GPU `index`'s figures and its loaded kernels' registers, as the planner
// takes them, through the driver alone.
DeviceSpec driver_spec(int index) {
  DeviceSpec s;
  const cuda::ContextGuard context(index);
  using cuda::device_attribute;
  s.sm_count = device_attribute(index, cuda::kMultiprocessorCount);
  s.smem_per_sm = device_attribute(index, cuda::kMaxSharedMemoryPerMultiprocessor);
  s.smem_reserved_per_cta = device_attribute(index, cuda::kReservedSharedMemoryPerBlock);
  s.threads_per_sm = device_attribute(index, cuda::kMaxThreadsPerMultiprocessor);
  s.regs_per_sm = device_attribute(index, cuda::kMaxRegistersPerMultiprocessor);
  s.max_ctas_per_sm = device_attribute(index, cuda::kMaxBlocksPerMultiprocessor);
  for (const Kernel k : {Kernel::kRows, Kernel::kSaveHeads, Kernel::kCols})
    s.regs[static_cast<int>(k)] = cuda::registers(index, k);
  s.max_ctas_per_sm =
      std::min(s.max_ctas_per_sm, env_whole_number("FLASHMLA_PERM_MAX_CTAS_PER_SM", 1, 1024, 1024));
  s.col_stages = env_whole_number("FLASHMLA_PERM_COL_STAGES", 1, 2, s.col_stages);
  s.row_stages = env_whole_number("FLASHMLA_PERM_ROW_STAGES", 1, 2, s.row_stages);
  s.tile_budget = env_whole_number("FLASHMLA_PERM_TILE_BUDGET", 1024, kGpuTileBudget, kGpuTileBudget);
  return s;
}

}  // namespace

std::optional<DeviceSpec> cuda_device_spec(c10::Device device) {
  // Queried once per device: no driver call on the hot path. The lock is
  // not held while the kernels load: other devices' calls go on meanwhile.
  static std::mutex mu;
  static std::vector<std::pair<int, std::optional<DeviceSpec>>> specs;
  const int index = device.index();
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [i, s] : specs)
      if (i == index) return s;
  }
  const c10::DeviceGuard guard(device);
  std::optional<DeviceSpec> spec;
  if (load_kernels(device)) spec = driver_spec(index);
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [i, found] : specs)
    if (i == index) return found;  // another thread's, the same
  specs.emplace_back(index, spec);
  return spec;
}

std::vector<LaunchInfo> cuda_driver_launches(const std::string& op, const std::vector<int64_t>& dims,
                                             int index) {
  if (!cuda::stand_in())
    throw std::runtime_error(
        "cuda_driver_launches enqueues launches on fake addresses: only a stand-in driver "
        "(tests/stub_cuda) takes them");
  if (!cuda::load(index)) throw std::runtime_error("flashmla_perm: " + cuda::device_origin(index));
  const std::vector<Launch> launches = launches_for(op, dims, driver_spec(index));
  const cuda::ContextGuard context(index);
  for (const Launch& l : launches) cuda::check_launch(index, l);
  std::vector<LaunchInfo> infos;
  for (const Launch& l : launches) {
    cuda::launch(index, l, nullptr);
    infos.push_back(launch_info(l));
  }
  return infos;
}

DeviceFields cuda_device_fields(int index) {
  const std::optional<DeviceSpec> spec =
      cuda_device_spec(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)));
  TORCH_CHECK(spec, "flashmla_perm: ", cuda::device_origin(index));
  return device_fields(*spec);
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
  TORCH_CHECK(cuda_device_spec(device), "flashmla_perm: ", cuda::device_origin(index));  // loads them
  const cuda::ContextGuard context(index);
  return cuda::resident_ctas_per_sm(index, *k, threads, smem_bytes);
}

bool cuda_capturing(c10::Device device) {
  const cuda::ContextGuard context(device.index());
  return cuda::capturing(current_stream(device));
}

void run_cuda(std::vector<std::vector<Launch>> groups, c10::Device device,
              const std::vector<at::Tensor>& arrays) {
  const c10::DeviceGuard guard(device);
  const cuda::CUstream stream = current_stream(device);
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
  // The plans' arrays (the kernels read them) outlive this stream's work,
  // marked before the first launch: one that throws leaves earlier ones queued.
  const c10::Stream current = c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(device);
  for (const at::Tensor& a : arrays) const_cast<at::Tensor&>(a).record_stream(current);
  const cuda::ContextGuard context(device.index());
  // Every launch checked before the first is queued: what the driver would
  // refuse raises with nothing moved. (A launch that fails in the driver
  // after others were queued leaves their tensors permuted: docs/api.md.)
  for (const std::vector<Launch>& launches : groups)
    for (const Launch& l : launches)
      if (l.tiles > 0) cuda::check_launch(device.index(), l);
  for (const std::vector<Launch>& launches : groups)
    for (const Launch& l : launches)
      if (l.tiles > 0) cuda::launch(device.index(), l, stream);
}

}  // namespace flashmla_perm
