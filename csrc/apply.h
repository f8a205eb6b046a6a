// Apply validated plans to tensors of any layout: pick the engine for each
// tensor's layout (csrc/strided.h) and the executor for its device, or the
// ATen gather (same bytes) on devices with no native kernels. Everything a
// call needs (views, device arrays) is gathered before its first byte moves.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "counters.h"  // Path, path_count
#include "plan_cache.h"

namespace flashmla_perm {

using RowEntry = std::shared_ptr<const RowPlanEntry>;
using ColEntry = std::shared_ptr<const ColPlanEntry>;

// In place: dim `dim` of each tensor by one row plan, any layout (a model
// op's weight and scale: one launch on CUDA). Tensors are on one device.
struct RowTarget {
  at::Tensor t;
  int64_t dim;
};
void apply_rows(const std::vector<RowTarget>& targets, const RowEntry& entry);

// In place: dim `dim` of each tensor by its own column plan. Where the dim
// has stride 1 its indices gather within rows (one launch on CUDA for rows
// that fit a tile buffer); any other stride takes the plan's row form.
// packed_words: t is int32 words of four packed bytes and the plan permutes
// the bytes of each row of the last dim (FlashMLA's packed ue8m0 scales).
struct ColTarget {
  at::Tensor t;
  int64_t dim;
  ColEntry entry;
  bool packed_words = false;
};
// `op` names the caller in errors.
void apply_cols(const std::vector<ColTarget>& work, const char* op = "flashmla_perm");

// Out of place: the last dim of src gathered into a new contiguous tensor.
at::Tensor applied_cols(const at::Tensor& src, const ColEntry& entry);

}  // namespace flashmla_perm
