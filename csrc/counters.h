// What the native module reports to the tests: calls served by each path,
// plans held and built, and emptying the plan caches. Plain C++ (no ATen), so
// that module.cpp, the one file that includes pybind11, does not also parse
// ATen's headers (the two together doubled its build time). Defined in
// apply.cpp, plan_cache.cpp and perm_cache.cpp.
#pragma once

#include <cstdint>

namespace flashmla_perm {

// How many calls each path served (tests assert the native path really ran).
enum class Path { kCpu = 0, kCuda = 1, kAten = 2 };
int64_t path_count(Path path);

// Entries held by the model-plan caches (for tests of the bound).
int64_t cached_plan_count();
// Row and column plans built since the module loaded, cached or not (a cache
// hit builds none: tests count them).
int64_t plans_built();
// Empties the model-plan caches (tests of the bound; plans in use or kept for
// CUDA graphs live on).
void clear_model_plans();

// Prepared permutations held (bounded by kPlanCacheCapacity each way), and
// emptying both caches (tests of the bound).
int64_t prepared_count();
void clear_prepared();

}  // namespace flashmla_perm
