// Tile-size and vector-width choices, kept apart from the bodies and the
// launchers so each executor states its own budget in one place.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "tile_bodies.h"

namespace flashmla_perm {

// Largest of 16, 8, 4, 2, 1 dividing every value (addresses, pitches, widths).
inline int vector_width(std::initializer_list<int64_t> values) {
  int64_t bits = 16;
  for (int64_t v : values) bits |= v;
  return static_cast<int>(bits & -bits);
}

// Calls f(std::integral_constant<int, V>{}) for the runtime width v.
template <class F>
void with_vector_width(int v, F&& f) {
  switch (v) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

struct RowTiling {
  int64_t slice_bytes;
  int64_t num_slices;
  int64_t step;
  int64_t smem_bytes;
};

// Cut rows into column slices so that (step + 1) unit slices fit `budget`.
// Slices are multiples of 16 bytes (except a row narrower than that) and as
// even as possible, so no tile is a sliver.
inline RowTiling row_tiling(int64_t unit_rows, int64_t row_bytes, int64_t step, int64_t budget) {
  int64_t max_slice = budget / ((step + 1) * unit_rows);
  max_slice = max_slice < 16 ? 16 : max_slice / 16 * 16;
  RowTiling t{row_bytes, 1, step, 0};
  if (row_bytes > max_slice) {
    t.num_slices = (row_bytes + max_slice - 1) / max_slice;
    t.slice_bytes = ((row_bytes + t.num_slices - 1) / t.num_slices + 15) / 16 * 16;
    t.num_slices = (row_bytes + t.slice_bytes - 1) / t.slice_bytes;
  }
  t.smem_bytes = row_tile_smem_bytes(unit_rows, t.slice_bytes, step);
  return t;
}

// Whole rows per column tile within `budget`; 0 when one row does not fit.
inline int64_t col_tile_rows(int64_t row_bytes, int64_t rows, int64_t budget) {
  if (row_bytes <= 0) return 1;
  int64_t t = budget / row_bytes;
  return t < rows ? t : (rows > 0 ? rows : 1);
}

}  // namespace flashmla_perm
