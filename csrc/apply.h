// Apply a validated plan to tensors: pick the executor for their device and
// layout, or the ATen gather (same bytes) where no executor applies.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <utility>
#include <vector>

#include "plan_cache.h"

namespace flashmla_perm {

using RowEntry = std::shared_ptr<const RowPlanEntry>;
using ColEntry = std::shared_ptr<const ColPlanEntry>;

// In place: the rows of every tensor by one plan (a model op's weight and
// scale: one launch on CUDA). Tensors are on one device.
void apply_rows(const std::vector<at::Tensor>& tensors, const RowEntry& entry);
// In place: the last dim of each tensor by its own plan (one launch on CUDA
// where the rows fit a tile buffer).
void apply_cols(const std::vector<std::pair<at::Tensor, ColEntry>>& work);
// Out of place: a new contiguous tensor.
at::Tensor applied_cols(const at::Tensor& src, const ColEntry& entry);

// How many calls each path served (tests assert the native path really ran).
enum class Path { kCpu = 0, kCuda = 1, kAten = 2 };
int64_t path_count(Path path);

}  // namespace flashmla_perm
