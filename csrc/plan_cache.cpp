#include "plan_cache.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <atomic>
#include <tuple>

#include "bounded_cache.h"

namespace flashmla_perm {

at::Tensor DeviceCopies::on(const at::Device& device) const {
  if (device.is_cpu()) return host_;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [d, t] : copies_)
    if (d == device) return t;
  copies_.emplace_back(device, host_.to(device));
  return copies_.back().second;
}

bool DeviceCopies::has(const at::Device& device) const {
  if (device.is_cpu()) return true;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [d, t] : copies_)
    if (d == device) return true;
  return false;
}

namespace {

using RowKey = std::tuple<int64_t, int64_t, bool>;
using ColKey = std::tuple<int, int64_t, int64_t, int64_t, bool>;
// Never destroyed: device copies must not be freed after CUDA shuts down at exit.
BoundedCache<RowKey, RowPlanEntry>& row_cache() {
  static auto* cache = new BoundedCache<RowKey, RowPlanEntry>(kPlanCacheCapacity);
  return *cache;
}
BoundedCache<ColKey, ColPlanEntry>& col_cache() {
  static auto* cache = new BoundedCache<ColKey, ColPlanEntry>(kPlanCacheCapacity);
  return *cache;
}

std::atomic<int64_t> built{0};

std::vector<int64_t> maybe_inverse(std::vector<int64_t> perm, bool inverse) {
  return inverse ? inverse_permutation(perm) : perm;
}

}  // namespace

// A plan's array as a tensor over the plan's own memory (no second host
// copy; the entry owns both, and the plan never changes).
static at::Tensor aliased(const std::vector<int32_t>& v) {
  if (v.empty()) return at::empty({0}, at::kInt);
  return at::from_blob(const_cast<int32_t*>(v.data()), {static_cast<int64_t>(v.size())}, at::kInt);
}

RowPlanEntry::RowPlanEntry(RowPlan p) : plan(std::move(p)), arrays(aliased(plan.index)) {
  built.fetch_add(1, std::memory_order_relaxed);
}

ColPlanEntry::ColPlanEntry(ColPlan p) : plan(std::move(p)), arrays(aliased(plan.source_offset)) {
  built.fetch_add(1, std::memory_order_relaxed);
}

const RowPlanEntry& ColPlanEntry::units() const {
  // The model ops' permutations are short: rebuilding the values costs little.
  std::call_once(units_once_,
                 [&] { units_ = std::make_unique<RowPlanEntry>(make_row_plan(permutation_of(plan))); });
  return *units_;
}

void keep_for_graphs(std::shared_ptr<const void> entry) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<const void>>();  // never destroyed, as the caches
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& e : *kept)
    if (e == entry) return;
  kept->push_back(std::move(entry));
}

std::shared_ptr<const RowPlanEntry> cached_q_row_plan(int64_t num_heads, int64_t head_dim, bool inverse) {
  return row_cache().get({num_heads, head_dim, inverse}, [&] {
    return make_row_plan(maybe_inverse(q_fused_permutation(num_heads, head_dim), inverse));
  });
}

std::shared_ptr<const ColPlanEntry> cached_col_plan(ColKind kind, int64_t heads, int64_t head_dim,
                                                    int64_t element_size, bool inverse) {
  return col_cache().get({static_cast<int>(kind), heads, head_dim, element_size, inverse}, [&] {
    std::vector<int64_t> perm = kind == ColKind::kQ   ? q_fused_permutation(heads, head_dim)
                                : kind == ColKind::kO ? o_fused_permutation(heads, head_dim)
                                                      : o_fused_chunk_permutation(heads, head_dim);
    return make_col_plan(maybe_inverse(std::move(perm), inverse), element_size);
  });
}

int64_t cached_plan_count() { return row_cache().size() + col_cache().size(); }

int64_t plans_built() { return built.load(std::memory_order_relaxed); }

void clear_model_plans() {
  row_cache().clear();
  col_cache().clear();
}

}  // namespace flashmla_perm
