// The kernels built at install: one cubin per architecture, compiled by
// scripts/build_kernels.py (nvcc or NVRTC, the architectures side by side)
// and embedded in the module (kernel_images.cpp, generated beside
// nvrtc_sources.h). Part of the binary: nothing to find, check or trust at
// run time, and a wheel built once carries them.
#pragma once

#include <cstddef>

namespace flashmla_perm {
namespace cuda {

struct KernelImage {
  const char* arch;      // "sm_90"
  const char* compiler;  // "nvcc 13.0.88" or "NVRTC 13.0"
  const unsigned char* cubin;
  size_t size;
};
extern const KernelImage kKernelImages[];
extern const int kNumKernelImages;

}  // namespace cuda
}  // namespace flashmla_perm
