#include "cuda/kernels.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "cuda/kernel_cache.h"
#include "cuda/kernel_images.h"
#include "cuda/nvrtc.h"
#include "cuda/torch_stream.h"
#include "switches.h"

namespace flashmla_perm {
namespace cuda {
namespace {

// The kernels by their extern "C" names (csrc/cuda/kernels.cu), in the
// order Loaded::functions holds them.
constexpr int kNumFunctions = 4;
const char* const kKernelNames[kNumFunctions] = {"flashmla_perm_rows", "flashmla_perm_save_heads",
                                                 "flashmla_perm_cols_staged", "flashmla_perm_cols_direct"};
int function_of(Kernel kernel, bool staged) {
  if (kernel == Kernel::kRows) return 0;
  if (kernel == Kernel::kSaveHeads) return 1;
  return staged ? 2 : 3;
}

std::string arch_name(int major, int minor) { return "sm_" + std::to_string(major) + std::to_string(minor); }

// FLASHMLA_PERM_JIT=1: every architecture's kernels compiled at first use,
// as if none had been built at install (the NVRTC path, on any GPU).
bool jit_only() {
  static const bool jit = env_switch("FLASHMLA_PERM_JIT", false);
  return jit;
}

// The image built at install that runs on sm_<major><minor>: its own, else
// the newest older minor of its major (a cubin runs on later minors of its
// family: sm_80's on sm_86 and sm_89, sm_100's on sm_103, sm_120's on sm_121).
const KernelImage* install_image(int major, int minor) {
  if (jit_only()) return nullptr;
  const KernelImage* best = nullptr;
  int best_minor = -1;
  for (int i = 0; i < kNumKernelImages; ++i) {
    const std::string a = kKernelImages[i].arch;  // "sm_XY", X one or two digits, Y one
    const int m = std::stoi(a.substr(3, a.size() - 4)), n = a.back() - '0';
    if (m == major && n <= minor && n > best_minor) {
      best = &kKernelImages[i];
      best_minor = n;
    }
  }
  return best;
}

std::string image_text(const KernelImage& image, int major, int minor) {
  const std::string own = arch_name(major, minor);
  return std::string("built at install by ") + image.compiler +
         (own == image.arch ? std::string() : std::string(" (") + image.arch + "'s kernels)");
}

// An architecture's kernels, once ready.
struct Ready {
  std::string storage;  // a compiled or cached cubin (install images live in the binary)
  const void* cubin = nullptr;
  Origin origin;
};
std::mutex ready_mu;
std::map<std::string, std::shared_ptr<std::mutex>> arch_mu;  // one compile per architecture
std::map<std::string, std::shared_ptr<const Ready>> ready_by_arch;

std::shared_ptr<const Ready> compiled_ready(const std::string& arch) {
  auto r = std::make_shared<Ready>();
  const kernel_cache::Entry e = kernel_cache::get(arch, nvrtc_cache_key(arch), [&] {
    const nvrtc::Compiled c = nvrtc::compile(arch);
    return kernel_cache::Compiled{c.cubin, c.log, c.seconds};
  });
  r->storage = e.cubin;
  r->cubin = r->storage.data();
  const std::string by = "NVRTC " + nvrtc::library().version;
  if (e.compiled) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", e.seconds);
    r->origin = {"compiled",
                 "compiled by " + by + " in " + secs + " s" +
                     (e.path.empty() ? std::string() : ", cached in " + e.path),
                 e.seconds};
  } else {
    r->origin = {"cache", "found in the cache (" + e.path + "), compiled by " + by, 0};
  }
  return r;
}

std::shared_ptr<const Ready> ready(int major, int minor, bool skip_install = false) {
  const std::string arch = arch_name(major, minor);
  std::shared_ptr<std::mutex> mu;
  {
    std::lock_guard<std::mutex> lock(ready_mu);
    const auto it = ready_by_arch.find(arch);
    if (it != ready_by_arch.end() && !(skip_install && it->second->origin.kind == "install"))
      return it->second;
    auto& m = arch_mu[arch];
    if (!m) m = std::make_shared<std::mutex>();
    mu = m;
  }
  std::lock_guard<std::mutex> compiling(*mu);
  {
    std::lock_guard<std::mutex> lock(ready_mu);
    const auto it = ready_by_arch.find(arch);
    if (it != ready_by_arch.end() && !(skip_install && it->second->origin.kind == "install"))
      return it->second;
  }
  std::shared_ptr<const Ready> r;
  const KernelImage* image = skip_install ? nullptr : install_image(major, minor);
  if (image) {
    auto made = std::make_shared<Ready>();
    made->cubin = image->cubin;
    made->origin = {"install", image_text(*image, major, minor), 0};
    r = made;
  } else {
    r = compiled_ready(arch);
  }
  std::lock_guard<std::mutex> lock(ready_mu);
  ready_by_arch[arch] = r;
  return r;
}

struct Loaded {
  CUmodule module = nullptr;
  CUfunction functions[kNumFunctions] = {};
  std::string origin;
};
std::mutex loaded_mu;
std::map<int, Loaded> loaded_by_device;

Loaded loaded_on(int device) {
  std::lock_guard<std::mutex> lock(loaded_mu);
  const auto it = loaded_by_device.find(device);
  if (it == loaded_by_device.end())
    throw std::runtime_error(
        "flashmla_perm: the CUDA kernels are not loaded on "
        "device " +
        std::to_string(device));
  return it->second;
}

// Loads `r`'s cubin into the current context and finds its kernels; the
// first error of the driver's, if any, with nothing left loaded.
CUresult load_module(const Ready& r, Loaded& l) {
  const RelaxedCapture relaxed;  // a module load must not end another thread's capture
  CUresult e = driver().ModuleLoadData(&l.module, r.cubin);
  // (Lazy loading, the default since CUDA 12.2, may refuse an image only here.)
  for (int i = 0; i < kNumFunctions && e == 0; ++i) {
    e = driver().ModuleGetFunction(&l.functions[i], l.module, kKernelNames[i]);
    // The plan counts on the whole shared memory per SM (wo_a: 6 CTAs of
    // 33 KiB), not the driver's guess: ask for the largest carveout.
    if (e == 0)
      e = driver().FuncSetAttribute(l.functions[i], kPreferredSharedMemoryCarveout, kCarveoutMaxShared);
  }
  if (e != 0 && l.module) {
    driver().ModuleUnload(l.module);
    l = Loaded{};
  }
  if (e == 0) l.origin = r.origin.text;
  return e;
}

bool image_refused(CUresult e) {
  for (const int refused : kImageErrors)
    if (e == refused) return true;
  return false;
}

}  // namespace

void find_nvrtc_beside_torch() {
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&aoti_torch_get_current_cuda_stream), &info) && info.dli_fname) {
      const std::string lib = info.dli_fname;  // .../torch/lib/libtorch_cuda.so
      const size_t slash = lib.rfind('/');
      if (slash != std::string::npos) nvrtc::set_torch_lib_dir(lib.substr(0, slash));
    }
  });
}

std::string nvrtc_cache_key(const std::string& arch, const std::string& extra, const std::string& main) {
  find_nvrtc_beside_torch();
  const nvrtc::Library& lib = nvrtc::library();
  return "kernels " + nvrtc::source_hash(extra, main) + " for " + arch + " by NVRTC " + lib.version + " (" +
         lib.identity + ")";
}

std::vector<std::pair<std::string, std::string>> installed() {
  std::vector<std::pair<std::string, std::string>> out;
  for (int i = 0; i < kNumKernelImages; ++i)
    out.emplace_back(kKernelImages[i].arch, kKernelImages[i].compiler);
  return out;
}

std::vector<std::pair<std::string, std::string>> compiled_here() {
  std::lock_guard<std::mutex> lock(ready_mu);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [arch, r] : ready_by_arch)
    if (r->origin.kind != "install") out.emplace_back(arch, r->origin.text);
  return out;
}

Origin origin(int major, int minor) {
  if (const KernelImage* image = install_image(major, minor))
    return {"install", image_text(*image, major, minor)};
  const std::string arch = arch_name(major, minor);
  {
    std::lock_guard<std::mutex> lock(ready_mu);
    const auto it = ready_by_arch.find(arch);
    if (it != ready_by_arch.end()) return it->second->origin;
  }
  std::string found;
  try {
    found = kernel_cache::find(arch, nvrtc_cache_key(arch));
  } catch (const std::exception&) {  // no NVRTC: the first use will say so
  }
  if (!found.empty()) return {"cache", "found in the cache (" + found + ")"};
  return {"compiled", "compiled at first use by NVRTC (not in the cache)"};
}

Origin prepare(int major, int minor) { return ready(major, minor)->origin; }

void load(int device) {
  if (loaded(device)) return;
  const ContextGuard context(device);
  // One load at a time (a first compile takes seconds; launches on devices
  // already loaded go on meanwhile).
  static std::mutex load_mu;
  std::lock_guard<std::mutex> one_load(load_mu);
  if (loaded(device)) return;
  const int major = device_attribute(device, kComputeCapabilityMajor);
  const int minor = device_attribute(device, kComputeCapabilityMinor);
  std::shared_ptr<const Ready> r = ready(major, minor);
  Loaded l;
  CUresult e = load_module(*r, l);
  if (image_refused(e) && r->origin.kind == "install") {
    // A driver older than the compiler that built the install image may
    // refuse it: NVRTC of torch's CUDA, which this driver runs, compiles them.
    const char* text = nullptr;
    driver().GetErrorString(e, &text);
    kernel_cache::say_once("the driver refused the kernels " + r->origin.text + " (" + (text ? text : "?") +
                           "); compiling them with NVRTC");
    r = ready(major, minor, true);
    e = load_module(*r, l);
  }
  check(e, "cuModuleLoadData (the CUDA kernels)");
  std::lock_guard<std::mutex> lock(loaded_mu);
  loaded_by_device[device] = l;
}

bool loaded(int device) {
  std::lock_guard<std::mutex> lock(loaded_mu);
  return loaded_by_device.count(device) > 0;
}

std::string device_origin(int device) {
  std::lock_guard<std::mutex> lock(loaded_mu);
  const auto it = loaded_by_device.find(device);
  return it == loaded_by_device.end() ? "" : it->second.origin;
}

int registers(int device, Kernel kernel) {
  const Loaded l = loaded_on(device);
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
  const Loaded l = loaded_on(device);
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

void launch(int device, const Launch& l, CUstream stream) {
  const Loaded loaded = loaded_on(device);
  // The kernels' one parameter, as kernels.cu declares it: cuLaunchKernel
  // copies these bytes as they are.
  Jobs<ColJob> cols = col_jobs(l);
  Jobs<RowJob> rows = row_jobs(l);
  void* args[1] = {l.kernel == Kernel::kCols ? static_cast<void*>(&cols) : static_cast<void*>(&rows)};
  const CUfunction f = loaded.functions[function_of(l.kernel, l.cols[0].staged != 0)];
  const unsigned smem = l.kernel == Kernel::kSaveHeads ? 0 : static_cast<unsigned>(l.smem_bytes);
  check(driver().LaunchKernel(f, static_cast<unsigned>(l.grid), 1, 1, static_cast<unsigned>(l.threads), 1, 1,
                              smem, stream, args, nullptr),
        "cuLaunchKernel");
}

}  // namespace cuda
}  // namespace flashmla_perm
