// The CUDA kernels compiled at run time by NVRTC: where no usable nvcc was
// found at build time (the module is then built by the host compiler alone),
// or where FLASHMLA_PERM_CUDA=nvrtc asks for it in a build that has nvcc's.
// The source is cuda_kernels.cu and the headers it names, embedded in the
// module at build time; on first use on a device it is compiled for that
// device's exact architecture, cached on disk, loaded through the driver API
// and launched on the caller's stream. NVRTC and the driver library are
// opened with dlopen, never linked: the module imports without either.
// Plain C++ (no ATen); every failure throws std::runtime_error with the
// whole story.
#pragma once

#include <cstdint>
#include <string>

#include "launch.h"

namespace flashmla_perm {
namespace nvrtc {

// "nvcc" where the kernels launched are nvcc's, "nvrtc" where NVRTC's
// (a build without nvcc's kernels, or FLASHMLA_PERM_CUDA=nvrtc in one with).
const char* cuda_compiler();

struct Compiled {
  std::string cubin;
  std::string names[4];  // lowered names: rows, save_heads, cols<true>, cols<false>
  std::string log;       // NVRTC's log, ptxas's resource report (-Xptxas=-v) among it
  double seconds = 0;
};
// Compiles the embedded source for `arch` ("sm_90"). For the tests: `extra`
// is appended to the main source, and a non-empty `main` replaces it (a
// small source naming the same four kernels compiles in milliseconds).
Compiled compile(const std::string& arch, const std::string& extra = "", const std::string& main = "");

struct CacheEntry {
  std::string path;
  bool compiled = false;  // false: read from the cache
  Compiled code;
};
// The compiled kernels for `arch` through the disk cache: read where a whole,
// intact entry is there; else compiled and written (a file of its own,
// renamed into place: concurrent writers each leave a whole entry).
CacheEntry cached(const std::string& arch, const std::string& extra = "", const std::string& main = "");

// The cache folder: FLASHMLA_PERM_CACHE_DIR, else $XDG_CACHE_HOME/flashmla_perm,
// else ~/.cache/flashmla_perm (the entries go in its nvrtc/ folder).
std::string cache_dir();
// NVRTC's "major.minor", loading it if need be (throws where it is missing).
std::string version();
// The hash of the embedded sources (`main` replacing the first where given,
// plus `extra`): the cache key's source part.
std::string source_hash(const std::string& extra = "", const std::string& main = "");

// Device side; the caller has made the device current. `loaded` is whether
// `load` has run for the device; `load` compiles (or reads the cache) for the
// device's architecture and loads the module, once per device.
bool loaded(int device);
void load(int device, int cc_major, int cc_minor);
// As cuda_kernels.h's query_kernel_registers and resident_ctas_per_sm.
void query_kernel_registers(int device, DeviceSpec& spec);
int resident_ctas_per_sm(int device, Kernel kernel, int threads, int64_t smem_bytes);
// Enqueues one planned launch on `stream` (a cudaStream_t); throws on failure.
void launch_kernel(int device, const Launch& l, void* stream);

}  // namespace nvrtc
}  // namespace flashmla_perm
