// What the kernels see of the launch planning (launch.h includes this): the
// figures a kernel is built for and the parameters it takes. Compiled by nvcc,
// by NVRTC at run time (csrc/nvrtc_kernels.cpp, which hands it the standard
// headers it lacks: <cstdint>, <cstring>, <type_traits>) and by the host
// compiler, so it holds nothing but these.
#pragma once

#include <cstdint>
#include <type_traits>

#include "tile_bodies.h"

namespace flashmla_perm {

// Calls f(std::integral_constant<int, V>{}) for the runtime width v (host
// code, and the kernels: a tile's width is a field of its job).
template <class F>
FLASHMLA_PERM_HOST_DEVICE void with_vector_width(int v, F&& f) {
  switch (v) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

// Threads per CTA of every kernel.
constexpr int kGpuThreads = 128;
// Jobs (tensors) one launch carries: a model op's weight and scale.
constexpr int kMaxJobs = 2;

// A kernel's one parameter: its jobs, read in place (cuda_kernels.cu's
// for_each_tile says why). The host fills it in for both compilers' kernels
// (NVRTC's through cuLaunchKernel, which copies these bytes as they are).
template <class Job>
struct Jobs {
  Job job[kMaxJobs];
  int num;
};

}  // namespace flashmla_perm
