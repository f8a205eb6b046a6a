// Apply validated plans to tensors of any layout: pick the engine for each
// tensor's layout (csrc/strided.h) and the executor for its device, or the
// ATen gather (same bytes) on devices with no native kernels. Everything a
// call needs (views, device arrays) is gathered before its first byte moves.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
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

// A column permutation's two forms, each built on first use, so that a call
// builds only the one its layout needs: the gather map (an int32 per chunk
// of a row, rows staged whole) or the cycle segments over blocks of columns
// (rows too wide to stage, or a dim of stride > 1).
struct ColForms {
  std::function<ColEntry()> cols;
  std::function<RowEntry()> rows;
};
// A model op's cached plan: its map, and its row form (ColPlanEntry::units).
ColForms forms_of(const ColEntry& entry);

// In place: dim `dim` of each tensor by its own column plan. Where the dim
// has stride 1 its indices gather within rows that fit a tile buffer (one
// launch on CUDA); wider rows and any other stride take the row form.
// packed_words: t is int32 words of four packed bytes and the plan permutes
// the bytes of each row of the last dim (FlashMLA's packed ue8m0 scales).
struct ColTarget {
  at::Tensor t;
  int64_t dim;
  ColForms plans;
  bool packed_words = false;
};
// `op` names the caller in errors.
void apply_cols(const std::vector<ColTarget>& work, const char* op = "flashmla_perm");

// In place on the CPU, a CPU perm (checked: dtype, shape) whose units are
// narrow: lines of at most kCpuGatherBytesPerIndex bytes, a dim of stride 1
// only where its rows are too wide for the column engine. Gathered straight
// from perm's values, checked before any byte moves (csrc/cpu_gather.cpp):
// no plan is built or kept. False, nothing done and perm's values unread,
// where the path does not apply.
bool gather_narrow_cpu(const at::Tensor& self, int64_t dim, const at::Tensor& perm, const char* op);

// Out of place: the last dim of src gathered into a new contiguous tensor.
at::Tensor applied_cols(const at::Tensor& src, const ColForms& plans);

}  // namespace flashmla_perm
