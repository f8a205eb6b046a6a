// The kernels built at install by torch's NVRTC (csrc/cuda/build_kernels.py):
// one cubin per architecture ("sm_90") and one PTX image ("compute_80", NUL
// terminated) for any later GPU, embedded in the module (the generated
// kernel_images.cpp). Part of the binary: nothing to find, check or trust at
// run time, and a wheel built once carries them.
#pragma once

#include <cstddef>

namespace flashmla_perm {
namespace cuda {

struct KernelImage {
  const char* target;  // "sm_90" (a cubin) or "compute_80" (PTX)
  const unsigned char* data;
  size_t size;
};
extern const char kKernelCompiler[];  // "NVRTC 13.0"
extern const KernelImage kKernelImages[];
extern const int kNumKernelImages;

}  // namespace cuda
}  // namespace flashmla_perm
