// demos/mlp_block.cc: a Llama-style SwiGLU MLP block as one loom graph.
//
//   x [tokens, hidden] bf16
//   gate_up: h = swiglu(x · W_guᵀ)    W_gu [2*intermediate, hidden], rows
//                                     interleaving gate and up (row 2j: gate_j,
//                                     row 2j+1: up_j); h [tokens, intermediate]
//   down:    y = h · W_downᵀ + x       W_down [hidden, intermediate]; y [tokens, hidden]
//
// "down" reads h, so its tile jobs wait on the gate_up tiles they need, inside
// the one persistent kernel. Without a GPU (or with --cpu) the CPU reference
// executor runs the graph at a reduced size.
//
//   mlp_block                              # 64 tokens, 4096 / 14336, on the GPU
//   mlp_block --tokens=1 --explain         # decode-sized, with the schedule printed
//   mlp_block --cpu                        # CPU reference, reduced size
#include <cstdint>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "demo_common.h"
#include "loom/status.h"

ABSL_FLAG(std::optional<int64_t>, tokens, std::nullopt,
          "Rows of x (default 64 on the GPU, 8 on the CPU reference).");
ABSL_FLAG(std::optional<int64_t>, hidden, std::nullopt,
          "Model width (default 4096 on the GPU, 1024 on the CPU reference).");
ABSL_FLAG(std::optional<int64_t>, intermediate, std::nullopt,
          "MLP width (default 14336 on the GPU, 2048 on the CPU reference).");

namespace {

loom::demo::DemoGraph MlpBlock(int64_t tokens, int64_t hidden, int64_t intermediate) {
  using loom::demo::MatrixRole;
  loom::demo::DemoGraph demo;
  demo.title = absl::StrFormat("SwiGLU MLP block: tokens %d, hidden %d, intermediate %d", tokens,
                               hidden, intermediate);
  demo.matrices = {
      {"x", tokens, hidden, MatrixRole::kActivation},
      {"w_gate_up", 2 * intermediate, hidden, MatrixRole::kWeight},
      {"h", tokens, intermediate, MatrixRole::kProduced},
      {"w_down", hidden, intermediate, MatrixRole::kWeight},
      {"y", tokens, hidden, MatrixRole::kProduced},
  };
  demo.results = {"y"};
  demo.build = [](const loom::demo::ViewOf& view) {
    loom::Epilogue swiglu;
    swiglu.activation = loom::Activation::kSwiGLU;
    loom::Epilogue add_x;
    add_x.residual = view("x");
    loom::GemmGraph graph;
    graph.AddGemm("gate_up", view("x"), view("w_gate_up"), view("h"), swiglu);
    graph.AddGemm("down", view("h"), view("w_down"), view("y"), add_x);
    return graph;
  };
  return demo;
}

absl::Status Run() {
  const loom::demo::Target target = loom::demo::ChooseTarget();
  const int64_t tokens = loom::demo::ResolveSize(absl::GetFlag(FLAGS_tokens), 64, 8, target);
  const int64_t hidden = loom::demo::ResolveSize(absl::GetFlag(FLAGS_hidden), 4096, 1024, target);
  const int64_t intermediate =
      loom::demo::ResolveSize(absl::GetFlag(FLAGS_intermediate), 14336, 2048, target);
  LOOM_RETURN_IF_ERROR(loom::demo::CheckPositive("tokens", tokens));
  LOOM_RETURN_IF_ERROR(loom::demo::CheckPositive("hidden", hidden));
  LOOM_RETURN_IF_ERROR(loom::demo::CheckPositive("intermediate", intermediate));
  return loom::demo::RunDemo(target, MlpBlock(tokens, hidden, intermediate));
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Runs a Llama-style SwiGLU MLP block (gate_up + down, residual) as one loom graph.\n"
      "Without a GPU, runs the CPU reference executor at a reduced size.");
  loom::demo::ListDemoFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  return loom::demo::Finish(Run());
}
