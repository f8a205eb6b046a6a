// Executors: run a plan's tiles on one device. The op layer has already
// validated everything and chosen a layout the tile bodies handle.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

#include "plan.h"

namespace flashmla_perm {

// Row r of the target starts at data + r * row_stride and is row_bytes
// contiguous bytes; row_stride >= row_bytes.
struct RowTarget {
  uint8_t* data;
  int64_t row_stride;
  int64_t row_bytes;
};

// rows x row_bytes read from src and written gathered to dst (src == dst: in place).
struct ColTarget {
  const uint8_t* src;
  uint8_t* dst;
  int64_t src_row_stride;
  int64_t dst_row_stride;
  int64_t rows;
  int64_t row_bytes;
};

void run_rows_cpu(const RowTarget& target, const RowPlan& plan);
void run_cols_cpu(const ColTarget& target, const ColPlan& plan);

#ifdef FLASHMLA_PERM_WITH_CUDA
// Index arrays must already be on `device` (see plan_cache.h).
void run_rows_cuda(const RowTarget& target, const RowPlan& plan, const int64_t* order,
                   const int64_t* segments, c10::Device device);
bool cols_fit_cuda(int64_t row_bytes);
void run_cols_cuda(const ColTarget& target, const ColPlan& plan, const int32_t* source_offset,
                   c10::Device device);
#endif

}  // namespace flashmla_perm
