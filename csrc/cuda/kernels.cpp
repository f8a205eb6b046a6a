#include "cuda/kernels.h"

#include <map>
#include <mutex>
#include <stdexcept>

#include "cuda/kernel_images.h"
#include "switches.h"

namespace flashmla_perm {
namespace cuda {
namespace {

// The kernels by their extern "C" names (csrc/cuda/kernels.cu), in the
// order Loaded::functions holds them, with the size of the one parameter
// each takes, as this side lays it out.
constexpr int kNumFunctions = 4;
const char* const kKernelNames[kNumFunctions] = {"flashmla_perm_rows", "flashmla_perm_save_heads",
                                                 "flashmla_perm_cols_staged", "flashmla_perm_cols_direct"};
const size_t kParamBytes[kNumFunctions] = {sizeof(Jobs<RowJob>), sizeof(Jobs<RowJob>), sizeof(Jobs<ColJob>),
                                           sizeof(Jobs<ColJob>)};
int function_of(Kernel kernel, bool staged) {
  if (kernel == Kernel::kRows) return 0;
  if (kernel == Kernel::kSaveHeads) return 1;
  return staged ? 2 : 3;
}

bool is_cubin(const KernelImage& image) { return std::string(image.target).rfind("sm_", 0) == 0; }

// The cubin that runs on sm_<major><minor>: its own, else the newest older
// minor of its major (sm_80's runs on sm_86 and sm_89, sm_100's on sm_103,
// sm_120's on sm_121). FLASHMLA_PERM_PTX=1 (tests, the device check): none,
// so that the PTX loads on any GPU.
const KernelImage* family_cubin(int major, int minor) {
  static const bool ptx_only = env_switch("FLASHMLA_PERM_PTX", false);
  const KernelImage* best = nullptr;
  int best_minor = -1;
  for (int i = 0; i < kNumKernelImages && !ptx_only; ++i) {
    if (!is_cubin(kKernelImages[i])) continue;
    const std::string a = kKernelImages[i].target;  // "sm_XY", X one or two digits, Y one
    const int m = std::stoi(a.substr(3, a.size() - 4)), n = a.back() - '0';
    if (m == major && n <= minor && n > best_minor) {
      best = &kKernelImages[i];
      best_minor = n;
    }
  }
  return best;
}

const KernelImage* ptx_image() {
  for (int i = 0; i < kNumKernelImages; ++i)
    if (!is_cubin(kKernelImages[i])) return &kKernelImages[i];
  return nullptr;
}

struct Loaded {
  CUmodule module = nullptr;
  CUfunction functions[kNumFunctions] = {};
  int max_dynamic_smem[kNumFunctions] = {};
  std::string origin;  // or why nothing loaded
};
std::mutex loaded_mu;
std::map<int, Loaded> loaded_by_device;  // an entry is written once (load) and never changes

// Its entry, by reference: a launch copies nothing of it.
const Loaded& loaded_on(int device) {
  std::lock_guard<std::mutex> lock(loaded_mu);
  const auto it = loaded_by_device.find(device);
  if (it == loaded_by_device.end() || !it->second.module)
    throw std::runtime_error("flashmla_perm: the CUDA kernels are not loaded on device " +
                             std::to_string(device));
  return it->second;
}

std::string error_text(CUresult e) {
  const char* text = nullptr;
  driver().GetErrorString(e, &text);
  return text ? text : "error " + std::to_string(e);
}

bool image_refused(CUresult e) {
  for (const int refused : kImageErrors)
    if (e == refused) return true;
  return false;
}

// Loads `image` into the current context and finds its kernels. "" when
// they are ready; why not where the driver refused the image or its
// kernels take another parameter block than this side passes (an image of
// other sources); other errors throw. Nothing is left loaded unless ready.
std::string load_image(const KernelImage& image, Loaded& l) {
  const RelaxedCapture relaxed;  // a module load must not end another thread's capture
  std::string why;
  CUresult e = driver().ModuleLoadData(&l.module, image.data);
  // (Lazy loading, the default since CUDA 12.2, may refuse an image only here.)
  for (int i = 0; i < kNumFunctions && e == 0 && why.empty(); ++i) {
    e = driver().ModuleGetFunction(&l.functions[i], l.module, kKernelNames[i]);
    size_t offset = 0, bytes = 0;
    if (e == 0 && driver().FuncGetParamInfo &&  // drivers of CUDA 12.4 and later
        (e = driver().FuncGetParamInfo(l.functions[i], 0, &offset, &bytes)) == 0 && bytes != kParamBytes[i])
      why = std::string(kKernelNames[i]) + " takes a parameter of " + std::to_string(bytes) +
            " bytes, this module passes " + std::to_string(kParamBytes[i]);
    // The plan counts on the whole shared memory per SM (wo_a: 6 CTAs of
    // 33 KiB), not the driver's guess: ask for the largest carveout.
    if (e == 0 && why.empty())
      e = driver().FuncSetAttribute(l.functions[i], kPreferredSharedMemoryCarveout, kCarveoutMaxShared);
    if (e == 0 && why.empty())
      e = driver().FuncGetAttribute(&l.max_dynamic_smem[i], kMaxDynamicSharedSizeBytes, l.functions[i]);
  }
  if (e != 0 && !image_refused(e)) {
    if (l.module) driver().ModuleUnload(l.module);
    l = Loaded{};
    check(e, "cuModuleLoadData (the CUDA kernels)");
  }
  if (e != 0) why = "the driver refused it (" + error_text(e) + ")";
  if (!why.empty() && l.module) driver().ModuleUnload(l.module);
  if (!why.empty()) l = Loaded{};
  return why;
}

}  // namespace

std::vector<std::string> installed() {
  std::vector<std::string> out;
  for (int i = 0; i < kNumKernelImages; ++i) out.push_back(kKernelImages[i].target);
  return out;
}

const char* compiler() { return kKernelCompiler; }

bool load(int device) {
  {
    std::lock_guard<std::mutex> lock(loaded_mu);
    const auto it = loaded_by_device.find(device);
    if (it != loaded_by_device.end()) return it->second.module != nullptr;
  }
  const ContextGuard context(device);
  static std::mutex load_mu;  // one load at a time
  std::lock_guard<std::mutex> one_load(load_mu);
  if (loaded(device) || !device_origin(device).empty()) return loaded(device);
  const int major = device_attribute(device, kComputeCapabilityMajor);
  const int minor = device_attribute(device, kComputeCapabilityMinor);
  const std::string gpu = "sm_" + std::to_string(major) + std::to_string(minor);
  Loaded l;
  std::string refused;
  for (const KernelImage* image : {family_cubin(major, minor), ptx_image()}) {
    if (!image) continue;
    const std::string why = load_image(*image, l);
    const std::string name = std::string(image->target) + (is_cubin(*image) ? " cubin" : " PTX");
    if (why.empty()) {
      l.origin = name + " built at install by " + kKernelCompiler;
      break;
    }
    refused += (refused.empty() ? "" : "; ") + name + ": " + why;
  }
  if (!l.module)
    l.origin = "torch's gather: no kernels load on this " + gpu + " GPU (" +
               (refused.empty() ? "none built at install" : refused) + ")";
  std::lock_guard<std::mutex> lock(loaded_mu);
  loaded_by_device[device] = l;
  return l.module != nullptr;
}

bool loaded(int device) {
  std::lock_guard<std::mutex> lock(loaded_mu);
  const auto it = loaded_by_device.find(device);
  return it != loaded_by_device.end() && it->second.module;
}

std::string device_origin(int device) {
  std::lock_guard<std::mutex> lock(loaded_mu);
  const auto it = loaded_by_device.find(device);
  return it == loaded_by_device.end() ? "" : it->second.origin;
}

std::map<int, std::string> device_origins() {
  std::lock_guard<std::mutex> lock(loaded_mu);
  std::map<int, std::string> out;
  for (const auto& [device, l] : loaded_by_device) out[device] = l.origin;
  return out;
}

int registers(int device, Kernel kernel) {
  const Loaded& l = loaded_on(device);
  int most = 0;
  for (const bool staged : {true, false}) {
    int regs = 0;
    check(driver().FuncGetAttribute(&regs, kNumRegs, l.functions[function_of(kernel, staged)]),
          "cuFuncGetAttribute");
    most = regs > most ? regs : most;
  }
  return most;
}

int resident_ctas_per_sm(int device, Kernel kernel, int threads, int64_t smem_bytes) {
  const Loaded& l = loaded_on(device);
  int fewest = -1;
  for (const bool staged : {true, false}) {
    int n = 0;
    check(driver().OccupancyMaxActiveBlocksPerMultiprocessor(&n, l.functions[function_of(kernel, staged)],
                                                             threads, static_cast<size_t>(smem_bytes)),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    fewest = fewest < 0 || n < fewest ? n : fewest;
  }
  return fewest;
}

namespace {

unsigned dynamic_smem(const Launch& l) {
  return l.kernel == Kernel::kSaveHeads ? 0 : static_cast<unsigned>(l.smem_bytes);
}

}  // namespace

void check_launch(int device, const Launch& l) {
  const Loaded& loaded = loaded_on(device);
  const int f = function_of(l.kernel, l.cols[0].staged != 0);
  if (l.grid < 1 || l.grid > 0x7fffffff || l.threads < 1 || l.threads > 1024 || l.smem_bytes < 0 ||
      dynamic_smem(l) > static_cast<unsigned>(loaded.max_dynamic_smem[f]))
    throw std::runtime_error("flashmla_perm: a planned launch of " + std::string(kKernelNames[f]) +
                             " is one the driver refuses: grid " + std::to_string(l.grid) + ", " +
                             std::to_string(l.threads) + " threads, " + std::to_string(l.smem_bytes) +
                             " bytes of shared memory (at most " +
                             std::to_string(loaded.max_dynamic_smem[f]) + "); nothing was launched");
}

void launch(int device, const Launch& l, CUstream stream) {
  const Loaded& loaded = loaded_on(device);
  // The kernels' one parameter, as kernels.cu declares it, passed as a block
  // of its size: the driver refuses a block of another size than the
  // kernel's (load_image checked they agree).
  Jobs<ColJob> cols = col_jobs(l);
  Jobs<RowJob> rows = row_jobs(l);
  const bool is_cols = l.kernel == Kernel::kCols;
  void* block = is_cols ? static_cast<void*>(&cols) : static_cast<void*>(&rows);
  size_t bytes = is_cols ? sizeof(cols) : sizeof(rows);
  const auto key = [](intptr_t k) { return reinterpret_cast<void*>(k); };
  void* extra[] = {key(kLaunchParamBufferPointer), block, key(kLaunchParamBufferSize), &bytes,
                   key(kLaunchParamEnd)};
  const CUfunction f = loaded.functions[function_of(l.kernel, l.cols[0].staged != 0)];
  check(driver().LaunchKernel(f, static_cast<unsigned>(l.grid), 1, 1, static_cast<unsigned>(l.threads), 1, 1,
                              dynamic_smem(l), stream, nullptr, extra),
        "cuLaunchKernel");
}

}  // namespace cuda
}  // namespace flashmla_perm
