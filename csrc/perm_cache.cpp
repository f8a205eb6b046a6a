#include "perm_cache.h"

#include <ATen/Parallel.h>
#include <c10/util/intrusive_ptr.h>

#include <stdexcept>
#include <utility>

#include "bounded_cache.h"
#include "checks.h"
#ifdef FLASHMLA_PERM_WITH_CUDA
#include "executors.h"
#endif

namespace flashmla_perm {

const int64_t* PreparedPerm::values_or_plans(const int64_t* values, std::vector<int64_t>& into) const {
  if (values) return values;
  if (rows_) {
    into = permutation_of(rows_->plan);
  } else {
    TORCH_INTERNAL_ASSERT(!cols_.empty(), "a prepared permutation with no plan needs its values");
    into = permutation_of(cols_.begin()->second->plan);
  }
  return into.data();
}

std::shared_ptr<const RowPlanEntry> PreparedPerm::rows(const int64_t* values) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!rows_) {
    std::vector<int64_t> read_back;
    try {
      rows_ = std::make_shared<const RowPlanEntry>(make_row_plan(
          values_or_plans(values, read_back), size_, kMaxSegment, kPackCyclesAbove, at::get_num_threads()));
    } catch (const std::invalid_argument& e) {  // over 2^31 - 1 units: the ops' ValueError
      TORCH_CHECK_VALUE(false, e.what());
      throw;
    }
  }
  return rows_;
}

std::shared_ptr<const ColPlanEntry> PreparedPerm::cols(int64_t element_size, const int64_t* values) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = cols_.find(element_size);
  if (found != cols_.end()) return found->second;
  std::vector<int64_t> read_back;
  auto made = std::make_shared<const ColPlanEntry>(
      make_col_plan(values_or_plans(values, read_back), size_, element_size));
  cols_.emplace(element_size, made);
  return made;
}

bool PreparedPerm::has_plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rows_ || !cols_.empty();
}

bool PreparedPerm::same_values(const int64_t* values, int64_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (rows_) return applies(rows_->plan, values, n);
  return !cols_.empty() && applies(cols_.begin()->second->plan, values, n);
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
    return alive.get() == perm.unsafeGetTensorImpl() && static_cast<int64_t>(perm._version()) == version &&
           perm.data_ptr() == data;
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

// A fresh prepared permutation keeps no values: it is cached once it has a
// plan to compare with (prepared_permutation's caller builds one at once).
std::shared_ptr<const PreparedPerm> prepared_by_values(const at::Tensor& host, const char* op) {
  const int64_t* p = host.data_ptr<int64_t>();
  const int64_t n = host.numel();
  const ValueKey key{hash_of(p, n), n};
  auto found = by_values().find(key);
  if (found && found->same_values(p, n)) return found;
  check_perm_values(p, n, op);
  auto made = std::make_shared<const PreparedPerm>(n);
  if (!found || !found->has_plans()) by_values().put(key, made);  // (a hash collision is simply not cached)
  return made;
}

}  // namespace

const int64_t* CallPerm::values() const {
  if (!host_.defined()) {
    if (prepared_->has_plans()) return nullptr;  // no device-to-host copy
    host_ = host_values(perm_);
  }
  return host_.data_ptr<int64_t>();
}

CallPerm prepared_permutation(const at::Tensor& perm, int64_t extent, const at::Device& device,
                              const char* op) {
  check_perm_tensor(perm, extent, device, op);
  if (perm.device().is_cpu()) {
    at::Tensor host = host_values(perm);
    return CallPerm(prepared_by_values(host, op), perm, host);
  }
  // Inference tensors have no version counter: nothing proves them unchanged.
  const bool trackable = !perm.is_inference();
  if (trackable) {
    const auto seen = by_device_tensor().find(perm.unsafeGetTensorImpl());
    if (seen && seen->matches(perm)) return CallPerm(seen->prepared, perm, at::Tensor());
  }
#ifdef FLASHMLA_PERM_WITH_CUDA
  // A capturing stream cannot take the blocking copy below (CUDA would end
  // the capture with an error of its own): say what to do instead.
  TORCH_CHECK(!perm.is_cuda() || !cuda_capturing(perm.device()), op,
              ": perm is a CUDA tensor whose values this module has not read yet (new, written since, "
              "or an inference tensor, which it reads on every call), and the stream is capturing "
              "a CUDA graph; call the op with it once before capture (warm-up), or pass a CPU perm");
#endif
  at::Tensor host = host_values(perm);  // a blocking copy, once
  auto prepared = prepared_by_values(host, op);
  if (trackable) {
    by_device_tensor().put(perm.unsafeGetTensorImpl(),
                           std::make_shared<const DeviceSeen>(
                               DeviceSeen{c10::weak_intrusive_ptr<c10::TensorImpl>(perm.getIntrusivePtr()),
                                          static_cast<int64_t>(perm._version()), perm.data_ptr(), prepared}));
  }
  return CallPerm(std::move(prepared), perm, host);
}

int64_t prepared_count() { return by_values().size() + by_device_tensor().size(); }

void clear_prepared() {
  by_values().clear();
  by_device_tensor().clear();
}

}  // namespace flashmla_perm
