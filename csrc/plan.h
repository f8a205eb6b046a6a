// Plans: what a permutation means for the tile bodies, built once on the host.
// Pure C++ (no ATen) so the host harness can build them too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flashmla_perm {

// Longest cycle segment, in units. Cycles up to this length need no scratch;
// longer ones save one unit per segment, so scratch stays under 2/(kMaxSegment+1)
// of the tensor (under 1/32).
constexpr int64_t kMaxSegment = 64;
// Largest chunk of a column gather map, in bytes (a GPU moves it in 16-byte
// vectors; a CPU in one memcpy).
constexpr int64_t kMaxChunk = 64;
// Rows grouped into one unit at most (the Q permutation moves blocks of 16).
constexpr int64_t kMaxUnitRows = 64;

// Throws std::invalid_argument naming `what` unless perm[0..n) holds every
// index in [0, n) exactly once.
void check_permutation(const int64_t* perm, int64_t n, const std::string& what);

// Largest g dividing n such that perm maps aligned blocks of g indices onto
// aligned blocks of g consecutive indices.
int64_t block_size(const int64_t* perm, int64_t n);

// A permutation's values, shared by its plans and the caller that prepared it
// (one copy, however many plans).
using SharedPerm = std::shared_ptr<const std::vector<int64_t>>;

// fused = standard[perm] along dim 0, as cycles of units cut into segments.
struct RowPlan {
  int64_t unit_rows = 1;
  std::vector<int64_t> order;     // moved units, cycle after cycle
  std::vector<int64_t> segments;  // 3 per segment: first position, length, tail slot
  int64_t num_segments = 0;
  int64_t num_scratch = 0;        // segments [0, num_scratch) own scratch slot == index
  SharedPerm perm;                // the permutation itself (for the ATen path)
};
RowPlan make_row_plan(SharedPerm perm, int64_t max_segment = kMaxSegment);
RowPlan make_row_plan(std::vector<int64_t> perm, int64_t max_segment = kMaxSegment);

// fused = standard[..., perm] along the last dim, for elements of
// `element_size` bytes, as a byte gather map per destination chunk.
struct ColPlan {
  int chunk_shift = 0;                 // chunk bytes = 1 << chunk_shift (<= kMaxChunk)
  std::vector<int32_t> source_offset;  // row_bytes >> chunk_shift entries; empty for rows over 2^31 bytes
  bool identity = false;
  SharedPerm perm;
};
ColPlan make_col_plan(SharedPerm perm, int64_t element_size);
ColPlan make_col_plan(std::vector<int64_t> perm, int64_t element_size);

// The model's permutations (DESIGN.md, "The layouts"); fused = standard[perm].
std::vector<int64_t> q_fused_permutation(int64_t num_heads, int64_t head_dim);
std::vector<int64_t> o_fused_permutation(int64_t heads_per_group, int64_t head_dim);
std::vector<int64_t> o_fused_chunk_permutation(int64_t heads_per_group, int64_t head_dim);
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm);

}  // namespace flashmla_perm
