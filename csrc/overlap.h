// Exact overlap of strided byte sets: whether two tensors (or two distinct
// elements of one) share a byte, for any sizes, strides and offsets. Pure
// C++ (no ATen), so the host harness can use it; flashmla_perm/_checks.py
// has the same rule, step for step, so both paths give the same answer.
#pragma once

#include <cstdint>
#include <vector>

#include "strided.h"

namespace flashmla_perm {

// The bytes of a strided tensor: element x covers
// [offset + sum_k x_k * dims[k].pitch, ... + element_size). Bytes throughout.
struct ByteLayout {
  int64_t offset;
  int64_t element_size;
  std::vector<Dim> dims;
};

// kUnknown: the search gave up (see kOverlapBudget); callers refuse, since
// the layouts could not be proven apart.
enum class Overlap { kNo, kYes, kUnknown };

// Overlap is a bounded subset-sum problem. The search divides out gcds,
// merges dims whose sums leave no gaps, and fixes the largest pitch's index
// (one choice when that pitch exceeds the span of the rest: every layout
// torch makes by slicing, transposing, padding or narrowing one buffer is
// decided in about O(dims^2)). Where several choices remain it tries them
// all, visiting at most this many sub-problems before it gives up.
constexpr int64_t kOverlapBudget = int64_t{1} << 20;

// Some byte belongs to both a and b.
Overlap overlap(const ByteLayout& a, const ByteLayout& b, int64_t budget = kOverlapBudget);
// Some byte belongs to two distinct elements of t.
Overlap self_overlap(const ByteLayout& t, int64_t budget = kOverlapBudget);

}  // namespace flashmla_perm
