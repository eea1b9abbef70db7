// graph_validation_test.cc: GemmGraph::Validate (CPU only).
//
// Every refusal rule has its own case in RefusalTest: the status must be
// InvalidArgument and its message must name the node and/or tensor, the rule
// and the offending value. The positive tests cover the graphs loom is built
// for (chains, diamonds, an MLP block, column-slice producers, zero-size
// nodes). Tensors point at fake device addresses; nothing is dereferenced.
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "loom/graph.h"
#include "loom/tensor.h"
#include "testbed/fake_views.h"

namespace loom {
namespace {

// Fake device regions, far enough apart that the tensors of a test never meet
// unless the test means them to.
constexpr uintptr_t kX = 0x1000000;
constexpr uintptr_t kW = 0x2000000;
constexpr uintptr_t kY = 0x3000000;
constexpr uintptr_t kBias = 0x4000000;
constexpr uintptr_t kResidual = 0x5000000;
constexpr uintptr_t kH = 0x6000000;
constexpr uintptr_t kW2 = 0x7000000;
constexpr uintptr_t kZ = 0x8000000;

using testbed::At;
using testbed::WithActivation;
using testbed::WithBias;
using testbed::WithBiasAndResidual;
using testbed::WithResidual;

TensorView Typed(std::string name, uintptr_t address, DType dtype, int64_t rows, int64_t cols) {
  return TensorView::Dense(std::move(name), At(address), dtype, rows, cols);
}
TensorView Bf16(std::string name, uintptr_t address, int64_t rows, int64_t cols) {
  return Typed(std::move(name), address, DType::kBF16, rows, cols);
}
TensorView Strided(std::string name, uintptr_t address, int64_t rows, int64_t cols,
                   int64_t row_stride) {
  return TensorView{std::move(name), At(address), DType::kBF16, rows, cols, row_stride};
}

// The default node "proj": x [64, 128] · w [256, 128]ᵀ -> y [64, 256].
TensorView X() { return Bf16("x", kX, 64, 128); }
TensorView W() { return Bf16("w", kW, 256, 128); }
TensorView Y() { return Bf16("y", kY, 64, 256); }

GemmGraph Single(TensorView a, TensorView b, TensorView c, Epilogue epilogue = {}) {
  GemmGraph graph;
  graph.AddGemm("proj", std::move(a), std::move(b), std::move(c), std::move(epilogue));
  return graph;
}

// --- Refusals: one case per rule. ---

struct RefusalCase {
  std::string name;
  std::function<GemmGraph()> build;
  std::vector<std::string> must_contain;           // node/tensor names, the rule, the value
  std::vector<std::string> must_not_contain = {};  // e.g. a cycle is not a hazard
};

void PrintTo(const RefusalCase& refusal, std::ostream* os) { *os << refusal.name; }

std::vector<RefusalCase> RefusalCases() {
  std::vector<RefusalCase> cases;
  // Dtype tuples.
  cases.push_back({"DTypeFp8Inputs",
                   [] {
                     return Single(Typed("x", kX, DType::kFP8E4M3, 64, 128),
                                   Typed("w", kW, DType::kFP8E4M3, 256, 128), Y());
                   },
                   {"node \"proj\": dtype tuple (A fp8_e4m3, B fp8_e4m3, C bf16) is not "
                    "supported; supported: A=B=bf16, C in {bf16, fp32}; A=B=fp16, C in {fp16, fp32}"}});
  // An Activation cast from an integer past the enum: the kernels and the
  // reference would each fall back to no activation.
  cases.push_back({"ActivationOutOfRange",
                   [] { return Single(X(), W(), Y(), WithActivation(static_cast<Activation>(9))); },
                   {"node \"proj\": epilogue activation 9 is not one of none, relu, gelu, silu, swiglu"}});
  // The first value past the enum, not only one far past it.
  cases.push_back({"ActivationJustPastTheEnum",
                   [] { return Single(X(), W(), Y(), WithActivation(static_cast<Activation>(5))); },
                   {"node \"proj\": epilogue activation 5 is not one of none, relu, gelu, silu, swiglu"}});
  // A K = 0 node whose bias and residual two nodes write: the message names
  // the first producer (the lowest index) and the operand it writes.
  cases.push_back({"ZeroKWithAProducedBiasAndResidual",
                   [] {
                     GemmGraph graph;
                     const TensorView bias = Bf16("bias", kBias, 1, 256);
                     graph.AddGemm("bias_node", Bf16("x1", kX, 1, 128), W(), bias);
                     graph.AddGemm("residual_node", X(), W(), Y());
                     graph.AddGemm("zero_k", Bf16("a", kH, 64, 0), Bf16("b", kW2, 256, 0), Bf16("z", kZ, 64, 256),
                                   WithBiasAndResidual(bias, Y()));
                     return graph;
                   },
                   {"node \"zero_k\": K is 0", "its bias \"bias\" is written by node \"bias_node\""},
                   {"residual_node"}});
  // The reader has an earlier producer (p) as well as the later writer: the
  // hazard with the later one is still found (the walk over a reader's
  // producers goes past the earlier ones).
  cases.push_back({"WriteAfterReadBehindAnEarlierProducer",
                   [] {
                     // "reader" reads h (from "p", earlier) and its residual r;
                     // "late", added after it, writes r.
                     GemmGraph graph;
                     graph.AddGemm("p", X(), W(), Bf16("h", kH, 64, 256));
                     graph.AddGemm("reader", Bf16("h", kH, 64, 256), Bf16("w2", kW2, 128, 256),
                                   Bf16("z", kZ, 64, 128), WithResidual(Bf16("r", kResidual, 64, 128)));
                     graph.AddGemm("late", X(), Bf16("w3", kBias, 128, 128), Bf16("r.new", kResidual, 64, 128));
                     return graph;
                   },
                   {"node \"late\": hazard (write after read): writes C \"r.new\"", "overlaps residual \"r\"",
                    "read by node \"reader\", added earlier"}});
  // A residual of too few rows (the epilogue would read past it); the
  // ResidualShape case has the wrong column count.
  cases.push_back({"ResidualRows",
                   [] { return Single(X(), W(), Y(), WithResidual(Bf16("r", kResidual, 32, 256))); },
                   {"node \"proj\": shapes do not chain: residual \"r\" is [32, 256], expected "
                    "[M, N_out] = [64, 256]"}});
  // A cycle whose nodes are not the graph's first (nodes 1 and 3, between
  // independent ones) is still reported as a cycle, not as a hazard.
  cases.push_back({"TwoNodeCycleAmongIndependentNodes",
                   [] {
                     GemmGraph graph;
                     graph.AddGemm("free0", Bf16("u0", kH, 64, 128), Bf16("v", kW2, 128, 128),
                                   Bf16("o0", kZ, 64, 128));
                     graph.AddGemm("a", Bf16("t1", kX, 64, 128), Bf16("w", kW, 128, 128),
                                   Bf16("t2", kY, 64, 128));
                     graph.AddGemm("free2", Bf16("u0", kH, 64, 128), Bf16("v", kW2, 128, 128),
                                   Bf16("o2", kBias, 64, 128));
                     graph.AddGemm("b", Bf16("t2", kY, 64, 128), Bf16("w", kW, 128, 128),
                                   Bf16("t1", kX, 64, 128));
                     return graph;
                   },
                   {"cycle in the data dependencies: node \"a\" -> node \"b\" -> node \"a\""},
                   {"hazard"}});
  cases.push_back({"DTypeFp16InputsBf16Output",
                   [] {
                     return Single(Typed("x", kX, DType::kFP16, 64, 128),
                                   Typed("w", kW, DType::kFP16, 256, 128), Y());
                   },
                   {"node \"proj\"", "(A fp16, B fp16, C bf16) is not supported"}});
  cases.push_back({"DTypeMixedInputs",
                   [] {
                     return Single(X(), Typed("w", kW, DType::kFP16, 256, 128),
                                   Typed("y", kY, DType::kFP32, 64, 256));
                   },
                   {"node \"proj\"", "(A bf16, B fp16, C fp32) is not supported"}});
  cases.push_back({"DTypeFp8Output",
                   [] { return Single(X(), W(), Typed("y", kY, DType::kFP8E4M3, 64, 256)); },
                   {"node \"proj\"", "(A bf16, B bf16, C fp8_e4m3) is not supported"}});
  cases.push_back({"DTypeFp16Output",
                   [] { return Single(X(), W(), Typed("y", kY, DType::kFP16, 64, 256)); },
                   {"node \"proj\"", "(A bf16, B bf16, C fp16) is not supported"}});
  cases.push_back(
      {"DTypeBias",
       [] { return Single(X(), W(), Y(), WithBias(Typed("b", kBias, DType::kFP16, 1, 256))); },
       {"node \"proj\": bias \"b\": dtype fp16 is not supported beside bf16 inputs; supported: bf16, "
        "fp32"}});
  cases.push_back({"DTypeBf16BiasOfFp16Inputs",
                   [] {
                     return Single(Typed("x", kX, DType::kFP16, 64, 128), Typed("w", kW, DType::kFP16, 256, 128),
                                   Typed("y", kY, DType::kFP16, 64, 256),
                                   WithBias(Typed("b", kBias, DType::kBF16, 1, 256)));
                   },
                   {"node \"proj\": bias \"b\": dtype bf16 is not supported beside fp16 inputs; supported: "
                    "fp16, fp32"}});
  cases.push_back({"DTypeBf16ResidualOfFp16Inputs",
                   [] {
                     return Single(Typed("x", kX, DType::kFP16, 64, 128), Typed("w", kW, DType::kFP16, 256, 128),
                                   Typed("y", kY, DType::kFP32, 64, 256),
                                   WithResidual(Typed("r", kResidual, DType::kBF16, 64, 256)));
                   },
                   {"node \"proj\": residual \"r\": dtype bf16 is not supported beside fp16 inputs"}});
  // Enum values cast from integers outside DType: the message names them.
  cases.push_back({"DTypeOutOfRange",
                   [] {
                     return Single(Typed("x", kX, static_cast<DType>(7), 64, 128),
                                   Typed("w", kW, static_cast<DType>(7), 256, 128), Y());
                   },
                   {"node \"proj\": dtype tuple (A unknown (7), B unknown (7), C bf16) is not supported"}});
  cases.push_back({"DTypeOutOfRangeResidual",
                   [] {
                     return Single(X(), W(), Y(), WithResidual(Typed("r", kResidual, static_cast<DType>(9), 64, 256)));
                   },
                   {"node \"proj\": residual \"r\": dtype unknown (9) is not supported beside bf16 inputs"}});
  cases.push_back({"DTypeResidual",
                   [] {
                     return Single(X(), W(), Y(),
                                   WithResidual(Typed("r", kResidual, DType::kFP8E4M3, 64, 256)));
                   },
                   {"node \"proj\": residual \"r\": dtype fp8_e4m3 is not supported"}});

  // Well-formed views.
  cases.push_back({"ColumnsPastTheView",
                   [] { return Single(X().Columns(100, 64).Named("x.cols"), Bf16("w", kW, 256, 64), Y()); },
                   {"node \"proj\": A \"x.cols\": Columns(100, 64) of a view of 128 columns leaves it"}});
  cases.push_back({"RowsPastTheView",
                   [] { return Single(X(), W(), Bf16("y", kY, 128, 256).Rows(96, 64).Named("y.rows")); },
                   {"node \"proj\": C \"y.rows\": Rows(96, 64) of a view of 128 rows leaves it"}});
  // Inside the parent's rows, but 2^39 rows of 2^24 elements apart take
  // the address past 64 bits (the byte offset 2^64 wrapped to the base once).
  cases.push_back({"RowsPastTheAddressSpace",
                   [] {
                     return Single(Strided("x", kX, int64_t{1} << 40, 128, int64_t{1} << 24)
                                       .Rows(int64_t{1} << 39, 64)
                                       .Named("x.rows"),
                                   W(), Y());
                   },
                   {"node \"proj\": A \"x.rows\": Rows(549755813888, 64) of a view of 1099511627776 rows, "
                    "16777216 elements apart, lies outside the 64-bit address space"}});
  // An fp32 C of 1.5 x 2^62 rows, INT64_MAX elements apart: its extent passes
  // even 128 bits (it once wrapped negative and passed this rule).
  cases.push_back({"ExtentPastOneHundredTwentySevenBits",
                   [] {
                     const int64_t rows = (int64_t{1} << 62) + (int64_t{1} << 61);
                     return Single(Bf16("x", kX, rows, 1), Bf16("w", kW, 1, 1),
                                   TensorView{"y", reinterpret_cast<void*>(kY), DType::kFP32, rows, 1,
                                              std::numeric_limits<int64_t>::max()});
                   },
                   {"node \"proj\": C \"y\"", "(more than 2^127 bytes) runs past the end of the address space"}});
  cases.push_back({"NegativeM",
                   [] { return Single(Strided("x", kX, -1, 128, 128), W(), Y()); },
                   {"node \"proj\": A \"x\": rows -1 is negative"}});
  cases.push_back({"NegativeN",
                   [] { return Single(X(), Strided("w", kW, -2, 128, 128), Y()); },
                   {"node \"proj\": B \"w\": rows -2 is negative"}});
  cases.push_back({"NegativeK",
                   [] { return Single(Strided("x", kX, 64, -3, 128), W(), Y()); },
                   {"node \"proj\": A \"x\": cols -3 is negative"}});
  cases.push_back({"NegativeRowStride",
                   [] { return Single(X(), W(), Strided("y", kY, 64, 256, -256)); },
                   {"node \"proj\": C \"y\": row stride -256 elements is negative"}});
  cases.push_back({"RowStrideBelowCols",
                   [] { return Single(Strided("x", kX, 64, 128, 64), W(), Y()); },
                   {"node \"proj\": A \"x\": row stride 64 elements is less than cols 128"}});
  cases.push_back(
      {"NullData",
       [] { return Single(X(), TensorView::Dense("w", nullptr, DType::kBF16, 256, 128), Y()); },
       {"node \"proj\": B \"w\": data is null for a non-empty [256, 128] view"}});
  cases.push_back(
      {"WrapsAddressSpace",
       [] { return Single(Bf16("x", 0xfffffffffffff000, 64, 128), W(), Y()); },
       {"node \"proj\": A \"x\"", "16384 bytes", "runs past the end of the address space"}});

  // TMA limits.
  cases.push_back({"RowsPastTmaLimit",
                   [] {
                     const int64_t m = int64_t{1} << 31;
                     return Single(Bf16("x", kX, m, 128), W(), Bf16("y", kY, m, 256));
                   },
                   {"node \"proj\": A \"x\": rows 2147483648 exceeds TMA's limit of 2147483647"}});
  cases.push_back({"ColsPastTmaLimit",
                   [] {
                     const int64_t k = int64_t{1} << 31;
                     return Single(Bf16("x", kX, 64, k), Bf16("w", kW, 256, k), Y());
                   },
                   {"node \"proj\": A \"x\": cols 2147483648 exceeds TMA's limit of 2147483647"}});
  cases.push_back({"BaseNotAligned",
                   [] { return Single(Bf16("x", kX + 2, 64, 128), W(), Y()); },
                   {"node \"proj\": A \"x\": base address 0x1000002 is not 16-byte aligned"}});
  cases.push_back({"OutputBaseNotAligned",
                   [] { return Single(X(), W(), Bf16("y", kY + 8, 64, 256)); },
                   {"node \"proj\": C \"y\": base address 0x3000008 is not 16-byte aligned"}});
  cases.push_back(
      {"ResidualBaseNotAligned",
       [] { return Single(X(), W(), Y(), WithResidual(Bf16("r", kResidual + 4, 64, 256))); },
       {"node \"proj\": residual \"r\": base address 0x5000004 is not 16-byte "
        "aligned"}});
  cases.push_back({"BiasNotAligned",
                   [] { return Single(X(), W(), Y(), WithBias(Bf16("b", kBias + 2, 1, 256))); },
                   {"node \"proj\": bias \"b\": base address 0x4000002 is not 4-byte aligned"}});
  cases.push_back({"RowStrideNotMultipleOf16",
                   [] {
                     GemmGraph graph;
                     graph.AddGemm("down", Bf16("h", kH, 64, 2048),
                                   Strided("w_down", kW, 256, 2048, 2049), Y());
                     return graph;
                   },
                   {"node \"down\": B \"w_down\": row stride 4098 bytes is not a multiple of 16"}});
  cases.push_back({"RowStridePastTmaLimit",
                   [] {
                     return Single(Strided("x", kX, 2, 8, int64_t{1} << 39), Bf16("w", kW, 256, 8),
                                   Bf16("y", kY, 2, 256));
                   },
                   {"node \"proj\": A \"x\": row stride 1099511627776 bytes is not below TMA's "
                    "limit of 2^40 bytes"}});
  cases.push_back({"KPastJobEncoding",
                   [] {
                     const int64_t k = 65535 * 64 + 1;
                     const int64_t padded = 65535 * 64 + 8;  // keeps strides 16-byte multiples
                     return Single(Strided("x", kX, 64, k, padded),
                                   Strided("w", 0x100000000, 256, k, padded), Y());
                   },
                   {"node \"proj\": K 4194241 exceeds the limit of 4194240"}});

  // Shapes.
  cases.push_back({"KMismatch",
                   [] { return Single(X(), Bf16("w", kW, 256, 96), Y()); },
                   {"node \"proj\": shapes do not chain: A \"x\" has K = 128 columns but B \"w\" "
                    "has K = 96"}});
  cases.push_back({"OutputRowsMismatch",
                   [] { return Single(X(), W(), Bf16("y", kY, 32, 256)); },
                   {"node \"proj\": shapes do not chain: C \"y\" has 32 rows, expected M = 64"}});
  cases.push_back({"OutputColsMismatch",
                   [] { return Single(X(), W(), Bf16("y", kY, 64, 128)); },
                   {"node \"proj\": shapes do not chain: C \"y\" has 128 columns, expected "
                    "N_out = 256"}});
  cases.push_back({"SwiGLUOutputNotHalved",
                   [] { return Single(X(), W(), Y(), WithActivation(Activation::kSwiGLU)); },
                   {"node \"proj\": shapes do not chain: C \"y\" has 256 columns, expected "
                    "N_out = 128 (N = 256 halved by swiglu)"}});
  cases.push_back({"SwiGLUOddN",
                   [] {
                     return Single(X(), Bf16("w", kW, 255, 128), Bf16("y", kY, 64, 127),
                                   WithActivation(Activation::kSwiGLU));
                   },
                   {"node \"proj\": swiglu needs an even N", "B \"w\" has N = 255 rows"}});
  cases.push_back({"BiasShape",
                   [] { return Single(X(), W(), Y(), WithBias(Bf16("b", kBias, 1, 128))); },
                   {"node \"proj\": shapes do not chain: bias \"b\" is [1, 128], expected "
                    "[1, N] = [1, 256]"}});
  cases.push_back({"BiasTwoRows",
                   [] { return Single(X(), W(), Y(), WithBias(Bf16("b", kBias, 2, 256))); },
                   {"node \"proj\"", "bias \"b\" is [2, 256], expected [1, N] = [1, 256]"}});
  cases.push_back(
      {"ResidualShape",
       [] { return Single(X(), W(), Y(), WithResidual(Bf16("r", kResidual, 64, 128))); },
       {"node \"proj\": shapes do not chain: residual \"r\" is [64, 128], expected "
        "[M, N_out] = [64, 256]"}});

  // Graph rules.
  cases.push_back({"InPlace",
                   [] {
                     const TensorView y = Y();
                     return Single(y.Columns(0, 128).Named("y.left"), W(), y);
                   },
                   {"node \"proj\": reads A \"y.left\"", "writes C \"y\"", "0x3000000",
                    "in-place GEMMs are not supported"}});
  cases.push_back({"InPlaceResidual",
                   [] { return Single(X(), W(), Y(), WithResidual(Y())); },
                   {"node \"proj\": reads residual \"y\"", "writes C \"y\"",
                    "in-place GEMMs are not supported"}});
  // B [256, 128] is y [64, 256]'s first 64 KiB read as a weight matrix.
  cases.push_back({"InPlaceWeights",
                   [] { return Single(X(), Bf16("w.y", kY, 256, 128), Y()); },
                   {"node \"proj\": reads B \"w.y\"", "writes C \"y\"", "in-place GEMMs are not supported"}});
  cases.push_back({"InPlaceBias",
                   [] { return Single(X(), W(), Y(), WithBias(Y().Rows(0, 1).Named("y.row0"))); },
                   {"node \"proj\": reads bias \"y.row0\"", "writes C \"y\"",
                    "in-place GEMMs are not supported"}});
  cases.push_back({"WrittenByTwoNodes",
                   [] {
                     GemmGraph graph;
                     graph.AddGemm("first", X(), W(), Y());
                     graph.AddGemm("second", X().Rows(32, 32), W(),
                                   Y().Rows(32, 32).Named("y.bottom"));
                     return graph;
                   },
                   {"node \"second\": tensor written by two nodes: C \"y.bottom\"",
                    "overlaps C \"y\"", "of node \"first\"", "0x3004000"}});
  cases.push_back({"WrittenByTwoNodesOverlappingColumns",
                   [] {
                     const TensorView buffer = Bf16("buf", kY, 64, 512);
                     GemmGraph graph;
                     graph.AddGemm("first", X(), W(), buffer.Columns(0, 256).Named("buf.a"));
                     graph.AddGemm("second", X(), W(), buffer.Columns(128, 256).Named("buf.b"));
                     return graph;
                   },
                   {"node \"second\": tensor written by two nodes: C \"buf.b\"",
                    "overlaps C \"buf.a\"", "of node \"first\""}});
  cases.push_back({"ZeroKWithAProducedResidual",
                   [] {
                     GemmGraph graph;
                     graph.AddGemm("first", X(), W(), Y());
                     graph.AddGemm("zero_k", Bf16("a", kH, 64, 0), Bf16("b", kW2, 256, 0),
                                   Bf16("z", kZ, 64, 256), WithResidual(Y()));
                     return graph;
                   },
                   {"node \"zero_k\": K is 0 (C = activation(bias) + residual) and its residual \"y\"",
                    "is written by node \"first\"", "make the residual a graph input"}});
  cases.push_back({"ZeroKWithAProducedBias",
                   [] {
                     GemmGraph graph;
                     const TensorView bias = Bf16("bias", kBias, 1, 256);
                     graph.AddGemm("bias_node", Bf16("x1", kX, 1, 128), W(), bias);
                     graph.AddGemm("zero_k", Bf16("a", kH, 64, 0), Bf16("b", kW2, 256, 0), Y(),
                                   WithBias(bias));
                     return graph;
                   },
                   {"node \"zero_k\": K is 0", "its bias \"bias\" is written by node \"bias_node\"",
                    "make the bias a graph input"}});
  cases.push_back({"TwoNodeCycle",
                   [] {
                     GemmGraph graph;
                     graph.AddGemm("a", Bf16("t1", kX, 64, 128), Bf16("w", kW, 128, 128),
                                   Bf16("t2", kY, 64, 128));
                     graph.AddGemm("b", Bf16("t2", kY, 64, 128), Bf16("w", kW, 128, 128),
                                   Bf16("t1", kX, 64, 128));
                     return graph;
                   },
                   {"cycle in the data dependencies: node \"a\" -> node \"b\" -> node \"a\""},
                   {"hazard"}});
  cases.push_back({"ThreeNodeCycleInsertedOutOfOrder",
                   [] {
                     // Data flow a -> b -> c -> a, inserted as b, c, a.
                     const TensorView w = Bf16("w", kW, 128, 128);
                     const TensorView t1 = Bf16("t1", kX, 64, 128);
                     const TensorView t2 = Bf16("t2", kY, 64, 128);
                     const TensorView t3 = Bf16("t3", kH, 64, 128);
                     GemmGraph graph;
                     graph.AddGemm("b", t2, w, t3);
                     graph.AddGemm("c", t3, w, t1);
                     graph.AddGemm("a", t1, w, t2);
                     return graph;
                   },
                   {"cycle in the data dependencies: node \"b\" -> node \"c\" -> node \"a\" -> "
                    "node \"b\""},
                   {"hazard"}});
  cases.push_back({"CycleThroughResidual",
                   [] {
                     const TensorView w = Bf16("w", kW, 128, 128);
                     GemmGraph graph;
                     graph.AddGemm("a", X(), w, Bf16("t", kY, 64, 128),
                                   WithResidual(Bf16("u", kH, 64, 128)));
                     graph.AddGemm("b", Bf16("t", kY, 64, 128), w, Bf16("u", kH, 64, 128));
                     return graph;
                   },
                   {"cycle in the data dependencies: node \"a\" -> node \"b\" -> node \"a\""},
                   {"hazard"}});
  cases.push_back(
      {"WriteAfterRead",
       [] {
         // "b" overwrites x, which "a" (added earlier) reads.
         GemmGraph graph;
         graph.AddGemm("a", X(), W(), Y());
         graph.AddGemm("b", Bf16("h", kH, 64, 256), Bf16("w2", kW2, 128, 256), X());
         return graph;
       },
       {"node \"b\": hazard (write after read): writes C \"x\"", "overlaps A \"x\"",
        "read by node \"a\", added earlier", "node \"a\" would read the new value", "0x1000000"}});
  cases.push_back({"WriteAfterReadOfWeights",
                   [] {
                     GemmGraph graph;
                     graph.AddGemm("a", X(), W(), Y());
                     graph.AddGemm("b", Bf16("h", kH, 256, 64), Bf16("w2", kW2, 128, 64),
                                   W().Named("w.new"));
                     return graph;
                   },
                   {"node \"b\": hazard (write after read): writes C \"w.new\"", "overlaps B \"w\"",
                    "read by node \"a\""}});
  return cases;
}

class RefusalTest : public ::testing::TestWithParam<RefusalCase> {};

TEST_P(RefusalTest, IsInvalidArgumentNamingTheCulprit) {
  const absl::Status status = GetParam().build().Validate();
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  const std::string message(status.message());
  for (const std::string& part : GetParam().must_contain) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, part, message);
  }
  for (const std::string& part : GetParam().must_not_contain) {
    EXPECT_PRED_FORMAT2(::testing::IsNotSubstring, part, message);
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, RefusalTest, ::testing::ValuesIn(RefusalCases()),
                         [](const ::testing::TestParamInfo<RefusalCase>& info) {
                           return info.param.name;
                         });

TEST(ValidateTest, ReportsTheFirstViolation) {
  GemmGraph graph;
  graph.AddGemm("ok", X(), W(), Y());
  // Two violations in one node: the malformed view comes before the dtype.
  graph.AddGemm("bad", Typed("h", kH, DType::kFP16, -1, 128), W(), Bf16("z", kZ, 64, 256));
  graph.AddGemm("worse", X(), Bf16("w", kW, 256, 96), Bf16("u", kW2, 64, 256));
  const absl::Status status = graph.Validate();
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "node \"bad\": A \"h\": rows -1 is negative");
}

// A node whose name is empty or another node's is named with its index too,
// in the per-node rules and the rules across nodes alike.
TEST(ValidateTest, EmptyAndSharedNamesAreNamedWithTheirIndex) {
  GemmGraph unnamed;
  unnamed.AddGemm("ok", X(), W(), Y());
  unnamed.AddGemm("", Typed("h", kH, DType::kFP16, -1, 128), W(), Bf16("z", kZ, 64, 256));
  EXPECT_EQ(unnamed.Validate().message(), "node #1: A \"h\": rows -1 is negative");
  EXPECT_EQ(unnamed.ValidateShapes().message(), "node #1: A \"h\": rows -1 is negative");

  GemmGraph shared;
  shared.AddGemm("layer", X(), W(), Bf16("h", kH, 64, 256));
  shared.AddGemm("layer", Bf16("h", kH, 64, 256), Bf16("w2", kW2, 256, 256), Y());
  shared.AddGemm("layer", X(), Bf16("w3", kZ, 256, 128), Bf16("y.again", kY, 64, 256));
  const absl::Status twice = shared.Validate();
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(twice.message(), "node #2 \"layer\": tensor written by two nodes")) << twice;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "of node #1 \"layer\"", std::string(twice.message()));

  EXPECT_EQ(shared.NodeLabel(0), "node #0 \"layer\"");
  EXPECT_EQ(unnamed.NodeLabel(0), "node \"ok\"");
  EXPECT_EQ(unnamed.NodeLabel(1), "node #1");
  EXPECT_EQ(unnamed.NodeLabel(2), "node #2 (no such node)");
  EXPECT_EQ(unnamed.NodeLabel(-1), "node #-1 (no such node)");
}

TEST(ValidateTest, ExactMessageForMisalignedStride) {
  GemmGraph graph;
  graph.AddGemm("down", Bf16("h", kH, 64, 2048), Strided("w_down", kW, 256, 2048, 2049), Y());
  EXPECT_EQ(graph.Validate(),
            absl::InvalidArgumentError(
                "node \"down\": B \"w_down\": row stride 4098 bytes is not a multiple of 16"));
}

// --- Graphs that must pass. ---

TEST(ValidateTest, EmptyGraph) { EXPECT_TRUE(GemmGraph().Validate().ok()); }

// ValidateShapes: rules 1-3 only. A node the kernels cannot load (a row
// stride that is no multiple of 16 bytes) passes it; shapes that do not
// chain do not.
TEST(ValidateTest, ValidateShapesLeavesOutTheHardwareLimits) {
  const GemmGraph unaligned = Single(Strided("x", kX, 64, 100, 100), Bf16("w", kW, 256, 100), Y());
  EXPECT_EQ(unaligned.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(unaligned.ValidateShapes().ok()) << unaligned.ValidateShapes();
  const absl::Status k_mismatch = Single(X(), Bf16("w", kW, 256, 64), Y()).ValidateShapes();
  EXPECT_EQ(k_mismatch.code(), absl::StatusCode::kInvalidArgument) << k_mismatch;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "node \"proj\"", std::string(k_mismatch.message()));
}

TEST(ValidateTest, SingleNodeVariants) {
  EXPECT_TRUE(Single(X(), W(), Y()).Validate().ok());
  EXPECT_TRUE(Single(X(), W(), Typed("y", kY, DType::kFP32, 64, 256)).Validate().ok());
  for (Activation activation :
       {Activation::kNone, Activation::kReLU, Activation::kGELU, Activation::kSiLU}) {
    EXPECT_TRUE(Single(X(), W(), Y(), WithActivation(activation)).Validate().ok())
        << ActivationName(activation);
  }
  // Bias only needs 4-byte alignment; bf16 and fp32 biases and residuals.
  EXPECT_TRUE(Single(X(), W(), Y(), WithBias(Bf16("b", kBias + 4, 1, 256))).Validate().ok());
  EXPECT_TRUE(Single(X(), W(), Y(),
                     WithBiasAndResidual(Typed("b", kBias + 4, DType::kFP32, 1, 256),
                                         Typed("r", kResidual, DType::kFP32, 64, 256)))
                  .Validate()
                  .ok());
  // A Gram matrix reads one tensor twice.
  EXPECT_TRUE(Single(X(), X().Named("x.again"), Bf16("g", kY, 64, 64)).Validate().ok());
}

// fp16 inputs, with C, bias and residual each fp16 or fp32.
TEST(ValidateTest, Fp16NodeVariants) {
  const TensorView x = Typed("x", kX, DType::kFP16, 64, 128);
  const TensorView w = Typed("w", kW, DType::kFP16, 256, 128);
  for (DType out : {DType::kFP16, DType::kFP32}) {
    for (DType extra : {DType::kFP16, DType::kFP32}) {
      SCOPED_TRACE(std::string(DTypeName(out)) + " output, " + std::string(DTypeName(extra)) + " bias and residual");
      EXPECT_TRUE(Single(x, w, Typed("y", kY, out, 64, 256)).Validate().ok());
      const absl::Status status = Single(x, w, Typed("y", kY, out, 64, 256),
                                         WithBiasAndResidual(Typed("b", kBias, extra, 1, 256),
                                                             Typed("r", kResidual, extra, 64, 256)))
                                      .Validate();
      EXPECT_TRUE(status.ok()) << status;
    }
  }
}

TEST(ValidateTest, PaddedRowStride) {
  // Rows padded to 136 elements (272 bytes, a multiple of 16).
  EXPECT_TRUE(Single(Strided("x", kX, 64, 128, 136), W(), Y()).Validate().ok());
}

TEST(ValidateTest, SingleRowViewIgnoresItsStride) {
  // With one row the stride is never used: 129 elements (258 bytes) is fine.
  EXPECT_TRUE(
      Single(Strided("x", kX, 1, 128, 129), W(), Strided("y", kY, 1, 256, 0)).Validate().ok());
}

// A view whose last byte is the last byte of the address space does not run
// past it; one 16 bytes further does.
TEST(ValidateTest, ViewEndingAtTheTopOfTheAddressSpace) {
  constexpr uintptr_t kBytes = 64 * 256 * 2;  // y [64, 256] bf16
  const uintptr_t top = uintptr_t{0} - kBytes;
  const absl::Status at_top = Single(X(), W(), Bf16("y", top, 64, 256)).Validate();
  EXPECT_TRUE(at_top.ok()) << at_top;
  const absl::Status past = Single(X(), W(), Bf16("y", top + 16, 64, 256)).Validate();
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument) << past;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "node \"proj\": C \"y\"", std::string(past.message()));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "(32768 bytes) runs past the end of the address space",
                      std::string(past.message()));
  // A rule that prints byte ranges (6, in place) gives that view's end as
  // 2^64, not as the 0 it wraps to in 64 bits.
  const TensorView y = Bf16("y", top, 64, 256);
  const absl::Status in_place = Single(X(), W(), y, WithResidual(y)).Validate();
  EXPECT_EQ(in_place.code(), absl::StatusCode::kInvalidArgument) << in_place;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "[0xffffffffffff8000, 0x10000000000000000)",
                      std::string(in_place.message()));
}

// Byte ranges that touch (one ends where the other begins) share no byte:
// in-place (rule 6) and written-by-two-nodes (rule 7), for single rows and
// for views of different strides, whichever view is the first argument of
// the overlap check.
TEST(ValidateTest, TouchingByteRangesDoNotOverlap) {
  // Rule 6: A [1, 128] ends where C [1, 256] begins.
  const absl::Status in_place = Single(Bf16("x", kY - 256, 1, 128), W(), Bf16("y", kY, 1, 256)).Validate();
  EXPECT_TRUE(in_place.ok()) << in_place;
  // Rule 7: a later node writes the row just below an earlier node's row.
  const TensorView h = Bf16("h", kH, 2, 256);
  GemmGraph rows;
  rows.AddGemm("second_row", Bf16("x1", kX, 1, 128), W(), h.Rows(1, 1).Named("h.row1"));
  rows.AddGemm("first_row", Bf16("x2", kZ, 1, 128), W(), h.Rows(0, 1).Named("h.row0"));
  EXPECT_TRUE(rows.Validate().ok()) << rows.Validate();
  // Rule 7, multi-row views of different strides: [64, 128] dense ends where
  // a [64, 256] view begins.
  GemmGraph strided;
  strided.AddGemm("upper", X(), W(), Bf16("y", kY, 64, 256));
  strided.AddGemm("lower", X(), Bf16("w2", kW2, 128, 128), Bf16("z", kY - 64 * 128 * 2, 64, 128));
  EXPECT_TRUE(strided.Validate().ok()) << strided.Validate();
}

// A single-row view with a stride of its own beside a multi-row view of the
// other column half of the same buffer: no byte in common, in either node
// order (the single row is then the first and then the second view of the
// overlap check, whose single-row view keeps its own stride).
TEST(ValidateTest, OneRowOfAColumnHalfBesideTheOtherHalf) {
  const TensorView buffer = Bf16("buf", kH, 64, 512);
  const TensorView left = buffer.Columns(0, 256).Named("buf.left");
  // Row 5 of the right half, as a dense [1, 256] view (its own stride, 256).
  const TensorView row = TensorView::Dense("buf.row5.right", buffer.element(5, 256), DType::kBF16, 1, 256);
  for (const bool row_first : {false, true}) {
    SCOPED_TRACE(row_first ? "the single row added first" : "the single row added second");
    GemmGraph graph;
    if (row_first) graph.AddGemm("row", Bf16("x1", kZ, 1, 128), W(), row);
    graph.AddGemm("left", X(), W(), left);
    if (!row_first) graph.AddGemm("row", Bf16("x1", kZ, 1, 128), W(), row);
    EXPECT_TRUE(graph.Validate().ok()) << graph.Validate();
  }
}

// Rule 10 is for a node with an output: a K = 0 node without one (M = 0)
// may read a bias another node writes: it runs no job.
TEST(ValidateTest, ZeroKNodeWithoutAnOutputMayReadAProducedBias) {
  GemmGraph graph;
  const TensorView bias = Bf16("bias", kBias, 1, 256);
  graph.AddGemm("bias_node", Bf16("x1", kX, 1, 128), W(), bias);
  graph.AddGemm("no_op", TensorView::Dense("a", nullptr, DType::kBF16, 0, 0),
                TensorView::Dense("b", nullptr, DType::kBF16, 256, 0),
                TensorView::Dense("c", nullptr, DType::kBF16, 0, 256), WithBias(bias));
  EXPECT_TRUE(graph.Validate().ok()) << graph.Validate();
}

TEST(ValidateTest, LargestK) {
  const int64_t k = 65535 * 64;
  // x spans 512 MiB and w 2 GiB: keep y clear of both.
  const absl::Status status =
      Single(Bf16("x", kX, 64, k), Bf16("w", 0x100000000, 256, k), Bf16("y", 0x200000000, 64, 256))
          .Validate();
  EXPECT_TRUE(status.ok()) << status;
}

TEST(ValidateTest, Chain) {
  GemmGraph graph;
  graph.AddGemm("l1", X(), W(), Bf16("h1", kH, 64, 256));
  graph.AddGemm("l2", Bf16("h1", kH, 64, 256), Bf16("w2", kW2, 128, 256), Bf16("h2", kZ, 64, 128));
  graph.AddGemm("l3", Bf16("h2", kZ, 64, 128), Bf16("w3", 0x9000000, 256, 128), Y());
  EXPECT_TRUE(graph.Validate().ok()) << graph.Validate();
}

TEST(ValidateTest, Diamond) {
  // p -> {c1, c2} -> d: two consumers of one producer, one consumer of two.
  const TensorView w = Bf16("w", kW, 128, 128);
  const TensorView h = Bf16("h", kH, 64, 128);
  const TensorView u = Bf16("u", kY, 64, 128);
  const TensorView v = Bf16("v", kZ, 64, 128);
  GemmGraph graph;
  graph.AddGemm("p", X(), w, h);
  graph.AddGemm("c1", h, w, u);
  graph.AddGemm("c2", h, w, v, WithBias(Bf16("b", kBias, 1, 128)));
  graph.AddGemm("d", u, w, Bf16("out", kResidual, 64, 128), WithResidual(v));
  EXPECT_TRUE(graph.Validate().ok()) << graph.Validate();
}

TEST(ValidateTest, MlpWithSwiGLUAndResidual) {
  // Llama-style block at real sizes: hidden 4096, intermediate 14336.
  constexpr int64_t kTokens = 64, kHidden = 4096, kIntermediate = 14336;
  constexpr uintptr_t kGiB = uintptr_t{1} << 30;
  const TensorView x = Bf16("x", 1 * kGiB, kTokens, kHidden);
  const TensorView w_gate_up = Bf16("w_gate_up", 2 * kGiB, 2 * kIntermediate, kHidden);
  const TensorView h = Bf16("h", 3 * kGiB, kTokens, kIntermediate);
  const TensorView w_down = Bf16("w_down", 4 * kGiB, kHidden, kIntermediate);
  const TensorView y = Bf16("y", 5 * kGiB, kTokens, kHidden);
  GemmGraph graph;
  EXPECT_EQ(graph.AddGemm("up", x, w_gate_up, h, WithActivation(Activation::kSwiGLU)), 0);
  EXPECT_EQ(graph.AddGemm("down", h, w_down, y, WithResidual(x)), 1);
  EXPECT_TRUE(graph.Validate().ok()) << graph.Validate();
}

TEST(ValidateTest, ColumnSliceProducersWriteDisjointHalves) {
  // Left and right halves of one buffer share its byte range, not its elements.
  const TensorView buffer = Bf16("buf", kY, 64, 512);
  GemmGraph graph;
  graph.AddGemm("left", X(), W(), buffer.Columns(0, 256).Named("buf.left"));
  graph.AddGemm("right", X(), Bf16("w2", kW2, 256, 128),
                buffer.Columns(256, 256).Named("buf.right"));
  graph.AddGemm("consumer", buffer, Bf16("w3", kZ, 128, 512), Bf16("out", kH, 64, 128));
  EXPECT_TRUE(graph.Validate().ok()) << graph.Validate();
}

TEST(ValidateTest, RowSliceProducersWriteDisjointHalves) {
  const TensorView buffer = Bf16("buf", kY, 64, 256);
  GemmGraph graph;
  graph.AddGemm("top", X().Rows(0, 32), W(), buffer.Rows(0, 32).Named("buf.top"));
  graph.AddGemm("bottom", X().Rows(32, 32), W(), buffer.Rows(32, 32).Named("buf.bottom"));
  EXPECT_TRUE(graph.Validate().ok()) << graph.Validate();
}

TEST(ValidateTest, InterleavedColumnSlicesOfPaddedBuffer) {
  // Three column slices of a padded buffer, each a different width.
  const TensorView buffer = Strided("buf", kY, 64, 384, 400);
  GemmGraph graph;
  graph.AddGemm("a", X(), Bf16("wa", kW, 128, 128), buffer.Columns(0, 128).Named("buf.a"));
  graph.AddGemm("b", X(), Bf16("wb", kW2, 192, 128), buffer.Columns(128, 192).Named("buf.b"));
  graph.AddGemm("c", X(), Bf16("wc", kZ, 64, 128), buffer.Columns(320, 64).Named("buf.c"));
  EXPECT_TRUE(graph.Validate().ok()) << graph.Validate();
}

TEST(ValidateTest, ZeroSizeNodesAreNoOps) {
  GemmGraph graph;
  // M = 0: A and C empty (and null).
  graph.AddGemm("m0", TensorView::Dense("x0", nullptr, DType::kBF16, 0, 128), W(),
                TensorView::Dense("y0", nullptr, DType::kBF16, 0, 256));
  // N = 0.
  graph.AddGemm("n0", X(), TensorView::Dense("w0", nullptr, DType::kBF16, 0, 128),
                TensorView::Dense("c0", nullptr, DType::kBF16, 64, 0));
  // K = 0 with M = 0 or N = 0.
  graph.AddGemm("k0_m0", TensorView::Dense("a0", nullptr, DType::kBF16, 0, 0),
                TensorView::Dense("b0", nullptr, DType::kBF16, 256, 0),
                TensorView::Dense("c2", nullptr, DType::kBF16, 0, 256));
  graph.AddGemm("k0_n0", TensorView::Dense("a1", nullptr, DType::kBF16, 64, 0),
                TensorView::Dense("b1", nullptr, DType::kBF16, 0, 0),
                TensorView::Dense("c3", nullptr, DType::kBF16, 64, 0));
  // An empty view at a misaligned address is never touched.
  graph.AddGemm("m0_misaligned", Bf16("x1", kX + 2, 0, 128), W(), Bf16("y1", kZ + 2, 0, 256));
  EXPECT_TRUE(graph.Validate().ok()) << graph.Validate();
}

// K = 0 with an output: C = activation(bias) + residual, the bias and
// residual graph inputs (ZeroKWithAProduced* for the refusals), and a K = 0
// node's output may feed another node.
TEST(ValidateTest, ZeroKNodesWithAnOutputAreValid) {
  GemmGraph graph;
  graph.AddGemm("zero_k", Bf16("a", kX, 64, 0), Bf16("b", kW, 256, 0), Y(),
                {.activation = Activation::kSiLU,
                 .bias = Typed("bias", kBias, DType::kFP32, 1, 256),
                 .residual = Bf16("r", kH, 64, 256)});
  graph.AddGemm("consumer", Y(), Bf16("w2", kW2, 128, 256), Bf16("z", kZ, 64, 128));
  EXPECT_TRUE(graph.Validate().ok()) << graph.Validate();
}

TEST(ValidateTest, ZeroSizeNodesMustStillChain) {
  GemmGraph graph;
  graph.AddGemm("m0", Bf16("x0", kX, 0, 128), Bf16("w", kW, 256, 64), Bf16("y0", kY, 0, 256));
  const absl::Status status = graph.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "node \"m0\": shapes do not chain",
                      std::string(status.message()));
}

// --- AddGemm and the names. ---

TEST(GemmGraphTest, AddGemmAppendsWithoutChecking) {
  GemmGraph graph;
  EXPECT_EQ(graph.AddGemm("a", X(), W(), Y()), 0);
  EXPECT_EQ(graph.AddGemm("b", Strided("bad", 0, -1, -1, -1), W(), Y()), 1);
  ASSERT_EQ(graph.size(), 2);
  EXPECT_EQ(graph.nodes()[0].name, "a");
  EXPECT_EQ(graph.nodes()[0].m(), 64);
  EXPECT_EQ(graph.nodes()[0].n(), 256);
  EXPECT_EQ(graph.nodes()[0].k(), 128);
  EXPECT_EQ(graph.nodes()[1].a.name, "bad");
}

// CheckEachView visits every non-empty view in node order (A, B, C, bias,
// residual within a node) and puts the node's label before the first error.
TEST(GemmGraphTest, CheckEachViewVisitsNonEmptyViewsInOrder) {
  GemmGraph graph;
  Epilogue epilogue;
  epilogue.bias = Bf16("b", 0x500000, 1, 256);
  epilogue.residual = Bf16("r", 0x600000, 64, 256);
  graph.AddGemm("proj", X(), W(), Y(), epilogue);
  graph.AddGemm("empty", Bf16("e", 0x700000, 0, 128), W(), Bf16("f", 0x800000, 0, 256));
  graph.AddGemm("next", Bf16("z", 0x900000, 64, 256), Bf16("v", 0xa00000, 32, 256), Bf16("o", 0xb00000, 64, 32));
  std::vector<std::string> seen;
  const auto record = [&](std::string_view role, const TensorView& view) {
    seen.push_back(std::string(role) + ":" + view.name);
    return absl::OkStatus();
  };
  EXPECT_TRUE(graph.CheckEachView(record).ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"A:x", "B:w", "C:y", "bias:b", "residual:r", "B:w", "A:z", "B:v",
                                            "C:o"}));
  const absl::Status refused = graph.CheckEachView([](std::string_view role, const TensorView& view) {
    return role == "B" && view.name == "v" ? absl::InvalidArgumentError("B \"v\": no") : absl::OkStatus();
  });
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "node \"next\": B \"v\": no");
}

TEST(GemmGraphTest, Names) {
  EXPECT_EQ(ActivationName(Activation::kNone), "none");
  EXPECT_EQ(ActivationName(Activation::kReLU), "relu");
  EXPECT_EQ(ActivationName(Activation::kGELU), "gelu");
  EXPECT_EQ(ActivationName(Activation::kSiLU), "silu");
  EXPECT_EQ(ActivationName(Activation::kSwiGLU), "swiglu");
  EXPECT_EQ(OperandName(Operand::kA), "A");
  EXPECT_EQ(OperandName(Operand::kB), "B");
  EXPECT_EQ(OperandName(Operand::kBias), "bias");
  EXPECT_EQ(OperandName(Operand::kResidual), "residual");
}

}  // namespace
}  // namespace loom
