// Plans: what a permutation means for the tile bodies, built once on the host.
// Pure C++ (no ATen) so the host harness can build them too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashmla_perm {

// Longest cycle segment, in units (at most 64: a tile marks the ends of the
// cycles it rotates in 64 bits). Cycles up to this length need no scratch;
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
void check_permutation(const int32_t* perm, int64_t n, const std::string& what);

// Largest g dividing n such that perm maps aligned blocks of g indices onto
// aligned blocks of g consecutive indices.
int64_t block_size(const int64_t* perm, int64_t n);

// fused = standard[perm] along dim 0, as cycles of units cut into segments.
// One int32 array holds it all: the moved units in cycle order, each
// segment's first position (and one past the last: a segment ends where the
// next begins), and a word per cut or packed segment. Segments come in three
// kinds, in this order:
//   cut:    [0, num_scratch), up to kMaxSegment units of a longer cycle; its
//           word is the scratch slot its last destination reads;
//   packed: [num_scratch, num_scratch + num_packed), whole short cycles of one
//           length c, as many as fit kMaxSegment units; its word is c;
//   whole:  the rest, one cycle each.
// Short cycles are packed only where a permutation has more than
// `pack_above` of them (a segment start each would cost up to 2 bytes per
// index): packing puts up to 32 cycles in one tile, which would leave a GPU's
// SMs idle on the model ops' few hundred short cycles.
// The array is the plan's only per-index memory: 4 bytes per moved unit,
// plus at most 8 per segment of 32 or more units (0.25 per unit), plus
// 4 per short cycle up to pack_above of them. Its device copy is that array
// as is. A plan keeps no copy of `perm`: permutation_of rebuilds it.
// Built by walks along the cycles, many at once in one thread (each walk's
// loads independent of the others', so that they wait on memory together):
// from landmarks (units L apart, at most 16 Ki of them: 128 KiB of
// records), then from each cycle through none; a bit a unit marks them.
constexpr int64_t kPackCyclesAbove = 32 * 1024;
struct RowPlan {
  int64_t size = 0;        // indices of the permuted dim
  int64_t unit_rows = 1;
  int64_t moved = 0;       // units in cycles
  int64_t num_segments = 0;
  int64_t num_scratch = 0;  // cut segments; slot == index
  int64_t num_packed = 0;   // packed segments, after the cut ones
  std::vector<int32_t> index;  // order (moved), first (num_segments + 1), word (num_scratch + num_packed)
  const int32_t* order() const { return index.data(); }
  const int32_t* first() const { return order() + moved; }
  const int32_t* word() const { return first() + num_segments + 1; }
  int64_t length(int64_t s) const { return first()[s + 1] - first()[s]; }
  // Length of the cycles segment s holds (a cut segment: its own length).
  int64_t cycle_length(int64_t s) const {
    return s >= num_scratch && s < num_scratch + num_packed ? word()[s] : length(s);
  }
};
// Throws std::invalid_argument where the units do not fit int32 (over 2^31 - 1),
// or max_segment is not in [1, kMaxSegment]. `threads` (at most 2 used) share
// the walks that write the array, for plans of many units.
RowPlan make_row_plan(const int64_t* perm, int64_t n, int64_t max_segment = kMaxSegment,
                      int64_t pack_above = kPackCyclesAbove, int threads = 1);
RowPlan make_row_plan(const std::vector<int64_t>& perm, int64_t max_segment = kMaxSegment,
                      int64_t pack_above = kPackCyclesAbove);

// fused = standard[..., perm] along the last dim, for elements of
// `element_size` bytes, as a byte gather map per destination chunk (at most
// one int32 per index: a chunk is never narrower than an element).
struct ColPlan {
  int64_t size = 0;
  int64_t element_size = 1;
  int chunk_shift = 0;                 // chunk bytes = 1 << chunk_shift (<= kMaxChunk)
  std::vector<int32_t> source_offset;  // row_bytes >> chunk_shift entries
  bool identity = false;
};
// Whether a row of n elements has a gather map (its byte offsets fit int32);
// make_col_plan throws std::invalid_argument where it does not.
bool col_map_fits(int64_t n, int64_t element_size);
ColPlan make_col_plan(const int64_t* perm, int64_t n, int64_t element_size);
ColPlan make_col_plan(const std::vector<int64_t>& perm, int64_t element_size);

// The permutation a plan applies (for the ATen gather, and for building the
// other form of a permutation whose caller's values are out of reach).
std::vector<int64_t> permutation_of(const RowPlan& plan);
std::vector<int64_t> permutation_of(const ColPlan& plan);
// Whether perm[0..n) is the permutation the plan applies (no copy made).
bool applies(const RowPlan& plan, const int64_t* perm, int64_t n);
bool applies(const ColPlan& plan, const int64_t* perm, int64_t n);

// The model's permutations (docs/design.md, "The layouts"); fused = standard[perm].
std::vector<int64_t> q_fused_permutation(int64_t num_heads, int64_t head_dim);
std::vector<int64_t> o_fused_permutation(int64_t heads_per_group, int64_t head_dim);
std::vector<int64_t> o_fused_chunk_permutation(int64_t heads_per_group, int64_t head_dim);
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm);

}  // namespace flashmla_perm
