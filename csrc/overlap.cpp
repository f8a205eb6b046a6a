#include "overlap.h"

#include <algorithm>
#include <numeric>

namespace flashmla_perm {
namespace {

// Overflow anywhere means a layout no memory can hold; the search then
// answers kUnknown (refused) rather than reason on wrapped numbers.
bool add(int64_t a, int64_t b, int64_t* r) { return !__builtin_add_overflow(a, b, r); }
bool mul(int64_t a, int64_t b, int64_t* r) { return !__builtin_mul_overflow(a, b, r); }

struct Search {
  int64_t left;  // sub-problems it may still visit
};

// Sum of (size - 1) * pitch: the largest reachable value. False on overflow.
bool span_of(const std::vector<Dim>& dims, int64_t* span) {
  *span = 0;
  for (const Dim& d : dims) {
    int64_t t = 0;
    if (!mul(d.size - 1, d.pitch, &t) || !add(*span, t, span)) return false;
  }
  return true;
}

// Whether target = sum_k z_k * dims[k].pitch for some 0 <= z_k < dims[k].size
// (pitches >= 0, sizes >= 1).
Overlap reach(int64_t target, std::vector<Dim> dims, Search& s) {
  if (--s.left < 0) return Overlap::kUnknown;
  // Dims that add nothing (one index, or pitch 0) cannot help reach anything.
  dims.erase(
      std::remove_if(dims.begin(), dims.end(), [](const Dim& d) { return d.size <= 1 || d.pitch == 0; }),
      dims.end());
  int64_t span = 0;
  if (!span_of(dims, &span)) return Overlap::kUnknown;
  if (target < 0 || target > span) return Overlap::kNo;
  if (dims.empty()) return target == 0 ? Overlap::kYes : Overlap::kNo;
  // Every sum is a multiple of the pitches' gcd.
  int64_t g = 0;
  for (const Dim& d : dims) g = std::gcd(g, d.pitch);
  if (target % g != 0) return Overlap::kNo;
  target /= g;
  for (Dim& d : dims) d.pitch /= g;
  // Two dims whose sums leave no gap are one: pitch q = k * p with k <= the
  // smaller dim's size gives p * [0, (m_p - 1) + k * (m_q - 1)], all of it.
  // (Slices of one buffer have pitches that are multiples of each other.)
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.pitch < b.pitch; });
  for (bool merged = true; merged;) {
    merged = false;
    for (size_t j = 1; j < dims.size() && !merged; ++j)
      for (size_t i = 0; i < j && !merged; ++i) {
        if (dims[j].pitch % dims[i].pitch != 0) continue;
        const int64_t k = dims[j].pitch / dims[i].pitch;
        int64_t grown = 0;
        if (k > dims[i].size || !mul(k, dims[j].size - 1, &grown) || !add(grown, dims[i].size, &grown))
          continue;
        dims[i].size = grown;
        dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(j));
        merged = true;
      }
  }
  // One dim left has pitch 1 (the gcd is out) and target is within its span.
  if (dims.size() == 1) return Overlap::kYes;
  // Fix the largest pitch's index z: the rest must reach target - z * pitch,
  // within [0, rest]. When the pitch exceeds the rest's span, one z at most.
  const Dim last = dims.back();
  dims.pop_back();
  int64_t rest = 0;
  span_of(dims, &rest);  // no overflow: part of `span`
  const int64_t lo = target <= rest ? 0 : (target - rest - 1) / last.pitch + 1;  // ceil, no overflow
  const int64_t hi = std::min(last.size - 1, target / last.pitch);
  bool unknown = false;
  for (int64_t z = lo; z <= hi; ++z) {
    if (s.left <= 0) return Overlap::kUnknown;
    const Overlap o = reach(target - z * last.pitch, dims, s);
    if (o == Overlap::kYes) return o;
    unknown = unknown || o == Overlap::kUnknown;
  }
  return unknown ? Overlap::kUnknown : Overlap::kNo;
}

// Negative pitches flipped (the offset moves to the lowest element) and
// one-index dims dropped: the same set of bytes. False on overflow.
bool normalised(ByteLayout& t) {
  std::vector<Dim> dims;
  for (Dim d : t.dims) {
    if (d.size == 1) continue;
    if (d.pitch < 0) {
      int64_t shift = 0;
      if (d.pitch == INT64_MIN || !mul(d.size - 1, d.pitch, &shift) || !add(t.offset, shift, &t.offset))
        return false;
      d.pitch = -d.pitch;
    }
    dims.push_back(d);
  }
  t.dims = std::move(dims);
  return true;
}

bool empty(const ByteLayout& t) {
  return std::any_of(t.dims.begin(), t.dims.end(), [](const Dim& d) { return d.size <= 0; });
}

// a's bytes meet b's: a0 + sum x p + e = b0 + sum y q + e'. With y -> (m - 1) - y
// and e' -> (eb - 1) - e' that is one reach: sum x p + sum y q + (e + e') =
// b0 - a0 + span(b) + eb - 1, the bytes e + e' being one dim of pitch 1.
Overlap meet(ByteLayout a, ByteLayout b, Search& s) {
  if (empty(a) || empty(b)) return Overlap::kNo;
  if (!normalised(a) || !normalised(b)) return Overlap::kUnknown;
  int64_t span_b = 0, target = 0, bytes = 0;
  if (!span_of(b.dims, &span_b) || __builtin_sub_overflow(b.offset, a.offset, &target) ||
      !add(target, span_b, &target) || !add(target, b.element_size - 1, &target) ||
      !add(a.element_size, b.element_size - 1, &bytes))
    return Overlap::kUnknown;
  std::vector<Dim> dims = a.dims;
  dims.insert(dims.end(), b.dims.begin(), b.dims.end());
  dims.push_back({bytes, 1});
  return reach(target, std::move(dims), s);
}

}  // namespace

Overlap overlap(const ByteLayout& a, const ByteLayout& b, int64_t budget) {
  Search s{budget};
  return meet(a, b, s);
}

Overlap self_overlap(const ByteLayout& t_in, int64_t budget) {
  ByteLayout t = t_in;
  if (empty(t)) return Overlap::kNo;
  if (!normalised(t)) return Overlap::kUnknown;
  std::stable_sort(t.dims.begin(), t.dims.end(),
                   [](const Dim& a, const Dim& b) { return a.pitch < b.pitch; });
  // Two distinct elements x != y: let k be the last dim (by pitch) where they
  // differ, x_k > y_k. Dims after k cancel, so the element at d * pitch_k
  // (1 <= d < size_k) plus the dims before k meets the dims before k alone.
  // Dims by pitch ascending: for layouts with each pitch past the span of
  // the dims before it, every sub-problem fails at its first bounds check.
  Search s{budget};
  bool unknown = false;
  for (size_t k = 0; k < t.dims.size(); ++k) {
    const std::vector<Dim> inner(t.dims.begin(), t.dims.begin() + static_cast<std::ptrdiff_t>(k));
    ByteLayout shifted{t.dims[k].pitch, t.element_size, inner};
    shifted.dims.push_back({t.dims[k].size - 1, t.dims[k].pitch});
    const Overlap o = meet(shifted, ByteLayout{0, t.element_size, inner}, s);
    if (o == Overlap::kYes) return o;
    unknown = unknown || o == Overlap::kUnknown;
  }
  return unknown ? Overlap::kUnknown : Overlap::kNo;
}

}  // namespace flashmla_perm
