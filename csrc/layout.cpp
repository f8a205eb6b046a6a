#include "layout.h"

namespace flashmla_perm {

std::optional<RowTarget> row_target(const at::Tensor& t) {
  if (t.dim() == 0) return std::nullopt;
  const int64_t e = t.element_size();
  int64_t expected = 1;  // elements
  for (int64_t i = t.dim() - 1; i >= 1; --i) {
    if (t.size(i) != 1 && t.stride(i) != expected) return std::nullopt;
    expected *= t.size(i);
  }
  const int64_t row_bytes = expected * e;
  const int64_t row_stride = t.size(0) > 1 ? t.stride(0) * e : row_bytes;
  if (row_stride < row_bytes) return std::nullopt;
  return RowTarget{static_cast<uint8_t*>(t.data_ptr()), row_stride, row_bytes};
}

std::optional<ColShape> col_shape(const at::Tensor& t) {
  if (t.dim() == 0) return std::nullopt;
  const int64_t e = t.element_size();
  const int64_t cols = t.size(-1);
  if (cols != 1 && t.stride(-1) != 1) return std::nullopt;
  int64_t rows = 1, row_stride = -1, expected = 0;
  for (int64_t i = t.dim() - 2; i >= 0; --i) {
    rows *= t.size(i);
    if (t.size(i) == 1) continue;
    if (row_stride < 0) {
      row_stride = t.stride(i);
    } else if (t.stride(i) != expected) {
      return std::nullopt;
    }
    expected = t.stride(i) * t.size(i);
  }
  if (row_stride < 0) row_stride = cols;  // a single row
  if (row_stride < cols) return std::nullopt;
  return ColShape{rows, row_stride * e, cols * e};
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
