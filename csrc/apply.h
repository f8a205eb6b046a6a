// Apply a validated plan to a tensor: pick the executor for its device and
// layout, or the ATen gather (same bytes) where no executor applies.
#pragma once

#include <ATen/ATen.h>

#include "plan_cache.h"

namespace flashmla_perm {

void apply_rows(const at::Tensor& t, const RowPlanEntry& entry);
void apply_cols(const at::Tensor& t, const ColPlanEntry& entry);
at::Tensor applied_cols(const at::Tensor& src, const ColPlanEntry& entry);  // out of place

// How many calls each path served (tests assert the native path really ran).
enum class Path { kCpu = 0, kCuda = 1, kAten = 2 };
int64_t path_count(Path path);

}  // namespace flashmla_perm
