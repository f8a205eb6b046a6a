// Plans with their index arrays, copied once to each device that uses them,
// and a bounded, thread-safe cache of the model-level plans: loading 43
// layers builds one plan per tensor kind and copies nothing host-to-device
// after the first layer.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "counters.h"  // cached_plan_count, plans_built, clear_model_plans
#include "plan.h"

namespace flashmla_perm {

class DeviceCopies {
 public:
  explicit DeviceCopies(at::Tensor host) : host_(std::move(host)) {}
  // The host array on `device` (the host array itself for the CPU); the
  // first call for a device copies it there (a blocking copy).
  at::Tensor on(const at::Device& device) const;
  // Whether on(device) needs no copy.
  bool has(const at::Device& device) const;

 private:
  at::Tensor host_;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<at::Device, at::Tensor>> copies_;
};

struct RowPlanEntry {
  explicit RowPlanEntry(RowPlan p);
  RowPlan plan;
  DeviceCopies arrays;  // plan.index: order, then segments (int32)
};

struct ColPlanEntry {
  explicit ColPlanEntry(ColPlan p);
  ColPlan plan;
  DeviceCopies arrays;  // source_offset (int32)
  // The permutation as a row plan over blocks of columns, for in-place
  // gathers of rows too wide for a GPU tile buffer; built on first use.
  const RowPlanEntry& units() const;

 private:
  mutable std::once_flag units_once_;
  mutable std::unique_ptr<RowPlanEntry> units_;
};

enum class ColKind { kQ, kO, kOChunk };

std::shared_ptr<const RowPlanEntry> cached_q_row_plan(int64_t num_heads, int64_t head_dim, bool inverse);
std::shared_ptr<const ColPlanEntry> cached_col_plan(ColKind kind, int64_t heads, int64_t head_dim,
                                                    int64_t element_size, bool inverse);
// Keeps an entry alive for good: a captured CUDA graph replays kernels that
// read its device arrays long after the call that captured them.
void keep_for_graphs(std::shared_ptr<const void> entry);

// Bound of each model-plan cache; counters.h has the counts and the clear.
constexpr int64_t kPlanCacheCapacity = 64;

}  // namespace flashmla_perm
