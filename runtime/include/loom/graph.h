// loom/graph.h: a graph of GEMMs, described on the host.
//
// Each node computes C = epilogue(A · Bᵀ) with A [M, K] and B [N, K] row-major,
// K contiguous (the nn.Linear weight layout), and C [M, N_out]. Edges are not
// declared: a node that reads memory another node writes depends on it, down to
// the rows and columns it reads. Every element is written by at most one node,
// and a node may only read what nodes added before it wrote (no cycles, no
// write-after-read or write-after-write hazards); Validate() enforces this.
//
//   loom::GemmGraph g;
//   g.AddGemm("up", x, w_gate_up, h, {.activation = loom::Activation::kSwiGLU});
//   g.AddGemm("down", h, w_down, y, {.residual = x});
//   LOOM_RETURN_IF_ERROR(g.Validate());
#ifndef LOOM_GRAPH_H_
#define LOOM_GRAPH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "loom/tensor.h"

namespace loom {

// The activation applied to (accumulator + bias).
//   kSwiGLU: the GEMM's output columns interleave gate and up, column 2j is
//   gate_j and 2j+1 is up_j (so B's rows interleave the gate and up weights);
//   output column j = silu(gate_j) * up_j and C is N / 2 wide.
//   kGELU is the exact (erf) form. kReLU is max(x, 0) as fmaxf computes it:
//   a NaN gives 0 (PyTorch's relu keeps the NaN); the others keep NaNs.
enum class Activation : uint8_t { kNone, kReLU, kGELU, kSiLU, kSwiGLU };

// "none", "relu", "gelu", "silu", "swiglu".
std::string_view ActivationName(Activation activation);

// out = cast(activation(A·Bᵀ + bias) + residual), evaluated in FP32.
struct Epilogue {
  Activation activation = Activation::kNone;
  std::optional<TensorView> bias = std::nullopt;   // [1, N], A's type or fp32; N before SwiGLU halving
  std::optional<TensorView> residual = std::nullopt;  // [M, N_out], A's type or fp32
};

struct GemmNode {
  std::string name;
  TensorView a;  // [M, K]
  TensorView b;  // [N, K]
  TensorView c;  // [M, N_out]
  Epilogue epilogue;

  int64_t m() const { return a.rows; }
  int64_t n() const { return b.rows; }  // accumulator columns
  int64_t k() const { return a.cols; }
  // Output columns: N, or N / 2 for SwiGLU.
  int64_t out_cols() const {
    return epilogue.activation == Activation::kSwiGLU ? n() / 2 : n();
  }
};

// Which input of a node reads memory written by another node.
enum class Operand : uint8_t { kA, kB, kBias, kResidual };
std::string_view OperandName(Operand operand);

// `consumer` reads, through `operand`, memory that `producer` writes. Element
// (r, c) of the operand is element (r + row_offset, c + col_offset) of the
// producer's C. When the two views do not share a row stride the mapping is not
// a translation; then `whole_tensor` is set and the consumer waits for all of
// the producer's tiles.
struct DataDependency {
  int consumer = 0;
  int producer = 0;
  Operand operand = Operand::kA;
  int64_t row_offset = 0;
  int64_t col_offset = 0;
  bool whole_tensor = false;
};

class GemmGraph {
 public:
  // Appends a node and returns its index. Nothing is checked here: Validate()
  // (and Runtime::Compile) check the whole graph.
  int AddGemm(std::string name, TensorView a, TensorView b, TensorView c,
              Epilogue epilogue = {});

  const std::vector<GemmNode>& nodes() const { return nodes_; }
  int size() const { return static_cast<int>(nodes_.size()); }
  // How messages name node `index` (Validate's, Compile's, Synchronize's):
  // `node "name"`, or with its index, `node #3 "name"`, when the name is
  // empty or another node's too, so that the message still says which node
  // (an index outside the graph: `node #9 (no such node)`).
  std::string NodeLabel(int index) const;

  // Checks every rule of a well-formed graph; the first violation is returned
  // as InvalidArgument naming the node or tensor, the rule and the value.
  absl::Status Validate() const;
  // Rules 1-3 of Validate (graph.cc) for every node: well-formed views,
  // supported dtypes and activation, shapes that chain. What any evaluation
  // of the nodes needs to stay inside their views (RunNaiveGraph checks it),
  // without the kernels' hardware limits or the rules across nodes.
  absl::Status ValidateShapes() const;
  // Runs `check(role, view)` on every non-empty view of every node, in node
  // order and, within a node, A, B, C, bias, residual (a view two nodes share
  // is checked for each); the first error comes back as InvalidArgument with
  // the node's label in front. Runtime::Compile checks with it what only the
  // device can tell (that each view is memory the device can reach).
  absl::Status CheckEachView(
      const std::function<absl::Status(std::string_view role, const TensorView& view)>& check) const;

  // The data dependencies between nodes, derived from the tensors' memory,
  // in consumer order (each consumer's edges together, consumers ascending;
  // a producer is always an earlier node). Meaningful for a graph that passed
  // Validate().
  std::vector<DataDependency> Dependencies() const;

 private:
  // InvalidArgument: NodeLabel(index), then `message`.
  absl::Status NodeError(int index, absl::string_view message) const;

  std::vector<GemmNode> nodes_;
};

}  // namespace loom

#endif  // LOOM_GRAPH_H_
