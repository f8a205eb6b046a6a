// Host harness for the tile bodies: runs them as the GPU does, each tile by a
// group of std::threads sharing a std::barrier (a "CTA"), several CTAs at once
// over a grid-stride loop of tiles, and checks every result against a naive
// permutation. Built under ThreadSanitizer in CI: a missing barrier in a body
// shows up as a data race, or as wrong bytes.
//
//   tile_harness [--quick]      exit 0 when every case matches
#include <barrier>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../csrc/plan.h"
#include "../../csrc/tile_bodies.h"
#include "../../csrc/tiling.h"

namespace fp = flashmla_perm;

namespace {

// One thread of a simulated CTA.
struct ThreadCtx {
  static constexpr bool kSerial = false;
  int tid;
  int nthreads;
  std::barrier<>* bar;
  int thread() const { return tid; }
  int num_threads() const { return nthreads; }
  void sync() { bar->arrive_and_wait(); }
};

// Runs body(ctx, tile, smem) for tiles [0, tiles) on `ctas` CTAs of `threads`
// threads each, every CTA with its own barrier and shared buffer.
void launch(int ctas, int threads, int64_t tiles, int64_t smem_bytes,
            const std::function<void(ThreadCtx&, int64_t, uint8_t*)>& body) {
  std::vector<std::unique_ptr<std::barrier<>>> bars;
  for (int c = 0; c < ctas; ++c) bars.push_back(std::make_unique<std::barrier<>>(threads));
  std::vector<std::vector<uint8_t>> smem(ctas, std::vector<uint8_t>(smem_bytes + 16));
  std::vector<std::thread> pool;
  for (int c = 0; c < ctas; ++c)
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, c, t] {
        ThreadCtx ctx{t, threads, bars[c].get()};
        uint8_t* s = smem[c].data() + (16 - reinterpret_cast<uintptr_t>(smem[c].data()) % 16) % 16;
        for (int64_t tile = c; tile < tiles; tile += ctas) body(ctx, tile, s);
      });
  for (auto& th : pool) th.join();
}

std::mt19937_64 rng(20261202);

std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<int64_t> random_perm(int64_t n) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), rng);
  return p;
}

std::vector<int64_t> one_cycle(int64_t n) {
  std::vector<int64_t> order = random_perm(n), p(n);
  for (int64_t i = 0; i < n; ++i) p[order[i]] = order[(i + 1) % n];
  return p;
}

std::vector<int64_t> reversal(int64_t n) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = n - 1 - i;
  return p;
}

std::vector<int64_t> identity(int64_t n) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

int failures = 0, cases = 0;

void report(bool ok, const std::string& what) {
  ++cases;
  if (!ok) {
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

// Rows: buffer of `rows` rows of `row_bytes`, `row_stride` apart, starting at
// byte `offset` (to break alignment); bytes between rows must stay put.
void check_rows(const std::vector<int64_t>& perm, int64_t row_bytes, int64_t row_stride,
                int64_t offset, int threads, int ctas, int64_t step, int64_t budget,
                const std::string& name) {
  const int64_t rows = static_cast<int64_t>(perm.size());
  std::vector<uint8_t> buf = random_bytes(offset + rows * row_stride + 8);
  std::vector<uint8_t> expected = buf;
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(&expected[offset + r * row_stride], &buf[offset + perm[r] * row_stride], row_bytes);

  const fp::RowPlan plan = fp::make_row_plan(perm);
  const fp::RowTiling tiling = fp::row_tiling(plan.unit_rows, row_bytes, step, budget);
  std::vector<uint8_t> scratch(plan.num_scratch * plan.unit_rows * row_bytes + 16);
  uint8_t* data = buf.data() + offset;
  const fp::RowParams p{data, row_stride, row_bytes, plan.unit_rows, plan.order.data(),
                        plan.segments.data(), scratch.data(), tiling.slice_bytes,
                        tiling.num_slices, tiling.step};
  const int v = fp::vector_width({reinterpret_cast<int64_t>(data), row_stride, row_bytes,
                                  tiling.slice_bytes});
  fp::with_vector_width(v, [&](auto vw) {
    constexpr int V = decltype(vw)::value;
    launch(ctas, threads, plan.num_scratch * p.num_slices, 0,
           [&](ThreadCtx& ctx, int64_t t, uint8_t*) { fp::save_segment_head<V>(ctx, p, t); });
    launch(ctas, threads, plan.num_segments * p.num_slices, tiling.smem_bytes,
           [&](ThreadCtx& ctx, int64_t t, uint8_t* s) { fp::row_segment_tile<V>(ctx, p, t, s); });
  });
  report(buf == expected, "rows " + name + " rows=" + std::to_string(rows) + " bytes=" +
                              std::to_string(row_bytes) + " threads=" + std::to_string(threads));
}

// Columns: in place (src == dst) or out of place, elements of `esize` bytes.
void check_cols(const std::vector<int64_t>& perm, int64_t esize, int64_t rows, int64_t offset,
                bool in_place, int threads, int ctas, int64_t budget, const std::string& name) {
  const int64_t cols = static_cast<int64_t>(perm.size());
  const int64_t row_bytes = cols * esize;
  const int64_t stride = row_bytes + (offset % 3) * 16;  // some padded rows
  std::vector<uint8_t> src = random_bytes(offset + rows * stride + 8);
  std::vector<uint8_t> dst = in_place ? src : random_bytes(src.size());
  std::vector<uint8_t> expected = dst;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(&expected[offset + r * stride + c * esize], &src[offset + r * stride + perm[c] * esize], esize);

  const fp::ColPlan plan = fp::make_col_plan(perm, esize);
  const int64_t tile_rows = std::max<int64_t>(1, fp::col_tile_rows(row_bytes, rows, budget));
  uint8_t* d = dst.data() + offset;
  const uint8_t* s = in_place ? d : src.data() + offset;
  const fp::ColParams p{s, d, stride, stride, rows, row_bytes, plan.source_offset.data(),
                        plan.chunk_shift, tile_rows};
  const int v = fp::vector_width({reinterpret_cast<int64_t>(s), reinterpret_cast<int64_t>(d),
                                  stride, row_bytes, int64_t{1} << plan.chunk_shift});
  fp::with_vector_width(v, [&](auto vw) {
    constexpr int V = decltype(vw)::value;
    launch(ctas, threads, (rows + tile_rows - 1) / tile_rows, tile_rows * row_bytes,
           [&](ThreadCtx& ctx, int64_t t, uint8_t* sm) { fp::col_gather_tile<V>(ctx, p, t, sm); });
  });
  report(dst == expected, "cols " + name + (in_place ? " in place" : " out of place") +
                              " cols=" + std::to_string(cols) + " esize=" + std::to_string(esize) +
                              " threads=" + std::to_string(threads));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const std::vector<int> thread_counts = quick ? std::vector<int>{1, 7, 32}
                                               : std::vector<int>{1, 2, 7, 32, 128};
  for (int threads : thread_counts) {
    const int ctas = threads >= 32 ? 2 : 3;
    // Row permutations: small budgets force several column slices and steps.
    struct RowCase { std::string name; std::vector<int64_t> perm; int64_t bytes, stride_pad, offset, step, budget; };
    std::vector<RowCase> rc = {
        {"q 8x64", fp::q_fused_permutation(8, 64), 40, 0, 0, 4, 4096},
        {"q 64x512", fp::q_fused_permutation(64, 512), 24, 8, 3, 4, 40 * 1024},
        {"q 3x32", fp::q_fused_permutation(3, 32), 1000, 24, 1, 2, 8192},
        {"random", random_perm(777), 37, 5, 7, 4, 2048},
        {"one cycle 1000", one_cycle(1000), 16, 0, 0, 3, 4096},
        {"one cycle 65", one_cycle(65), 48, 16, 16, 4, 1024},
        {"one cycle 129", one_cycle(129), 8, 0, 2, 1, 512},
        {"reversal", reversal(300), 64, 0, 0, 4, 4096},
        {"identity", identity(100), 32, 0, 0, 4, 4096},
        {"blocks", [] { auto b = random_perm(40); std::vector<int64_t> p; for (auto x : b) for (int i = 0; i < 16; ++i) p.push_back(x * 16 + i); return p; }(), 20, 4, 5, 4, 2048},
    };
    for (auto& c : rc)
      check_rows(c.perm, c.bytes, c.bytes + c.stride_pad, c.offset, threads, ctas, c.step, c.budget, c.name);
    struct ColCase { std::string name; std::vector<int64_t> perm; int64_t esize, rows, offset, budget; };
    std::vector<ColCase> cc = {
        {"o 8x512", fp::o_fused_permutation(8, 512), 1, 9, 0, 16384},
        {"o chunks 8x512", fp::o_fused_chunk_permutation(8, 512), 1, 100, 0, 2048},
        {"q 16x64 bf16", fp::q_fused_permutation(16, 64), 2, 5, 6, 8192},
        {"o 4x96 fp32", fp::o_fused_permutation(4, 96), 4, 7, 1, 4096},
        {"random", random_perm(301), 1, 33, 3, 1024},
        {"reversal", reversal(64), 8, 10, 0, 1024},
        {"identity", identity(48), 2, 4, 0, 1024},
    };
    for (auto& c : cc)
      for (bool in_place : {true, false})
        check_cols(c.perm, c.esize, c.rows, c.offset, in_place, threads, ctas, c.budget, c.name);
  }
  std::printf("%d passed, %d failed\n", cases - failures, failures);
  return failures == 0 ? 0 : 1;
}
