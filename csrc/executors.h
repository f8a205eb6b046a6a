// Executors: run planned tiles on one device. The op layer has already
// validated everything and chosen a layout the tile bodies handle; launch.h
// decides the tiling.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "launch.h"

namespace flashmla_perm {

// CPU: tiles on ATen's intra-op thread pool, one thread per tile. What a job
// writes through is allocated by the caller before any job of the call moves
// a byte (so that a failed allocation leaves everything as it was): `scratch`,
// cpu_row_scratch_bytes of it a row job; `arena` (64-byte aligned, of
// `arena_bytes`), the threads' tile buffers, at least cpu_*_tile_bytes, one
// arena for a call's jobs in turn.
int64_t cpu_row_scratch_bytes(const UnitView& view, const RowPlan& plan);
int64_t cpu_row_tile_bytes(const UnitView& view, const RowPlan& plan);
int64_t cpu_col_tile_bytes(const ColView& view, const ColPlan& plan);
void run_rows_cpu(const UnitView& view, const RowPlan& plan, uint8_t* scratch, uint8_t* arena,
                  int64_t arena_bytes);
void run_cols_cpu(const ColView& view, const ColPlan& plan, uint8_t* arena, int64_t arena_bytes);

// CPU, narrow units (csrc/cpu_gather.cpp): destination i <- source perm[i]
// through a buffer of at most kCpuGatherBytesPerIndex an index (a few lines
// of every unit a pass, cpu_gather_buffer_bytes in all). For views whose
// lines are at most that wide (cpu_gathers). With `seen`
// (cpu_gather_check_words zeroed words), perm is checked in the first pass:
// false, nothing written, where it is not a permutation of [0, n); without,
// perm is one already.
constexpr int64_t kCpuGatherBytesPerIndex = 4;
bool cpu_gathers(const UnitView& view);
int64_t cpu_gather_check_words(int64_t n);
int64_t cpu_gather_buffer_bytes(const UnitView& view, int64_t n);
bool run_gather_cpu(const UnitView& view, const int64_t* perm, int64_t n, uint8_t* buffer, uint64_t* seen);
bool run_gather_cpu(const UnitView& view, const int32_t* perm, int64_t n, uint8_t* buffer, uint64_t* seen);

#ifdef FLASHMLA_PERM_WITH_CUDA
// The device's figures and the kernels' registers, queried once per device
// (its kernels loaded first); none where no kernel image loads on it, whose
// tensors torch's gather serves (cuda::device_origin says why).
std::optional<DeviceSpec> cuda_device_spec(c10::Device device);
// Runs groups of launches (each group from one gpu_*_launches call) in order
// on the device's current stream, allocating the scratch they ask for: all of
// it before the first launch, so that a failed allocation moves nothing.
// `arrays` (the plans' index arrays, which the kernels read) are marked as
// used by that stream, so that they outlive its work even if the plan cache
// drops them meanwhile.
void run_cuda(std::vector<std::vector<Launch>> groups, c10::Device device,
              const std::vector<at::Tensor>& arrays);
// Whether the device's current stream is capturing a CUDA graph.
bool cuda_capturing(c10::Device device);
#endif

}  // namespace flashmla_perm
