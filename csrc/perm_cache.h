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

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "counters.h"  // prepared_count, clear_prepared
#include "plan_cache.h"

namespace flashmla_perm {

// One permutation's plans, each built on first use and kept. It keeps no
// copy of the values: a plan is built from the caller's values, or rebuilt
// from a plan already built, and a lookup by values compares them with a plan.
class PreparedPerm {
 public:
  explicit PreparedPerm(int64_t size) : size_(size) {}
  int64_t size() const { return size_; }
  // `values`: the permutation on the host, or null where has_plans() (the
  // values are then read back from a plan).
  // Cycle segments of rows (a dim of any stride but 1, or rows too wide to stage).
  std::shared_ptr<const RowPlanEntry> rows(const int64_t* values) const;
  // A gather map for elements of `element_size` bytes (a dim of stride 1).
  std::shared_ptr<const ColPlanEntry> cols(int64_t element_size, const int64_t* values) const;
  bool has_plans() const;
  // Whether values[0..n) is this permutation (false while no plan is built).
  bool same_values(const int64_t* values, int64_t n) const;

 private:
  // values, or (null) the values read back from a plan into `into`; mu_ held.
  const int64_t* values_or_plans(const int64_t* values, std::vector<int64_t>& into) const;
  const int64_t size_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const RowPlanEntry> rows_;
  mutable std::map<int64_t, std::shared_ptr<const ColPlanEntry>> cols_;
};

// One call's permutation: its prepared plans, and the caller's tensor to read
// the values from should the call need a plan not built yet (a CPU perm's
// values are at hand; a device perm's are copied only then).
class CallPerm {
 public:
  CallPerm(std::shared_ptr<const PreparedPerm> prepared, at::Tensor perm, at::Tensor host)
      : prepared_(std::move(prepared)), perm_(std::move(perm)), host_(std::move(host)) {}
  std::shared_ptr<const RowPlanEntry> rows() const { return prepared_->rows(values()); }
  std::shared_ptr<const ColPlanEntry> cols(int64_t element_size) const {
    return prepared_->cols(element_size, values());
  }

 private:
  const int64_t* values() const;
  std::shared_ptr<const PreparedPerm> prepared_;
  at::Tensor perm_;
  mutable at::Tensor host_;  // perm_'s values as host int64, where read
};

// `perm` checked (dtype, shape, device, a permutation of [0, extent)) and
// prepared; errors name `op` and raise before anything moves.
CallPerm prepared_permutation(const at::Tensor& perm, int64_t extent, const at::Device& device,
                              const char* op);

}  // namespace flashmla_perm
