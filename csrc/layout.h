// A tensor's layout in the terms of csrc/strided.h (bytes), and the bit view
// the ATen path gathers on.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "strided.h"

namespace flashmla_perm {

uint8_t* bytes_of(const at::Tensor& t);
// Dim `dim` of t (sizes in elements, pitches in bytes).
Dim dim_of(const at::Tensor& t, int64_t dim);
// Every dim but `dim`, innermost (last) first.
std::vector<Dim> dims_except(const at::Tensor& t, int64_t dim);
// No two elements share a byte (provably_disjoint).
bool disjoint(const at::Tensor& t);

// Same bytes, as an integer dtype of the same size (bit-exact gathers).
at::Tensor bits_view(const at::Tensor& t);

}  // namespace flashmla_perm
