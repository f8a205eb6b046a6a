// Prepared permutations for the generic ops (permute_, permute_cols, ...): a
// caller's `perm`, validated and planned once, then found again on every
// later call, so a permutation applied to 43 layers pays its host work (and
// its host-to-device copy) once.
//
// Two ways to find one:
// - a CPU perm by its values (hashed, then compared): a fresh tensor with the
//   same values hits too, and reading it needs no device sync;
// - a device perm by the tensor itself, unchanged since (same TensorImpl,
//   same version counter, same data pointer): reading its values would be a
//   blocking device-to-host copy, and a hit needs none.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "counters.h"  // prepared_count, clear_prepared
#include "plan_cache.h"

namespace flashmla_perm {

// One permutation's plans, each built on first use and kept.
class PreparedPerm {
 public:
  explicit PreparedPerm(std::vector<int64_t> values)
      : values_(std::make_shared<const std::vector<int64_t>>(std::move(values))) {}
  int64_t size() const { return static_cast<int64_t>(values_->size()); }
  // Cycle segments of rows (a dim of any stride but 1).
  std::shared_ptr<const RowPlanEntry> rows() const;
  // A gather map for elements of `element_size` bytes (a dim of stride 1).
  std::shared_ptr<const ColPlanEntry> cols(int64_t element_size) const;
  bool same_values(const int64_t* values, int64_t n) const {
    return n == size() && std::equal(values_->begin(), values_->end(), values);
  }

 private:
  const SharedPerm values_;  // one copy, shared with the plans
  mutable std::mutex mu_;
  mutable std::shared_ptr<const RowPlanEntry> rows_;
  mutable std::map<int64_t, std::shared_ptr<const ColPlanEntry>> cols_;
};

// `perm` checked (dtype, shape, device, a permutation of [0, extent)) and
// prepared; errors name `op` and raise before anything moves.
std::shared_ptr<const PreparedPerm> prepared_permutation(const at::Tensor& perm, int64_t extent,
                                                         const at::Device& device, const char* op);

}  // namespace flashmla_perm
