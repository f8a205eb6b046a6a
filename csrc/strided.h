// Strided layouts as the engines' views: any non-overlapping tensor, any
// permuted dim. Pure C++ (no ATen), so the host harness checks it on layouts
// of its own. All sizes and pitches here are in bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "launch.h"

namespace flashmla_perm {

struct Dim {
  int64_t size;
  int64_t pitch;  // bytes
};

// Whether no two elements share a byte, by a sufficient test: dims of size
// > 1 sorted by pitch, each pitch at least the span of the smaller dims.
// Every layout torch makes by slicing, transposing or padding passes.
bool provably_disjoint(std::vector<Dim> dims, int64_t element_size);

// Row engine: permute a dim of `permuted.size` indices `permuted.pitch`
// apart, in units of `unit` consecutive indices; `others` are the tensor's
// other dims. A unit's bytes, sorted and merged, are lines of its longest
// contiguous run. More than kMaxLineDims dims of lines: one view per index
// of the outer ones; a view of several dims of lines holds fewer than
// max_mixed_lines of them (32-bit offsets: tile_bodies.h, Lines), so a long
// outer dim is cut into several views too. Tests pass a small limit.
std::vector<UnitView> unit_views(uint8_t* data, Dim permuted, int64_t unit, std::vector<Dim> others,
                                 int64_t element_size, int64_t max_mixed_lines = kMaxMixedLines);

// Column engine, in place: rows at the `others` dims, each `row_bytes`
// logical bytes in runs of `run`, `run_pitch` apart (run == row_bytes:
// contiguous rows).
std::vector<ColView> col_views_in_place(uint8_t* data, std::vector<Dim> others, int64_t row_bytes,
                                        int64_t run, int64_t run_pitch,
                                        int64_t max_mixed_lines = kMaxMixedLines);
// Column engine, out of place: contiguous rows of row_bytes from src rows at
// `rows_inner_first` (the tensor's other dims, innermost first) to dst rows
// in the same order, packed.
std::vector<ColView> col_views_out(const uint8_t* src, uint8_t* dst, std::vector<Dim> rows_inner_first,
                                   int64_t row_bytes, int64_t max_mixed_lines = kMaxMixedLines);

}  // namespace flashmla_perm
