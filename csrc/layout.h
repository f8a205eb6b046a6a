// A tensor's layout in the terms of csrc/strided.h (bytes), and the bit view
// the ATen path gathers on.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "overlap.h"
#include "strided.h"

namespace flashmla_perm {

uint8_t* bytes_of(const at::Tensor& t);
// Dim `dim` of t (sizes in elements, pitches in bytes).
Dim dim_of(const at::Tensor& t, int64_t dim);
// Every dim but `dim`, innermost (last) first.
std::vector<Dim> dims_except(const at::Tensor& t, int64_t dim);
// t's bytes, at its first element's address (pairs compare addresses, so
// views of one buffer and tensors that alias from outside torch both count).
ByteLayout byte_layout(const at::Tensor& t);
// Whether two distinct elements share a byte (exact; csrc/overlap.h).
Overlap self_overlap(const at::Tensor& t);
// The engines' layouts (provably_disjoint): other self-disjoint layouts
// are permuted as a packed copy (csrc/apply.cpp).
bool engine_layout(const at::Tensor& t);

// Same bytes, as an integer dtype of the same size (bit-exact gathers).
at::Tensor bits_view(const at::Tensor& t);

}  // namespace flashmla_perm
