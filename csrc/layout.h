// Which tensor layouts the tile bodies handle. Anything else takes the ATen
// path (same bytes as the reference), never an error.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace flashmla_perm {

// Rows along dim 0, each row one contiguous block that no other row overlaps:
// row r starts at data + r * row_stride and is row_bytes contiguous bytes.
struct RowTarget {
  uint8_t* data;
  int64_t row_stride;
  int64_t row_bytes;
};
std::optional<RowTarget> row_target(const at::Tensor& t);

// Rows of the last dim: last dim contiguous, leading dims collapse into one
// row stride, rows do not overlap.
struct ColShape {
  int64_t rows;
  int64_t row_stride;  // bytes
  int64_t row_bytes;
};
std::optional<ColShape> col_shape(const at::Tensor& t);

// Same bytes, as an integer dtype of the same size (bit-exact gathers).
at::Tensor bits_view(const at::Tensor& t);

}  // namespace flashmla_perm
