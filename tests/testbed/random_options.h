// random_options.h: random CompileOptions for the tests that compile (and,
// with a GPU, run) random graphs under options nobody picked by hand
// (compile_fuzz_test, graph_gpu_test's option soak), and a one-line account
// of a CompileOptions for their failure traces.
#ifndef LOOM_TESTS_TESTBED_RANDOM_OPTIONS_H_
#define LOOM_TESTS_TESTBED_RANDOM_OPTIONS_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "loom/runtime.h"
#include "testbed/testbed.h"

namespace loom::testbed {

// One of `values`, uniformly.
template <typename T>
T Pick(Rng& rng, std::initializer_list<T> values) {
  return *(values.begin() + rng.UniformInt(0, static_cast<int64_t>(values.size()) - 1));
}

// True with probability 1 / n.
inline bool OneIn(Rng& rng, int n) { return rng.UniformInt(1, n) == 1; }

enum class OptionRanges {
  kUsable,  // every field within its documented range (a few combinations are still refused)
  kAny,     // now and then values no option accepts
};

// The defaults a quarter of the time; otherwise every field drawn, within
// `ranges`.
CompileOptions RandomCompileOptions(Rng& rng, OptionRanges ranges);

// "kernel auto, ring split, stages 4/4, ..." (every field).
std::string DescribeOptions(const CompileOptions& options);

}  // namespace loom::testbed

#endif  // LOOM_TESTS_TESTBED_RANDOM_OPTIONS_H_
