#include "layout.h"

namespace flashmla_perm {

uint8_t* bytes_of(const at::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }

Dim dim_of(const at::Tensor& t, int64_t dim) {
  return Dim{t.size(dim), t.stride(dim) * static_cast<int64_t>(t.element_size())};
}

std::vector<Dim> dims_except(const at::Tensor& t, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, t.dim());
  std::vector<Dim> dims;
  for (int64_t i = t.dim() - 1; i >= 0; --i)
    if (i != dim) dims.push_back(dim_of(t, i));
  return dims;
}

namespace {
ByteLayout layout_at(const at::Tensor& t, int64_t offset) {
  ByteLayout b{offset, static_cast<int64_t>(t.element_size()), {}};
  for (int64_t i = 0; i < t.dim(); ++i) b.dims.push_back(dim_of(t, i));
  return b;
}
}  // namespace

ByteLayout byte_layout(const at::Tensor& t) {
  return layout_at(t, static_cast<int64_t>(reinterpret_cast<intptr_t>(t.data_ptr())));
}

// One tensor: only the pitches matter.
Overlap self_overlap(const at::Tensor& t) { return self_overlap(layout_at(t, 0)); }

bool engine_layout(const at::Tensor& t) {
  std::vector<Dim> dims;
  for (int64_t i = 0; i < t.dim(); ++i) dims.push_back(dim_of(t, i));
  return provably_disjoint(std::move(dims), static_cast<int64_t>(t.element_size()));
}

at::Tensor bits_view(const at::Tensor& t) {
  switch (t.element_size()) {
    case 1: return t.view(at::kByte);
    case 2: return t.view(at::kShort);
    case 4: return t.view(at::kInt);
    case 8: return t.view(at::kLong);
    default: return t;
  }
}

}  // namespace flashmla_perm
