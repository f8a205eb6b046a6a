// What the kernels see of the launch planning (launch.h includes this): the
// figures a kernel is built for and the parameters it takes. Compiled by
// NVRTC (csrc/cuda/build_kernels.py hands it the standard headers it lacks:
// <cstdint>, <cstring>, <type_traits>) and by the host compiler, so it holds
// nothing but these.
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

// A kernel's one parameter: its jobs, read in place (csrc/cuda/kernels.cu).
// The host fills it in (launch.h row_jobs / col_jobs) for both compilers'
// kernels (NVRTC's through cuLaunchKernel, which copies these bytes as they
// are). CTAs [0, first_ctas) of the grid run job 0's tiles, the rest job
// 1's (cta_tiles; launch.cpp split_grid sizes it): each CTA one job, so that
// a kernel compiles one copy of each tile body, not one per job.
template <class Job>
struct Jobs {
  Job job[kMaxJobs];
  uint32_t first_ctas;
};

// Which job CTA `cta` of `grid` runs, and its tiles: first, first + stride,
// ... of that job's (a grid-stride loop over the job's own CTAs). The kernels
// and the host harness's run_launch both take it from here.
struct CtaTiles {
  int job;
  uint32_t first, stride;
};
FLASHMLA_PERM_HOST_DEVICE CtaTiles cta_tiles(uint32_t cta, uint32_t grid, uint32_t first_ctas) {
  const int job = cta >= first_ctas ? 1 : 0;
  return {job, job ? cta - first_ctas : cta, job ? grid - first_ctas : first_ctas};
}

}  // namespace flashmla_perm
