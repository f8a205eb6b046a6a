// The CUDA kernels on each device: the images built at install
// (cuda/kernel_images.h), loaded once per device through the driver API, the
// family's cubin, else the PTX (which the driver compiles once and caches
// itself), and launched on the caller's stream by their extern "C" names
// (csrc/cuda/kernels.cu). A device that takes neither is served by torch's
// gather; device_origin says why. Plain C++; failures throw std::runtime_error.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cuda/driver.h"
#include "launch.h"

namespace flashmla_perm {
namespace cuda {

// The images built at install ("sm_90", ..., "compute_80") and their compiler.
std::vector<std::string> installed();
const char* compiler();

// Loads the kernels on `device` (torch's CUDA index) once, with the device's
// primary context current and the caller's restored after; whether they
// loaded. The calls below expect them loaded and the context current
// (ContextGuard).
bool load(int device);
bool loaded(int device);
// "sm_90 cubin ..." or "compute_80 PTX ...", or why nothing loaded; "" before load.
std::string device_origin(int device);
// The same for every device loaded so far.
std::map<int, std::string> device_origins();
// Registers per thread (kCols: the larger of its two forms).
int registers(int device, Kernel kernel);
// CTAs of `kernel` (kCols: the fewer of its two forms) one SM holds at once,
// by the driver's occupancy calculator.
int resident_ctas_per_sm(int device, Kernel kernel, int threads, int64_t smem_bytes);
// Throws, saying what, where the driver would refuse launch `l` (grid, block,
// shared memory): run before the first of a call's launches is queued.
void check_launch(int device, const Launch& l);
// Enqueues one planned launch on `stream`.
void launch(int device, const Launch& l, CUstream stream);

}  // namespace cuda
}  // namespace flashmla_perm
