// Executors: run planned tiles on one device. The op layer has already
// validated everything and chosen a layout the tile bodies handle; launch.h
// decides the tiling.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "launch.h"

namespace flashmla_perm {

// CPU: tiles on ATen's intra-op thread pool, one thread per tile.
void run_rows_cpu(const UnitView& view, const RowPlan& plan);
void run_cols_cpu(const ColView& view, const ColPlan& plan);

#ifdef FLASHMLA_PERM_WITH_CUDA
// The device's figures and the kernels' registers, queried once per device.
DeviceSpec cuda_device_spec(c10::Device device);
// Runs the launches in order on the device's current stream, allocating the
// scratch they ask for. `arrays` (the plans' index arrays, which the kernels
// read) are marked as used by that stream, so that they outlive its work
// even if the plan cache drops them meanwhile.
void run_cuda(std::vector<Launch> launches, c10::Device device,
              const std::vector<at::Tensor>& arrays);
// Whether the device's current stream is capturing a CUDA graph.
bool cuda_capturing(c10::Device device);
#endif

}  // namespace flashmla_perm
