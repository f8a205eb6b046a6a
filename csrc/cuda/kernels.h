// The CUDA kernels on each device, whatever compiled them: the cubin for an
// architecture (built at install, else compiled at first use by NVRTC through
// the disk cache), loaded once per device through the driver API, its
// kernels launched on the caller's stream by their extern "C" names
// (csrc/cuda/kernels.cu). Plain C++; failures throw std::runtime_error.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/driver.h"
#include "launch.h"

namespace flashmla_perm {
namespace cuda {

// Where an architecture's kernels come from.
struct Origin {
  std::string kind;    // "install", "cache" or "compiled" (at first use, by NVRTC)
  std::string text;    // in words: "built at install by nvcc 13.0 (sm_80's kernels)"
  double seconds = 0;  // the compile's, where compiled
};

// Points NVRTC's search at torch's own nvidia-cuda-nvrtc (once).
void find_nvrtc_beside_torch();
// What a cache entry of NVRTC's kernels is keyed by: the source (`extra` and
// `main` as nvrtc::compile takes them), the architecture, NVRTC's version
// and build.
std::string nvrtc_cache_key(const std::string& arch, const std::string& extra = "",
                            const std::string& main = "");

// The architectures built at install, each with its compiler.
std::vector<std::pair<std::string, std::string>> installed();
// The architectures whose kernels this process compiled or read from the
// cache, each with where they came from.
std::vector<std::pair<std::string, std::string>> compiled_here();
// Where the kernels of sm_<major><minor> would come from, compiling nothing.
Origin origin(int major, int minor);
// Makes the kernels of sm_<major><minor> ready in this process (compiling
// them where nothing else serves): warm-up, and a device's first use. Once
// per architecture a process; threads asking at once wait for one compile.
Origin prepare(int major, int minor);

// A device's kernels, loaded on first use (prepare, then the module).
// `device` is torch's CUDA index. The calls below it expect the device's
// context current (ContextGuard).
void load(int device);
bool loaded(int device);
// Where the kernels loaded on `device` came from ("" before load).
std::string device_origin(int device);
// Registers per thread (kCols: the larger of its two forms).
int registers(int device, Kernel kernel);
// CTAs of `kernel` (kCols: the fewer of its two forms) one SM holds at once,
// by the driver's occupancy calculator.
int resident_ctas_per_sm(int device, Kernel kernel, int threads, int64_t smem_bytes);
// Enqueues one planned launch on `stream`.
void launch(int device, const Launch& l, CUstream stream);

}  // namespace cuda
}  // namespace flashmla_perm
