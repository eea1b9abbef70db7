// demos/demo_common.h: what loom's demos share.
//
// A demo describes its matrices (MatrixSpec) and how to wire them into a
// GemmGraph given a view of each matrix (DemoGraph::build). RunDemo does the
// rest, on one of two paths:
//   GPU: random bf16 (or, with --dtype=fp16, fp16) data in device memory,
//        Compile, Launch, Synchronize, copy back, check `--check_rows` rows
//        of every node against a CPU computation on host copies, then time
//        `--iters` launches (median).
//   CPU: when there is no GPU (or with --cpu), the same graph over host memory
//        at a reduced size, run by the CPU reference executor and checked
//        against a naive per-node loop.
//
//   int main(int argc, char** argv) {
//     absl::ParseCommandLine(argc, argv);
//     loom::demo::Target target = loom::demo::ChooseTarget();
//     int64_t tokens = loom::demo::ResolveSize(absl::GetFlag(FLAGS_tokens), 64, 4, target);
//     return loom::demo::Finish(loom::demo::RunDemo(target, MyDemo(tokens)));
//   }
#ifndef LOOM_DEMOS_DEMO_COMMON_H_
#define LOOM_DEMOS_DEMO_COMMON_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "loom/graph.h"
#include "loom/runtime.h"
#include "loom/tensor.h"

namespace loom::demo {

// What a matrix is for, which decides how it is filled.
enum class MatrixRole : uint8_t {
  kActivation,  // a graph input: uniform random values in [-1, 1]
  kWeight,      // an nn.Linear weight [out, in]: uniform in +-sqrt(3 / in), unit-variance outputs
  kProduced,    // written by a node: poisoned (NaN) before the run
};

// One matrix of a demo (bf16, or fp16 with --dtype=fp16), row-major and dense.
struct MatrixSpec {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  MatrixRole role = MatrixRole::kActivation;
};

// Returns the view of the demo matrix called `name`, in host or device memory.
using ViewOf = std::function<TensorView(std::string_view name)>;

struct DemoGraph {
  std::string title;                 // one line, shapes included
  std::vector<MatrixSpec> matrices;  // every matrix the graph touches
  std::vector<std::string> results;  // produced matrices whose values are printed
  // Builds the graph over the given views. Called once for host memory and,
  // on the GPU path, once more for device memory: it must wire the graph the
  // same way both times.
  std::function<GemmGraph(const ViewOf& view)> build;
};

// Where the demo runs: on a GPU, or on the CPU reference executor.
struct Target {
  std::optional<Runtime> gpu;  // empty: CPU reference
  bool use_gpu() const { return gpu.has_value(); }
};

// Creates a runtime on GPU 0 unless --cpu is given. Without a usable GPU it
// says so ("no GPU found (<reason>): running the CPU reference at a reduced
// size") and returns a CPU target.
Target ChooseTarget();

// A size flag's value: the flag's if it was given, else the GPU default or the
// reduced CPU default, depending on the target.
int64_t ResolveSize(const std::optional<int64_t>& flag, int64_t gpu_default, int64_t cpu_default,
                    const Target& target);

// The largest matrix dimension the kernels take (TMA's limit; Validate
// refuses more), and so the largest size flag a demo accepts.
inline constexpr int64_t kMaxDimension = (int64_t{1} << 31) - 1;

// InvalidArgument naming the flag unless 1 <= value <= at_most (`limit`
// names what sets at_most).
absl::Status CheckPositive(std::string_view flag_name, int64_t value, int64_t at_most = kMaxDimension,
                           std::string_view limit = "the kernels' largest matrix dimension, 2^31 - 1");

// Runs the demo on `target` as described at the top of this file.
absl::Status RunDemo(const Target& target, const DemoGraph& demo);

// Prints a failed status clearly; returns the process exit code (0 when OK).
int Finish(const absl::Status& status);

// Makes --help list every flag the demos define (their own and demo_common's),
// not Abseil's default of the flags of a file named after the program.
void ListDemoFlagsInHelp();

}  // namespace loom::demo

#endif  // LOOM_DEMOS_DEMO_COMMON_H_
