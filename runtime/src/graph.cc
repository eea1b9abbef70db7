// graph.cc: GemmGraph — appending nodes, validating a graph, and deriving the
// data dependencies between its nodes from the memory their tensors cover.
//
// Validate() returns the FIRST violation it finds, as InvalidArgument with a
// message of the form `node "<node>": <role> "<tensor>": <rule and value>`.
// The checks run in this order:
//
//   per node, in insertion order:
//     1. every view (A, B, C, bias, residual) is well formed: not a sub-view
//        whose range left the view it was taken from (TensorView::
//        slice_error, set by Columns / Rows), rows, cols and
//        row stride are not negative, row stride >= cols when rows > 1, data
//        is not null for a non-empty view, the view does not wrap the address
//        space;
//     2. the dtype tuple is supported: A = B = bf16 or A = B = fp16, and C,
//        bias and residual each of A's type or fp32; the epilogue's
//        activation is one of the Activation values;
//     3. the shapes chain: A [M, K], B [N, K], C [M, N_out] with N_out = N, or
//        N / 2 for SwiGLU (which needs an even N), bias [1, N], residual
//        [M, N_out]; M = 0 or N = 0 is legal (the node is a no-op), and so
//        is K = 0 (C = epilogue(0): activation(bias) + residual);
//     4. hardware limits. A, B, C and residual move through TMA: each
//        dimension <= 2^31 - 1, base address 16-byte aligned and, when
//        rows > 1 (the only case in which the stride is used), a row stride in
//        bytes below 2^40 and a multiple of 16. The bias is read by the
//        epilogue with plain loads, bf16 biases two elements at a time, so its
//        base needs only 4-byte alignment. Empty views are never loaded or
//        stored and are exempt from these limits;
//     5. K fits the tile-job encoding: at most 65535 k-blocks of 64 (TileJob
//        keeps k-blocks in 16 bits), i.e. K <= 4194240;
//     6. no input of the node overlaps its own output (no in-place GEMMs);
//   across nodes:
//     7. every element is written by at most one node;
//     8. the data edges (j reads memory i writes) have no cycle, whatever the
//        insertion order; the message lists the cycle;
//     9. no write-after-read hazard: a node never writes memory that a node
//        added before it reads (that node would wait for, and read, the new
//        value). Every cycle contains such an edge, so cycles are reported
//        first, with their own message;
//    10. a node with K = 0 and an output reads no bias or residual that
//        another node writes: its jobs are its epilogue alone, and the
//        kernels order a job's epilogue after the producers of its bias and
//        residual through its first load of A, which such a job does not
//        have.
//
// Overlap of two views is decided on bytes: their byte ranges
// [base, base + (rows - 1) * stride + cols * element_size) must intersect and,
// when the two share a row stride in bytes (a single-row view adopts the
// other's), their 2-D rectangles must intersect too, so the left and right
// column halves of one buffer do not overlap. Empty views overlap nothing.
#include "loom/graph.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "internal/view_overlap.h"
#include "loom/scheduler/schedule.h"
#include "loom/tensor.h"

namespace loom {

std::string_view ActivationName(Activation activation) {
  switch (activation) {
    case Activation::kNone:
      return "none";
    case Activation::kReLU:
      return "relu";
    case Activation::kGELU:
      return "gelu";
    case Activation::kSiLU:
      return "silu";
    case Activation::kSwiGLU:
      return "swiglu";
  }
  return "unknown";
}

std::string_view OperandName(Operand operand) {
  switch (operand) {
    case Operand::kA:
      return "A";
    case Operand::kB:
      return "B";
    case Operand::kBias:
      return "bias";
    case Operand::kResidual:
      return "residual";
  }
  return "unknown";
}

int GemmGraph::AddGemm(std::string name, TensorView a, TensorView b, TensorView c,
                       Epilogue epilogue) {
  nodes_.push_back(
      GemmNode{std::move(name), std::move(a), std::move(b), std::move(c), std::move(epilogue)});
  return static_cast<int>(nodes_.size()) - 1;
}

namespace {

// Byte arithmetic on views needs more than 64 bits: (rows - 1) * stride_bytes
// reaches 2^71 for views that are within TMA's limits, and addresses are
// unsigned 64-bit. GCC and Clang's 128-bit integer covers both.
using Wide = __int128;

// TMA (cuTensorMapEncodeTiled) limits for the tensors the tensor engine moves.
constexpr int64_t kTmaMaxDim = (int64_t{1} << 31) - 1;
constexpr int64_t kTmaStrideLimitBytes = int64_t{1} << 40;  // exclusive
constexpr int64_t kTmaAlignmentBytes = 16;
// The bias is read by the epilogue with plain loads, bf16 two at a time.
constexpr int64_t kBiasAlignmentBytes = 4;
// The tile job keeps k-blocks of TileShape::k elements in 16 bits.
constexpr int64_t kJobMaxKBlocks =
    std::numeric_limits<decltype(sched::TileJob{}.k_block_end)>::max();
constexpr int64_t kJobBlockK = sched::TileShape{}.k;
constexpr int64_t kMaxK = kJobMaxKBlocks * kJobBlockK;

Wide Address(const TensorView& view) {
  return static_cast<Wide>(reinterpret_cast<uintptr_t>(view.data));
}

Wide StrideBytes(const TensorView& view) {
  return static_cast<Wide>(view.row_stride) * static_cast<Wide>(view.element_size());
}

// Bytes from the first element to one past the last, kSaturatedExtent where
// that passes 2^127 - 1 (rows near 2^63 times a stride near 2^63 fp32
// elements). Views must be non-empty with non-negative sizes.
constexpr Wide kSaturatedExtent = std::numeric_limits<Wide>::max();
Wide ExtentBytes(const TensorView& view) {
  Wide extent = 0;
  if (__builtin_mul_overflow(static_cast<Wide>(view.rows - 1), StrideBytes(view), &extent) ||
      __builtin_add_overflow(extent, static_cast<Wide>(view.cols) * static_cast<Wide>(view.element_size()),
                             &extent)) {
    return kSaturatedExtent;
  }
  return extent;
}

std::string WideToString(Wide value) {
  if (value == 0) return "0";
  const bool negative = value < 0;
  unsigned __int128 magnitude = negative ? static_cast<unsigned __int128>(-(value + 1)) + 1
                                         : static_cast<unsigned __int128>(value);
  std::string digits;
  while (magnitude != 0) {
    digits.push_back(static_cast<char>('0' + static_cast<int>(magnitude % 10)));
    magnitude /= 10;
  }
  if (negative) digits.push_back('-');
  std::reverse(digits.begin(), digits.end());
  return digits;
}

// Floor division and the matching modulo, for a positive divisor.
Wide FloorDiv(Wide a, Wide b) {
  Wide q = a / b;
  if ((a % b != 0) && (a < 0)) --q;
  return q;
}
Wide CeilDiv(Wide a, Wide b) { return -FloorDiv(-a, b); }
Wide FloorMod(Wide a, Wide b) { return a - FloorDiv(a, b) * b; }

// The byte row stride two views are compared under: a single-row view never
// uses its stride, so it adopts the other view's. Returns 0 when the strides
// differ (or are not positive) and the views are not both single rows.
Wide SharedStrideBytes(const TensorView& x, const TensorView& y) {
  Wide x_stride = StrideBytes(x);
  Wide y_stride = StrideBytes(y);
  if (x.rows == 1) x_stride = y_stride;
  if (y.rows == 1) y_stride = x_stride;
  return (x_stride == y_stride && x_stride > 0) ? x_stride : 0;
}

// Whether two views share at least one byte (see the top of the file).
bool Overlaps(const TensorView& x, const TensorView& y) {
  if (x.empty() || y.empty()) return false;
  const Wide x_begin = Address(x);
  const Wide y_begin = Address(y);
  if (x_begin + ExtentBytes(x) <= y_begin || y_begin + ExtentBytes(y) <= x_begin) {
    return false;
  }
  if (x.rows == 1 && y.rows == 1) return true;  // two byte ranges: exact
  const Wide stride = SharedStrideBytes(x, y);
  if (stride == 0) return true;  // different strides: the byte ranges decide
  // Byte u of row i of x is byte v of row j of y when
  //   x_begin + i * stride + u == y_begin + j * stride + v,
  // i.e. (i - j) * stride == d + v - u with d = y_begin - x_begin. Since u and
  // v take every value below the row widths, d + v - u covers
  // [d - (x_width - 1), d + (y_width - 1)]; the row difference i - j covers
  // [-(y.rows - 1), x.rows - 1]. The views overlap iff some row difference
  // puts a multiple of the stride inside that byte interval.
  const Wide d = y_begin - x_begin;
  const Wide x_width = static_cast<Wide>(x.cols) * static_cast<Wide>(x.element_size());
  const Wide y_width = static_cast<Wide>(y.cols) * static_cast<Wide>(y.element_size());
  const Wide low = std::max(CeilDiv(d - (x_width - 1), stride), static_cast<Wide>(-(y.rows - 1)));
  const Wide high = std::min(FloorDiv(d + (y_width - 1), stride), static_cast<Wide>(x.rows - 1));
  return low <= high;
}

std::string ByteRange(const TensorView& view) {
  return absl::StrFormat("[%s, %s)", internal::HexAddress(static_cast<unsigned __int128>(Address(view))),
                         internal::HexAddress(internal::ViewEnd(view)));
}

// `A "x"`: how messages refer to a tensor of a node.
std::string Describe(std::string_view role, const TensorView& view) {
  return absl::StrFormat("%s \"%s\"", role, view.name);
}

// A per-node rule's violation; Validate and ValidateShapes put the node's
// label (GemmGraph::NodeLabel) in front of it.
absl::Status Violation(const std::string& message) { return absl::InvalidArgumentError(message); }

// A tensor a node uses, with the name of the role it plays.
struct RoleView {
  std::string_view role;  // "A", "B", "C", "bias" or "residual"
  const TensorView* view;
  Operand operand;  // for inputs; C carries kA, unused
};

// The tensors a node reads, in Operand order.
std::vector<RoleView> Inputs(const GemmNode& node) {
  std::vector<RoleView> inputs = {{"A", &node.a, Operand::kA}, {"B", &node.b, Operand::kB}};
  if (node.epilogue.bias) inputs.push_back({"bias", &*node.epilogue.bias, Operand::kBias});
  if (node.epilogue.residual) {
    inputs.push_back({"residual", &*node.epilogue.residual, Operand::kResidual});
  }
  return inputs;
}

// Every tensor of a node: A, B, C, bias, residual.
std::vector<RoleView> AllViews(const GemmNode& node) {
  std::vector<RoleView> views = {
      {"A", &node.a, Operand::kA}, {"B", &node.b, Operand::kB}, {"C", &node.c, Operand::kA}};
  if (node.epilogue.bias) views.push_back({"bias", &*node.epilogue.bias, Operand::kBias});
  if (node.epilogue.residual) {
    views.push_back({"residual", &*node.epilogue.residual, Operand::kResidual});
  }
  return views;
}

// Rule 1.
absl::Status CheckWellFormed(const RoleView& rv) {
  const TensorView& v = *rv.view;
  const std::string who = Describe(rv.role, v);
  if (!v.slice_error.empty()) return Violation(absl::StrFormat("%s: %s", who, v.slice_error));
  if (v.rows < 0) return Violation(absl::StrFormat("%s: rows %d is negative", who, v.rows));
  if (v.cols < 0) return Violation(absl::StrFormat("%s: cols %d is negative", who, v.cols));
  if (v.row_stride < 0) {
    return Violation(absl::StrFormat("%s: row stride %d elements is negative", who, v.row_stride));
  }
  if (v.rows > 1 && v.row_stride < v.cols) {
    return Violation(absl::StrFormat("%s: row stride %d elements is less than cols %d", who, v.row_stride, v.cols));
  }
  if (v.empty()) return absl::OkStatus();
  if (v.data == nullptr) {
    return Violation(absl::StrFormat("%s: data is null for a non-empty [%d, %d] view", who, v.rows, v.cols));
  }
  const Wide extent = ExtentBytes(v);
  // Address < 2^64, so no overflow short of a saturated extent.
  const Wide address_space = static_cast<Wide>(std::numeric_limits<uint64_t>::max()) + 1;
  if (extent == kSaturatedExtent || Address(v) + extent > address_space) {
    return Violation(
        absl::StrFormat("%s: the [%d, %d] view at %p (%s bytes) runs past the "
                        "end of the address space",
                        who, v.rows, v.cols, v.data,
                        extent == kSaturatedExtent ? "more than 2^127" : WideToString(extent)));
  }
  return absl::OkStatus();
}

// The 16-bit input types a node may have, and with each the types of its C,
// bias and residual: the inputs' own type or fp32 (a plan's 16-bit tensors
// share one type, which the tiled kernel is instantiated for).
bool IsHalfInput(DType dtype) { return dtype == DType::kBF16 || dtype == DType::kFP16; }

// A dtype as rule 2's messages name it: its name, or for a value cast from
// an integer outside the enum, that integer.
std::string DTypeLabel(DType dtype) {
  const std::string_view name = DTypeName(dtype);
  return name != "unknown" ? std::string(name) : absl::StrCat("unknown (", static_cast<int>(dtype), ")");
}

// Rule 2.
absl::Status CheckDTypesAndActivation(const GemmNode& node) {
  const DType half = node.a.dtype;
  const auto same_or_fp32 = [half](DType dtype) { return dtype == half || dtype == DType::kFP32; };
  if (!IsHalfInput(half) || node.b.dtype != half || !same_or_fp32(node.c.dtype)) {
    return Violation(
        absl::StrFormat("dtype tuple (A %s, B %s, C %s) is not supported; "
                        "supported: A=B=bf16, C in {bf16, fp32}; A=B=fp16, C in {fp16, fp32}",
                        DTypeLabel(node.a.dtype), DTypeLabel(node.b.dtype), DTypeLabel(node.c.dtype)));
  }
  for (const RoleView& rv : Inputs(node)) {
    if (rv.operand != Operand::kBias && rv.operand != Operand::kResidual) continue;
    if (!same_or_fp32(rv.view->dtype)) {
      return Violation(absl::StrFormat("%s: dtype %s is not supported beside %s inputs; supported: %s, fp32",
                                       Describe(rv.role, *rv.view), DTypeLabel(rv.view->dtype), DTypeName(half),
                                       DTypeName(half)));
    }
  }
  // An enum value cast from an integer: the kernels and the reference would
  // each fall back to no activation without saying so.
  if (static_cast<int>(node.epilogue.activation) > static_cast<int>(Activation::kSwiGLU)) {
    return Violation(absl::StrFormat("epilogue activation %d is not one of none, relu, gelu, silu, swiglu",
                                     static_cast<int>(node.epilogue.activation)));
  }
  return absl::OkStatus();
}

// Rule 3.
absl::Status CheckShapes(const GemmNode& node) {
  const TensorView& a = node.a;
  const TensorView& b = node.b;
  const TensorView& c = node.c;
  const bool swiglu = node.epilogue.activation == Activation::kSwiGLU;
  if (a.cols != b.cols) {
    return Violation(
        absl::StrFormat("shapes do not chain: A \"%s\" has K = %d columns "
                        "but B \"%s\" has K = %d (A is [M, K], B is [N, K])",
                        a.name, a.cols, b.name, b.cols));
  }
  if (swiglu && b.rows % 2 != 0) {
    return Violation(
        absl::StrFormat("swiglu needs an even N (gate and up columns "
                        "interleave), but B \"%s\" has N = %d rows",
                        b.name, b.rows));
  }
  if (c.rows != a.rows) {
    return Violation(
        absl::StrFormat("shapes do not chain: C \"%s\" has %d rows, expected "
                        "M = %d (the rows of A \"%s\")",
                        c.name, c.rows, a.rows, a.name));
  }
  if (c.cols != node.out_cols()) {
    const std::string why = swiglu
                                ? absl::StrFormat("N = %d halved by swiglu", b.rows)
                                : absl::StrFormat("N = %d, the rows of B \"%s\"", b.rows, b.name);
    return Violation(
        absl::StrFormat("shapes do not chain: C \"%s\" has %d columns, "
                        "expected N_out = %d (%s)",
                        c.name, c.cols, node.out_cols(), why));
  }
  if (const auto& bias = node.epilogue.bias; bias && (bias->rows != 1 || bias->cols != b.rows)) {
    return Violation(
        absl::StrFormat("shapes do not chain: bias \"%s\" is [%d, %d], "
                        "expected [1, N] = [1, %d]",
                        bias->name, bias->rows, bias->cols, b.rows));
  }
  if (const auto& residual = node.epilogue.residual;
      residual && (residual->rows != c.rows || residual->cols != c.cols)) {
    return Violation(
        absl::StrFormat("shapes do not chain: residual \"%s\" is [%d, %d], "
                        "expected [M, N_out] = [%d, %d]",
                        residual->name, residual->rows, residual->cols, c.rows, c.cols));
  }
  return absl::OkStatus();
}

// Rule 5.
absl::Status CheckK(const GemmNode& node) {
  if (node.k() > kMaxK) {
    return Violation(
        absl::StrFormat("K %d exceeds the limit of %d (%d k-blocks of %d: the "
                        "tile job keeps k-blocks in 16 bits)",
                        node.k(), kMaxK, kJobMaxKBlocks, kJobBlockK));
  }
  return absl::OkStatus();
}

// Rule 4, for a tensor loaded or stored by TMA.
absl::Status CheckTmaLimits(const RoleView& rv) {
  const TensorView& v = *rv.view;
  if (v.empty()) return absl::OkStatus();
  const std::string who = Describe(rv.role, v);
  if (v.rows > kTmaMaxDim) {
    return Violation(absl::StrFormat("%s: rows %d exceeds TMA's limit of %d", who, v.rows, kTmaMaxDim));
  }
  if (v.cols > kTmaMaxDim) {
    return Violation(absl::StrFormat("%s: cols %d exceeds TMA's limit of %d", who, v.cols, kTmaMaxDim));
  }
  const uint64_t address = reinterpret_cast<uintptr_t>(v.data);
  if (address % kTmaAlignmentBytes != 0) {
    return Violation(absl::StrFormat("%s: base address 0x%x is not %d-byte aligned", who, address, kTmaAlignmentBytes));
  }
  if (v.rows > 1) {
    const Wide stride = StrideBytes(v);
    if (stride >= kTmaStrideLimitBytes) {
      return Violation(
          absl::StrFormat("%s: row stride %s bytes is not below TMA's limit "
                          "of 2^40 bytes",
                          who, WideToString(stride)));
    }
    if (stride % kTmaAlignmentBytes != 0) {
      return Violation(absl::StrFormat("%s: row stride %s bytes is not a multiple of %d", who, WideToString(stride),
                                       kTmaAlignmentBytes));
    }
  }
  return absl::OkStatus();
}

// Rule 4, for the bias (plain loads).
absl::Status CheckBiasLimits(const TensorView& bias) {
  if (bias.empty()) return absl::OkStatus();
  const uint64_t address = reinterpret_cast<uintptr_t>(bias.data);
  if (address % kBiasAlignmentBytes != 0) {
    return Violation(absl::StrFormat("%s: base address 0x%x is not %d-byte aligned", Describe("bias", bias), address,
                                     kBiasAlignmentBytes));
  }
  return absl::OkStatus();
}

// Rule 6.
absl::Status CheckNotInPlace(const GemmNode& node) {
  for (const RoleView& input : Inputs(node)) {
    if (Overlaps(*input.view, node.c)) {
      return Violation(
          absl::StrFormat("reads %s %s and writes C \"%s\" %s, which overlap "
                          "(in-place GEMMs are not supported)",
                          Describe(input.role, *input.view), ByteRange(*input.view), node.c.name, ByteRange(node.c)));
    }
  }
  return absl::OkStatus();
}

// Rules 1-3.
absl::Status CheckNodeShapes(const GemmNode& node) {
  for (const RoleView& rv : AllViews(node)) {
    if (absl::Status status = CheckWellFormed(rv); !status.ok()) return status;
  }
  if (absl::Status status = CheckDTypesAndActivation(node); !status.ok()) return status;
  return CheckShapes(node);
}

absl::Status CheckNode(const GemmNode& node) {
  if (absl::Status status = CheckNodeShapes(node); !status.ok()) return status;
  for (const RoleView& rv : AllViews(node)) {
    absl::Status status = rv.role == "bias" ? CheckBiasLimits(*rv.view) : CheckTmaLimits(rv);
    if (!status.ok()) return status;
  }
  if (absl::Status status = CheckK(node); !status.ok()) return status;
  return CheckNotInPlace(node);
}

// The first input of `reader` that overlaps `writer`'s output, if any.
const RoleView* FirstOverlappingInput(const std::vector<RoleView>& reader_inputs,
                                      const GemmNode& writer) {
  for (const RoleView& input : reader_inputs) {
    if (Overlaps(*input.view, writer.c)) return &input;
  }
  return nullptr;
}

// Rule 8: a cycle among the edges producer -> consumers, as the list of nodes
// along it (first node repeated at the end); empty when there is none.
// Kahn's algorithm removes every node that is not on or behind a cycle; each
// node left has a predecessor that is left, so walking predecessors from the
// smallest such node must come back to a node already seen.
std::vector<int> FindCycle(const std::vector<std::vector<int>>& consumers_of,
                           const std::vector<std::vector<int>>& producers_of) {
  const int n = static_cast<int>(consumers_of.size());
  std::vector<int> in_degree(n, 0);
  for (int i = 0; i < n; ++i) in_degree[i] = static_cast<int>(producers_of[i].size());
  std::vector<int> ready;
  for (int i = 0; i < n; ++i) {
    if (in_degree[i] == 0) ready.push_back(i);
  }
  std::vector<bool> removed(n, false);
  while (!ready.empty()) {
    const int node = ready.back();
    ready.pop_back();
    removed[node] = true;
    for (int consumer : consumers_of[node]) {
      if (--in_degree[consumer] == 0) ready.push_back(consumer);
    }
  }
  int start = -1;
  for (int i = 0; i < n && start < 0; ++i) {
    if (!removed[i]) start = i;
  }
  if (start < 0) return {};

  // Walk backwards along producers until a node repeats.
  std::vector<int> walk;
  std::vector<int> position(n, -1);
  int node = start;
  while (position[node] < 0) {
    position[node] = static_cast<int>(walk.size());
    walk.push_back(node);
    for (int producer : producers_of[node]) {  // sorted: the smallest remaining one
      if (!removed[producer]) {
        node = producer;
        break;
      }
    }
  }
  std::vector<int> cycle(walk.begin() + position[node], walk.end());
  std::reverse(cycle.begin(), cycle.end());  // now in data-flow order
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  cycle.push_back(cycle.front());
  return cycle;
}

}  // namespace

bool internal::ViewsOverlap(const TensorView& x, const TensorView& y) { return Overlaps(x, y); }

unsigned __int128 internal::ViewEnd(const TensorView& view) {
  const Wide extent = ExtentBytes(view);
  const Wide address = Address(view);
  return extent > kSaturatedExtent - address ? static_cast<unsigned __int128>(kSaturatedExtent)
                                             : static_cast<unsigned __int128>(address + extent);
}

std::string internal::HexAddress(unsigned __int128 address) {
  const auto high = static_cast<uint64_t>(address >> 64);
  const auto low = static_cast<uint64_t>(address);
  return high == 0 ? absl::StrFormat("0x%x", low) : absl::StrFormat("0x%x%016x", high, low);
}

std::string GemmGraph::NodeLabel(int index) const {
  if (index < 0 || index >= size()) return absl::StrCat("node #", index, " (no such node)");
  const std::string& name = nodes_[index].name;
  if (name.empty()) return absl::StrCat("node #", index);
  const bool shared = std::any_of(nodes_.begin(), nodes_.end(), [&](const GemmNode& other) {
    return &other != &nodes_[index] && other.name == name;
  });
  return shared ? absl::StrCat("node #", index, " \"", name, "\"") : absl::StrCat("node \"", name, "\"");
}

absl::Status GemmGraph::NodeError(int index, absl::string_view message) const {
  return absl::InvalidArgumentError(absl::StrCat(NodeLabel(index), ": ", message));
}

absl::Status GemmGraph::ValidateShapes() const {
  for (int i = 0; i < size(); ++i) {
    if (absl::Status status = CheckNodeShapes(nodes_[i]); !status.ok()) return NodeError(i, status.message());
  }
  return absl::OkStatus();
}

absl::Status GemmGraph::CheckEachView(
    const std::function<absl::Status(std::string_view role, const TensorView& view)>& check) const {
  for (int i = 0; i < size(); ++i) {
    for (const RoleView& rv : AllViews(nodes_[i])) {
      if (rv.view->empty()) continue;
      if (absl::Status status = check(rv.role, *rv.view); !status.ok()) return NodeError(i, status.message());
    }
  }
  return absl::OkStatus();
}

absl::Status GemmGraph::Validate() const {
  const int n = size();
  // Rules 1-6, node by node.
  for (int i = 0; i < n; ++i) {
    if (absl::Status status = CheckNode(nodes_[i]); !status.ok()) return NodeError(i, status.message());
  }

  // Rule 7: each element written by at most one node.
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < j; ++i) {
      if (Overlaps(nodes_[j].c, nodes_[i].c)) {
        return NodeError(j, absl::StrFormat("tensor written by two nodes: C \"%s\" %s overlaps C "
                                            "\"%s\" %s of %s",
                                            nodes_[j].c.name, ByteRange(nodes_[j].c), nodes_[i].c.name,
                                            ByteRange(nodes_[i].c), NodeLabel(i)));
      }
    }
  }

  // The data edges: producer i -> consumer j when j reads memory i writes.
  std::vector<std::vector<RoleView>> inputs(n);
  for (int j = 0; j < n; ++j) inputs[j] = Inputs(nodes_[j]);
  std::vector<std::vector<int>> consumers_of(n), producers_of(n);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < n; ++i) {
      if (i != j && FirstOverlappingInput(inputs[j], nodes_[i]) != nullptr) {
        consumers_of[i].push_back(j);
        producers_of[j].push_back(i);
      }
    }
  }

  // Rule 8: no cycle.
  if (std::vector<int> cycle = FindCycle(consumers_of, producers_of); !cycle.empty()) {
    std::vector<std::string> names;
    for (int node : cycle) names.push_back(NodeLabel(node));
    return absl::InvalidArgumentError(
        absl::StrCat("cycle in the data dependencies: ", absl::StrJoin(names, " -> "),
                     " (each node reads memory the one before it writes)"));
  }

  // Rule 9: no write-after-read hazard (a later node writing what an earlier
  // node reads).
  for (int earlier = 0; earlier < n; ++earlier) {
    for (int later : producers_of[earlier]) {
      if (later <= earlier) continue;
      const RoleView* input = FirstOverlappingInput(inputs[earlier], nodes_[later]);
      return NodeError(
          later, absl::StrFormat("hazard (write after read): writes C \"%s\" %s, which overlaps %s %s "
                                 "read by %s, added earlier; graphs run in data-flow order, "
                                 "so %s would read the new value",
                                 nodes_[later].c.name, ByteRange(nodes_[later].c), Describe(input->role, *input->view),
                                 ByteRange(*input->view), NodeLabel(earlier), NodeLabel(earlier)));
    }
  }

  // Rule 10: K = 0 reads no produced bias or residual.
  for (int j = 0; j < n; ++j) {
    const GemmNode& node = nodes_[j];
    if (node.k() != 0 || node.c.empty() || producers_of[j].empty()) continue;
    const int i = producers_of[j].front();
    const RoleView* input = FirstOverlappingInput(inputs[j], nodes_[i]);  // not null: i is a producer of j
    return NodeError(j, absl::StrFormat("K is 0 (C = activation(bias) + residual) and its %s is written by "
                                        "%s: a job of a node with K = 0 runs its epilogue alone, "
                                        "and the kernels order an epilogue after its producers only through "
                                        "the job's loads of A; make the %s a graph input, or give the node "
                                        "K > 0",
                                        Describe(input->role, *input->view), NodeLabel(i), input->role));
  }
  return absl::OkStatus();
}

namespace {

// Fills `dependency`'s offsets for an operand view that overlaps a producer's
// output, or sets whole_tensor when the mapping is not one translation.
void MapOperandOntoOutput(const TensorView& operand, const TensorView& output,
                          DataDependency& dependency) {
  dependency.whole_tensor = true;
  if (operand.element_size() != output.element_size()) return;
  const Wide element_size = static_cast<Wide>(output.element_size());
  const Wide d = Address(operand) - Address(output);
  if (d % element_size != 0) return;
  const Wide offset = d / element_size;  // elements from C's origin to the operand's

  if (operand.rows == 1 && output.rows == 1) {
    dependency.row_offset = 0;
    dependency.col_offset = static_cast<int64_t>(offset);
    dependency.whole_tensor = false;
    return;
  }
  const Wide stride_bytes = SharedStrideBytes(operand, output);
  if (stride_bytes == 0 || stride_bytes % element_size != 0) return;
  const Wide stride = stride_bytes / element_size;

  // Operand (r, c) is output (r + ro, c + co) when ro * stride + co == offset.
  // Keep the candidates whose translated rectangle meets the output's:
  //   co in [-(operand.cols - 1), output.cols - 1] and
  //   ro in [-(operand.rows - 1), output.rows - 1]
  //      <=> co in [offset - (output.rows - 1) * stride, offset + (operand.rows - 1) * stride].
  // Exactly one candidate: a translation. More than one: the operand's rows
  // straddle the output's rows, so no single translation describes it.
  const Wide low = std::max(static_cast<Wide>(-(operand.cols - 1)),
                            offset - static_cast<Wide>(output.rows - 1) * stride);
  const Wide high = std::min(static_cast<Wide>(output.cols - 1),
                             offset + static_cast<Wide>(operand.rows - 1) * stride);
  const Wide first = low + FloorMod(offset - low, stride);
  if (first > high || first + stride <= high) return;
  dependency.row_offset = static_cast<int64_t>((offset - first) / stride);
  dependency.col_offset = static_cast<int64_t>(first);
  dependency.whole_tensor = false;
}

}  // namespace

std::vector<DataDependency> GemmGraph::Dependencies() const {
  std::vector<DataDependency> dependencies;
  for (int consumer = 0; consumer < size(); ++consumer) {
    const std::vector<RoleView> inputs = Inputs(nodes_[consumer]);
    for (int producer = 0; producer < consumer; ++producer) {
      const TensorView& output = nodes_[producer].c;
      for (const RoleView& input : inputs) {
        if (!Overlaps(*input.view, output)) continue;
        DataDependency dependency{
            .consumer = consumer, .producer = producer, .operand = input.operand};
        MapOperandOntoOutput(*input.view, output, dependency);
        dependencies.push_back(dependency);
      }
    }
  }
  return dependencies;
}

}  // namespace loom
