// demos/batched_gemm.cc: a batch of independent GEMMs of different shapes in
// ONE loom graph: the q/k/v/o projections of an attention layer with grouped
// KV heads.
//
//   q   = x    · W_qᵀ     W_q [hidden, hidden]
//   k   = x    · W_kᵀ     W_k [kv_dim, hidden]
//   v   = x    · W_vᵀ     W_v [kv_dim, hidden]
//   out = attn · W_oᵀ     W_o [hidden, hidden]  (attn: another layer's input)
//
// No node reads what another writes, so the scheduler is free to interleave
// all four nodes' tile jobs and fill one GEMM's tail with another's work.
//
//   batched_gemm                      # 64 tokens, hidden 4096, kv_dim 1024, on the GPU
//   batched_gemm --cpu --explain      # CPU reference, reduced size, schedule printed
#include <cstdint>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "demo_common.h"
#include "loom/status.h"

ABSL_FLAG(std::optional<int64_t>, tokens, std::nullopt,
          "Rows of x and attn (default 64 on the GPU, 8 on the CPU reference).");
ABSL_FLAG(std::optional<int64_t>, hidden, std::nullopt,
          "Model width (default 4096 on the GPU, 1024 on the CPU reference).");
ABSL_FLAG(std::optional<int64_t>, kv_dim, std::nullopt,
          "Width of k and v (default 1024 on the GPU, 256 on the CPU reference).");

namespace {

loom::demo::DemoGraph QkvoProjections(int64_t tokens, int64_t hidden, int64_t kv_dim) {
  using loom::demo::MatrixRole;
  loom::demo::DemoGraph demo;
  demo.title = absl::StrFormat("Batched q/k/v/o projections: tokens %d, hidden %d, kv_dim %d",
                               tokens, hidden, kv_dim);
  demo.matrices = {
      {"x", tokens, hidden, MatrixRole::kActivation},
      {"attn", tokens, hidden, MatrixRole::kActivation},
      {"w_q", hidden, hidden, MatrixRole::kWeight},
      {"w_k", kv_dim, hidden, MatrixRole::kWeight},
      {"w_v", kv_dim, hidden, MatrixRole::kWeight},
      {"w_o", hidden, hidden, MatrixRole::kWeight},
      {"q", tokens, hidden, MatrixRole::kProduced},
      {"k", tokens, kv_dim, MatrixRole::kProduced},
      {"v", tokens, kv_dim, MatrixRole::kProduced},
      {"out", tokens, hidden, MatrixRole::kProduced},
  };
  demo.results = {"q", "k", "v", "out"};
  demo.build = [](const loom::demo::ViewOf& view) {
    loom::GemmGraph graph;
    graph.AddGemm("q_proj", view("x"), view("w_q"), view("q"));
    graph.AddGemm("k_proj", view("x"), view("w_k"), view("k"));
    graph.AddGemm("v_proj", view("x"), view("w_v"), view("v"));
    graph.AddGemm("o_proj", view("attn"), view("w_o"), view("out"));
    return graph;
  };
  return demo;
}

absl::Status Run() {
  const loom::demo::Target target = loom::demo::ChooseTarget();
  const int64_t tokens = loom::demo::ResolveSize(absl::GetFlag(FLAGS_tokens), 64, 8, target);
  const int64_t hidden = loom::demo::ResolveSize(absl::GetFlag(FLAGS_hidden), 4096, 1024, target);
  const int64_t kv_dim = loom::demo::ResolveSize(absl::GetFlag(FLAGS_kv_dim), 1024, 256, target);
  LOOM_RETURN_IF_ERROR(loom::demo::CheckPositive("tokens", tokens));
  LOOM_RETURN_IF_ERROR(loom::demo::CheckPositive("hidden", hidden));
  LOOM_RETURN_IF_ERROR(loom::demo::CheckPositive("kv_dim", kv_dim));
  return loom::demo::RunDemo(target, QkvoProjections(tokens, hidden, kv_dim));
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Runs four independent projections (q, k, v, o) of different shapes as one loom graph.\n"
      "Without a GPU, runs the CPU reference executor at a reduced size.");
  loom::demo::ListDemoFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  return loom::demo::Finish(Run());
}
