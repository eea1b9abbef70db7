// demos/linear_chain.cc: a chain of linear layers as one loom graph.
//
//   x0 [tokens, width] → layer0 → x1 → layer1 → ... → x8     W_i [width, width]
//
// Each layer reads the previous one's output, so layer i+1's tile jobs start
// as soon as the slices of x_{i+1} they read are written, with no launch gap
// between layers. At one token (decode) the chain is bound by streaming the
// weights.
//
//   linear_chain                          # 8 layers 4096x4096, 1 token, on the GPU
//   linear_chain --tokens=32 --layers=4
//   linear_chain --cpu                    # CPU reference, reduced size
#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "demo_common.h"
#include "loom/scheduler/tiling.h"
#include "loom/status.h"

ABSL_FLAG(std::optional<int64_t>, tokens, std::nullopt,
          "Rows of x0 (default 1 on the GPU and on the CPU reference).");
ABSL_FLAG(std::optional<int64_t>, width, std::nullopt,
          "Width of every layer (default 4096 on the GPU, 1024 on the CPU reference).");
ABSL_FLAG(int64_t, layers, 8, "Number of layers in the chain.");

namespace {

std::string LayerInput(int64_t layer) { return absl::StrCat("x", layer); }

loom::demo::DemoGraph LinearChain(int64_t tokens, int64_t width, int64_t layers) {
  using loom::demo::MatrixRole;
  loom::demo::DemoGraph demo;
  demo.title =
      absl::StrFormat("Chain of %d linear layers: tokens %d, width %d", layers, tokens, width);
  demo.matrices.push_back({LayerInput(0), tokens, width, MatrixRole::kActivation});
  for (int64_t layer = 0; layer < layers; ++layer) {
    demo.matrices.push_back({absl::StrCat("w", layer), width, width, MatrixRole::kWeight});
    demo.matrices.push_back({LayerInput(layer + 1), tokens, width, MatrixRole::kProduced});
  }
  demo.results = {LayerInput(layers)};
  demo.build = [layers](const loom::demo::ViewOf& view) {
    loom::GemmGraph graph;
    for (int64_t layer = 0; layer < layers; ++layer) {
      graph.AddGemm(absl::StrCat("layer", layer), view(LayerInput(layer)),
                    view(absl::StrCat("w", layer)), view(LayerInput(layer + 1)));
    }
    return graph;
  };
  return demo;
}

absl::Status Run() {
  const loom::demo::Target target = loom::demo::ChooseTarget();
  const int64_t tokens = loom::demo::ResolveSize(absl::GetFlag(FLAGS_tokens), 1, 1, target);
  const int64_t width = loom::demo::ResolveSize(absl::GetFlag(FLAGS_width), 4096, 1024, target);
  const int64_t layers = absl::GetFlag(FLAGS_layers);
  LOOM_RETURN_IF_ERROR(loom::demo::CheckPositive("tokens", tokens));
  LOOM_RETURN_IF_ERROR(loom::demo::CheckPositive("width", width));
  LOOM_RETURN_IF_ERROR(
      loom::demo::CheckPositive("layers", layers, loom::sched::kMaxNodes, "a graph's most nodes"));
  return loom::demo::RunDemo(target, LinearChain(tokens, width, layers));
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Runs a chain of linear layers (8 x 4096x4096 by default) as one loom graph.\n"
      "Without a GPU, runs the CPU reference executor at a reduced size.");
  loom::demo::ListDemoFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  return loom::demo::Finish(Run());
}
