#include "perm_cache.h"

#include <c10/util/intrusive_ptr.h>

#include <utility>

#include "bounded_cache.h"
#include "checks.h"

namespace flashmla_perm {

std::shared_ptr<const RowPlanEntry> PreparedPerm::rows() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!rows_) rows_ = std::make_shared<const RowPlanEntry>(make_row_plan(values_));
  return rows_;
}

std::shared_ptr<const ColPlanEntry> PreparedPerm::cols(int64_t element_size) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto& entry = cols_[element_size];
  if (!entry) entry = std::make_shared<const ColPlanEntry>(make_col_plan(values_, element_size));
  return entry;
}

namespace {

uint64_t hash_of(const int64_t* values, int64_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(n);
  for (int64_t i = 0; i < n; ++i) {
    h ^= static_cast<uint64_t>(values[i]) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  }
  return h;
}

// A device perm as it was when prepared: the same tensor (held weakly, so
// that a freed one whose address is reused never matches), not written since.
struct DeviceSeen {
  c10::weak_intrusive_ptr<c10::TensorImpl> impl;
  int64_t version;
  const void* data;
  std::shared_ptr<const PreparedPerm> prepared;

  bool matches(const at::Tensor& perm) const {
    const auto alive = impl.lock();
    return alive.get() == perm.unsafeGetTensorImpl() &&
           static_cast<int64_t>(perm._version()) == version && perm.data_ptr() == data;
  }
};

using ValueKey = std::pair<uint64_t, int64_t>;  // hash, length
// Never destroyed, as the model-plan caches: device copies outlive CUDA's shutdown otherwise.
BoundedCache<ValueKey, PreparedPerm>& by_values() {
  static auto* cache = new BoundedCache<ValueKey, PreparedPerm>(kPlanCacheCapacity);
  return *cache;
}
BoundedCache<const c10::TensorImpl*, DeviceSeen>& by_device_tensor() {
  static auto* cache = new BoundedCache<const c10::TensorImpl*, DeviceSeen>(kPlanCacheCapacity);
  return *cache;
}

// perm's values on the host as contiguous int64: the tensor itself where it
// is one already (no copy per call), else a converted copy.
at::Tensor host_values(const at::Tensor& perm) { return perm.to(at::kCPU, at::kLong).contiguous(); }

std::shared_ptr<const PreparedPerm> prepared_by_values(const at::Tensor& host, const char* op) {
  const int64_t* p = host.data_ptr<int64_t>();
  const int64_t n = host.numel();
  const ValueKey key{hash_of(p, n), n};
  auto found = by_values().find(key);
  if (found && found->same_values(p, n)) return found;
  std::vector<int64_t> values(p, p + n);
  check_perm_values(values, op);
  auto made = std::make_shared<const PreparedPerm>(std::move(values));
  if (!found) by_values().put(key, made);  // (a hash collision is simply not cached)
  return made;
}

}  // namespace

std::shared_ptr<const PreparedPerm> prepared_permutation(const at::Tensor& perm, int64_t extent,
                                                         const at::Device& device, const char* op) {
  check_perm_tensor(perm, extent, device, op);
  if (perm.device().is_cpu()) return prepared_by_values(host_values(perm), op);
  // Inference tensors have no version counter: nothing proves them unchanged.
  const bool trackable = !perm.is_inference();
  if (trackable) {
    const auto seen = by_device_tensor().find(perm.unsafeGetTensorImpl());
    if (seen && seen->matches(perm)) return seen->prepared;
  }
  auto prepared = prepared_by_values(host_values(perm), op);  // a blocking copy, once
  if (trackable) {
    by_device_tensor().put(perm.unsafeGetTensorImpl(),
                           std::make_shared<const DeviceSeen>(DeviceSeen{
                               c10::weak_intrusive_ptr<c10::TensorImpl>(perm.getIntrusivePtr()),
                               static_cast<int64_t>(perm._version()), perm.data_ptr(), prepared}));
  }
  return prepared;
}

int64_t prepared_count() { return by_values().size() + by_device_tensor().size(); }

void clear_prepared() {
  by_values().clear();
  by_device_tensor().clear();
}

}  // namespace flashmla_perm
