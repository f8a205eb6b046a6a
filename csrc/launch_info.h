// flashmla_perm._C.gpu_launches: the CUDA executor's launches for a model
// op, computed by launch.h on this host (CPU builds too), for
// device/model.py and the tests. Plain C++ here: module.cpp, the one
// translation unit that includes pybind11, turns these into Python dicts.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace flashmla_perm {

// One job of a launch: its tile kind and the performance model's figures.
struct JobInfo {
  const char* kind;  // "rows", "save_heads", "cols_staged" or "cols_direct"
  int vec;
  int64_t tiles;
  int64_t bytes;
  int64_t max_tile_bytes;
  int64_t inflight_bytes;
  bool gathered_stage;  // column jobs: gathered in the stage loop, stored linearly (gathers_in_stage)
  // Row jobs: vectors a line of a full byte slice holds, and a whole line
  // (the last slice holds the rest); the row loops cost a warp's line setup
  // once per line (tile_bodies.h Warp). Column jobs: 0.
  int64_t slice_vectors;
  int64_t line_vectors;
};

// One kernel launch, as the CUDA executor would make it.
struct LaunchInfo {
  const char* kernel;  // "rows", "save_heads" or "cols"
  int64_t grid;
  int threads;
  int64_t smem_bytes;
  int stages;  // tile buffers per CTA cycles through (Launch::stages)
  int ctas_per_sm;
  int64_t tiles;
  std::vector<JobInfo> jobs;
};

// DeviceSpec fields (launch.h) by name; the ones absent keep the H200's.
// Registers per thread as regs_rows, regs_save_heads, regs_cols, or
// regs_per_thread for all three. Other names are ignored.
using DeviceFields = std::map<std::string, int64_t>;

// The launches apply.cpp makes for `op` on tensors of `dims` (see
// launch_info.cpp for each op's dims). Throws std::invalid_argument on an
// unknown op, a wrong number of dims or a dim that is not positive.
std::vector<LaunchInfo> gpu_launches(const std::string& op, const std::vector<int64_t>& dims,
                                     const DeviceFields& device);

struct DeviceSpec;
// A DeviceSpec as the fields above (gpu_launches(op, dims, device_fields(spec))
// plans as the executor does with that spec).
DeviceFields device_fields(const DeviceSpec& spec);
// Every field of the DeviceSpec that gpu_launches plans with for `device`.
DeviceFields device_fields(const DeviceFields& device);

// The CUDA executor's view of GPU `index` (CUDA builds; elsewhere they throw
// std::runtime_error): the DeviceSpec it plans with, as fields, and the CTAs
// per SM that the runtime's occupancy calculator lets a launch of `kernel`
// ("rows", "save_heads" or "cols") hold. The device check's runtime tests
// hold every planned ctas_per_sm against the second.
DeviceFields cuda_device_fields(int index);
int cuda_resident_ctas_per_sm(const std::string& kernel, int threads, int64_t smem_bytes, int index);
// The launches of gpu_launches(op, dims) planned with GPU `index`'s figures
// and kernels, as the driver gives them (the kernels loaded as a first call
// loads them), checked and enqueued on its null stream: the host side of a
// GPU call, for the stand-in driver's tests (tests/stub_cuda). Its fake
// addresses would fault on a GPU: refused unless the driver is the stand-in.
std::vector<LaunchInfo> cuda_driver_launches(const std::string& op, const std::vector<int64_t>& dims,
                                             int index);

// What gpu_launches is made of (launch.h's Launch, planned on fake addresses).
struct Launch;
std::vector<Launch> launches_for(const std::string& op, const std::vector<int64_t>& dims,
                                 const DeviceSpec& dev);
LaunchInfo launch_info(const Launch& l);

}  // namespace flashmla_perm
