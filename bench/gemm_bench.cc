// gemm_bench: loom and cuBLAS (cublasLt, BF16 in, FP32 accumulate, BF16 out,
// the same TN layout; FP16 in and out with --dtype=fp16) side by side, in one
// process, on the same random data.
//
// The cuBLAS side is LtMatmul from cublas_baseline.h, the one graph_bench
// uses: C[m, n] = A[m, k] · B[n, k]ᵀ with beta 0, its algorithm chosen by
// cublasLt's heuristic for kCublasWorkspaceBytes (64 MiB).
//
// Per shape: inputs rotated across enough buffer sets to exceed twice the L2,
// warm-up, the median of --iters timed runs of each (CUDA events around each
// launch, or around runs of --run_length launches back to back; the
// implementations take turns, see TimeMedianMs), loom's output
// checked against an FP64 CPU dot product on sampled elements. Prints TF/s,
// the ratio and geometric means; writes JSON with --json.
//
//   loom_bench                          # the default shape list
//   loom_bench --shapes=8192x8192x8192 --ring=both --iters=50
//   loom_bench --dtype=fp16 --shapes=4096x4096x4096
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cublas_baseline.h"
#include "device_fill.h"
#include "loom/ops/host_numeric.h"
#include "loom/runtime.h"
#include "loom_option_flags.h"
#include "loom/status.h"

ABSL_FLAG(std::string, shapes,
          "4096x4096x4096,6144x6144x6144,8192x8192x8192,16384x16384x16384,2048x28672x4096,"
          "4096x4096x14336,8192x57344x8192,128x14336x4096,256x14336x4096,1024x14336x4096",
          "comma-separated MxNxK list");
ABSL_FLAG(int, iters, 30, "timed runs per implementation and shape (median reported)");
ABSL_FLAG(int, warmup, 5, "untimed runs first");
ABSL_FLAG(std::string, ring, "split", "loom ring mode: split, lockstep or both");
ABSL_FLAG(std::string, json, "", "write results as JSON to this file");
ABSL_FLAG(bool, interleave, true,
          "time the implementations in turn per iteration (false: each one's runs back to back, in ABBA order)");
ABSL_FLAG(int, run_length, 1,
          "launches timed back to back between two events, each reported as the run's time / run_length "
          "(1: an event on either side of every launch, so the host's enqueue time, cublasLt's longer than "
          "loom's, is inside small shapes' figures; bench/NOTES.md v1.63)");
ABSL_FLAG(std::string, dtype, "bf16", "inputs and output of both sides: bf16 or fp16");
ABSL_FLAG(bool, timeline, false,
          "also launch a traced plan per shape and print where its time went (Plan::ExplainTimeline)");

namespace loom::bench {
namespace {

struct Shape {
  int64_t m, n, k;
};

struct Result {
  Shape shape;
  std::string impl;
  double median_ms = 0;
  double tflops = 0;
  double ratio = 0;  // loom / cuBLAS throughput
  double max_error_ratio = 0;
  bool correct = false;
};

// Owns a cublasLt handle (an LtMatmul only borrows one).
struct LtHandleDestroy {
  void operator()(cublasLtHandle_t handle) const { cublasLtDestroy(handle); }
};
using LtHandle = std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, LtHandleDestroy>;

struct BufferSet {
  void* a = nullptr;
  void* b = nullptr;
  void* c_loom = nullptr;
  void* c_cublas = nullptr;
};

// The order of the timed launches: (implementation, iteration) pairs.
// Interleaved (the default): iteration i runs every implementation once, in
// turn, so drift in clocks and temperature (the H200 runs these shapes at its
// power cap, 1.1-1.5 GHz) lands on all of them alike. Blocked: each
// implementation's runs back to back, in ABBA order (the first half of the
// iterations A then B, the second half B then A), so a steady drift cancels
// between the two; before v1.9 blocked was A then B only, which measured the
// second implementation on a hotter chip.
std::vector<std::pair<size_t, int>> LaunchOrder(size_t implementations, int iters, bool interleave) {
  std::vector<std::pair<size_t, int>> order;
  if (interleave) {
    for (int i = 0; i < iters; ++i) {
      for (size_t r = 0; r < implementations; ++r) order.emplace_back(r, i);
    }
    return order;
  }
  const int half = iters / 2;
  for (size_t r = 0; r < implementations; ++r) {
    for (int i = 0; i < half; ++i) order.emplace_back(r, i);
  }
  for (size_t r = implementations; r-- > 0;) {
    for (int i = half; i < iters; ++i) order.emplace_back(r, i);
  }
  return order;
}

// Times each runner (which enqueues one launch of input set i) `iters` times
// with events, in LaunchOrder, each time a run of `run_length` launches back
// to back on consecutive input sets. Returns each runner's median time a
// launch.
template <typename Run>
absl::StatusOr<std::vector<double>> TimeMedianMs(std::vector<Run>& runs, int warmup, int iters, int sets,
                                                 bool interleave, int run_length) {
  for (int i = 0; i < warmup; ++i) {
    for (Run& run : runs) LOOM_RETURN_IF_ERROR(run(i % sets));
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<std::vector<double>> times(runs.size());
  for (const auto& [r, i] : LaunchOrder(runs.size(), iters, interleave)) {
    BENCH_CUDA(cudaEventRecord(start));
    for (int j = 0; j < run_length; ++j) LOOM_RETURN_IF_ERROR(runs[r]((i * run_length + j) % sets));
    BENCH_CUDA(cudaEventRecord(stop));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times[r].push_back(ms / run_length);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::vector<double> medians;
  for (std::vector<double>& t : times) medians.push_back(Median(std::move(t)));
  return medians;
}

// The element type of both sides' A, B and C (--dtype, checked by ValidateFlags).
DType ElementType() { return absl::GetFlag(FLAGS_dtype) == "fp16" ? DType::kFP16 : DType::kBF16; }

// Checks `samples` random elements of loom's C against an FP64 dot product of
// the 16-bit inputs (TESTING.md tolerance, with bf16's output rounding: an
// upper bound for fp16's), and records the worst error/bound.
absl::Status CheckSamples(const Shape& s, const BufferSet& set, int samples, Result& result) {
  std::mt19937_64 rng(s.m * 31 + s.n * 17 + s.k);
  std::vector<uint16_t> a_row(s.k), b_row(s.k);
  uint16_t c_loom = 0;
  // Host views of the copied row of A, row of B and element of C, read
  // through ops::LoadElement in the run's element type.
  const DType type = ElementType();
  const TensorView a_view = TensorView::Dense("a_row", a_row.data(), type, 1, s.k);
  const TensorView b_view = TensorView::Dense("b_row", b_row.data(), type, 1, s.k);
  const TensorView c_view = TensorView::Dense("c", &c_loom, type, 1, 1);
  double worst = 0;
  for (int i = 0; i < samples; ++i) {
    const int64_t r = static_cast<int64_t>(rng() % s.m), c = static_cast<int64_t>(rng() % s.n);
    BENCH_CUDA(cudaMemcpy(a_row.data(), static_cast<uint16_t*>(set.a) + r * s.k, s.k * 2, cudaMemcpyDeviceToHost));
    BENCH_CUDA(cudaMemcpy(b_row.data(), static_cast<uint16_t*>(set.b) + c * s.k, s.k * 2, cudaMemcpyDeviceToHost));
    BENCH_CUDA(cudaMemcpy(&c_loom, static_cast<uint16_t*>(set.c_loom) + r * s.n + c, 2, cudaMemcpyDeviceToHost));
    double ref = 0, magnitude = 0;
    for (int64_t k = 0; k < s.k; ++k) {
      const double x = ops::LoadElement(a_view, 0, k), y = ops::LoadElement(b_view, 0, k);
      ref += x * y;
      magnitude += std::fabs(x * y);
    }
    const double bound = 2 * 0x1p-8 * std::fabs(ref) + 4 * std::sqrt(static_cast<double>(s.k)) * 0x1p-24 * magnitude;
    const double out = ops::LoadElement(c_view, 0, 0);
    if (!std::isfinite(out)) {
      worst = INFINITY;
      break;
    }
    worst = std::max(worst, std::fabs(out - ref) / bound);
  }
  result.max_error_ratio = worst;
  result.correct = worst <= 1.0;
  return absl::OkStatus();
}

CompileOptions LoomOptions(RingMode mode, bool trace) {
  CompileOptions options = LoomOptionsFromFlags();
  options.ring_mode = mode;
  if (mode == RingMode::kLockstep) options.b_stages = options.a_stages;
  options.trace = trace;
  return options;
}

// One single-GEMM Plan per input set.
absl::StatusOr<std::vector<Plan>> CompilePlans(const Runtime& runtime, const Shape& s,
                                               const std::vector<BufferSet>& buffers, const CompileOptions& options) {
  std::vector<Plan> plans;
  for (const BufferSet& set : buffers) {
    GemmGraph graph;
    graph.AddGemm("gemm", TensorView::Dense("A", set.a, ElementType(), s.m, s.k),
                  TensorView::Dense("B", set.b, ElementType(), s.n, s.k),
                  TensorView::Dense("C", set.c_loom, ElementType(), s.m, s.n));
    LOOM_ASSIGN_OR_RETURN(Plan plan, runtime.Compile(graph, options));
    plans.push_back(std::move(plan));
  }
  return plans;
}

// Where a traced launch's time went, over all CTAs: the share of CTA-time in
// main loops and in epilogues, and when the CTAs ran out of work (the tail).
std::string SummariseOccupancy(const std::vector<JobTrace>& timeline) {
  std::map<std::pair<int, int>, double> last_store;  // (sm, rank) -> last store
  double end = 0, main_loop = 0, epilogue = 0;
  for (const JobTrace& t : timeline) {
    end = std::max(end, t.published);
    double& last = last_store[{t.sm, t.rank}];
    last = std::max(last, t.published);
    if (t.data_ready >= 0 && t.mma_done >= 0) main_loop += t.mma_done - t.data_ready;
    if (t.mma_done >= 0 && t.staged >= 0) epilogue += t.staged - t.mma_done;
  }
  std::vector<double> finish;
  for (const auto& [cta, last] : last_store) finish.push_back(last);
  std::sort(finish.begin(), finish.end());
  if (finish.empty() || end <= 0) return "occupancy: no traced jobs\n";
  const double cta_time = end * static_cast<double>(finish.size());
  return absl::StrFormat(
      "occupancy: %d CTAs, end %.1f us; CTA-time in main loops %.1f%%, in epilogues %.1f%%; CTAs out of work "
      "at %.1f (first) / %.1f (median) us\n",
      static_cast<int>(finish.size()), end, 100 * main_loop / cta_time, 100 * epilogue / cta_time, finish.front(),
      finish[finish.size() / 2]);
}

absl::StatusOr<std::vector<Result>> BenchShape(const Runtime& runtime, const Shape& s, const std::string& ring) {
  const int64_t set_bytes = 2 * (s.m * s.k + s.n * s.k + 2 * s.m * s.n);
  // Enough sets that each launch reads its operands from DRAM, at most 64
  // (a shape under 2 x L2 / 64, ~1.6 MB on the H200, runs from L2 on both
  // sides: hundreds of thousands of tiny sets would take hours to prepare).
  const int sets =
      static_cast<int>(std::clamp<int64_t>((2 * runtime.device().l2_bytes + set_bytes - 1) / set_bytes, 1, 64));
  std::vector<BufferSet> buffers(sets);
  for (int i = 0; i < sets; ++i) {
    BENCH_CUDA(cudaMalloc(&buffers[i].a, s.m * s.k * 2));
    BENCH_CUDA(cudaMalloc(&buffers[i].b, s.n * s.k * 2));
    BENCH_CUDA(cudaMalloc(&buffers[i].c_loom, s.m * s.n * 2));
    BENCH_CUDA(cudaMalloc(&buffers[i].c_cublas, s.m * s.n * 2));
    const auto fill = ElementType() == DType::kFP16 ? FillUniformFp16 : FillUniformBf16;
    BENCH_CUDA(fill(buffers[i].a, s.m * s.k, 2 * i + 1, nullptr, 1.0f));
    BENCH_CUDA(fill(buffers[i].b, s.n * s.k, 2 * i + 2, nullptr, 1.0f));
    BENCH_CUDA(cudaMemset(buffers[i].c_loom, 0xFF, s.m * s.n * 2));  // poison
  }
  void* workspace = nullptr;
  BENCH_CUDA(cudaMalloc(&workspace, kCublasWorkspaceBytes));

  const double flops = 2.0 * s.m * s.n * s.k;
  cublasLtHandle_t lt = nullptr;
  BENCH_CUBLAS(cublasLtCreate(&lt));
  const LtHandle lt_owner(lt);
  // cuBLAS: C[m, n] = A[m, k] · B[n, k]ᵀ, beta 0, on the default stream.
  LtMatmul cublas;
  LOOM_RETURN_IF_ERROR(cublas.Init(lt, s.m, s.n, s.k, ElementType() == DType::kFP16 ? CUDA_R_16F : CUDA_R_16BF));

  std::vector<RingMode> modes;
  if (ring == "split" || ring == "both") modes.push_back(RingMode::kSplit);
  if (ring == "lockstep" || ring == "both") modes.push_back(RingMode::kLockstep);
  // plans[mode][set]: one Plan per input set (a Plan binds its tensors).
  std::vector<std::vector<Plan>> plans(modes.size());
  for (size_t m = 0; m < modes.size(); ++m) {
    LOOM_ASSIGN_OR_RETURN(plans[m], CompilePlans(runtime, s, buffers, LoomOptions(modes[m], /*trace=*/false)));
  }
  std::vector<std::function<absl::Status(int)>> runs;
  runs.push_back([&](int i) {
    return cublas.Enqueue(buffers[i].a, buffers[i].b, buffers[i].c_cublas, /*beta=*/0.0f, workspace, nullptr);
  });
  for (std::vector<Plan>& mode_plans : plans) {
    runs.push_back([&mode_plans](int i) { return mode_plans[i].Launch(nullptr); });
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<double> medians,
                        TimeMedianMs(runs, absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_iters), sets,
                                     absl::GetFlag(FLAGS_interleave), absl::GetFlag(FLAGS_run_length)));
  std::vector<Result> results;
  const double cublas_ms = medians[0];
  results.push_back(Result{s, "cublas", cublas_ms, flops / cublas_ms / 1e9, 1.0, 0, true});
  for (size_t m = 0; m < modes.size(); ++m) {
    for (Plan& plan : plans[m]) LOOM_RETURN_IF_ERROR(plan.Synchronize(nullptr));
    const double loom_ms = medians[m + 1];
    Result result{s, modes[m] == RingMode::kSplit ? "loom-split" : "loom-lockstep", loom_ms, flops / loom_ms / 1e9,
                  cublas_ms / loom_ms, 0, false};
    LOOM_RETURN_IF_ERROR(CheckSamples(s, buffers[0], 256, result));
    results.push_back(result);
  }
  if (absl::GetFlag(FLAGS_timeline)) {
    LOOM_ASSIGN_OR_RETURN(std::vector<Plan> traced,
                          CompilePlans(runtime, s, {buffers[0]}, LoomOptions(modes.front(), /*trace=*/true)));
    for (int i = 0; i < 2; ++i) LOOM_RETURN_IF_ERROR(traced[0].Launch(nullptr));  // the second one is read
    LOOM_RETURN_IF_ERROR(traced[0].Synchronize(nullptr));
    LOOM_ASSIGN_OR_RETURN(std::string table, traced[0].ExplainTimeline());
    LOOM_ASSIGN_OR_RETURN(std::vector<JobTrace> timeline, traced[0].Timeline());
    std::printf("%s%s", table.c_str(), SummariseOccupancy(timeline).c_str());
  }
  for (BufferSet& set : buffers) {
    cudaFree(set.a);
    cudaFree(set.b);
    cudaFree(set.c_loom);
    cudaFree(set.c_cublas);
  }
  cudaFree(workspace);
  return results;
}

// The flags that no later step checks (ring depths are checked by Compile).
// Runs before the GPU is looked for, so a bad command line is refused anywhere.
absl::Status ValidateFlags() {
  if (absl::GetFlag(FLAGS_iters) < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--iters must be at least 1, got %d", absl::GetFlag(FLAGS_iters)));
  }
  if (absl::GetFlag(FLAGS_run_length) < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--run_length must be at least 1, got %d", absl::GetFlag(FLAGS_run_length)));
  }
  if (absl::GetFlag(FLAGS_warmup) < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--warmup must be at least 0, got %d", absl::GetFlag(FLAGS_warmup)));
  }
  const std::string ring = absl::GetFlag(FLAGS_ring);
  if (ring != "split" && ring != "lockstep" && ring != "both") {
    return absl::InvalidArgumentError(absl::StrFormat("--ring must be split, lockstep or both, got '%s'", ring));
  }
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype != "bf16" && dtype != "fp16") {
    return absl::InvalidArgumentError(absl::StrFormat("--dtype must be bf16 or fp16, got '%s'", dtype));
  }
  return absl::OkStatus();
}

// --shapes: MxNxK, comma-separated. Each dimension at least 1, and each
// matrix at most 2^36 elements (128 GiB of bf16), so that the byte counts
// below cannot overflow; what does not fit the device fails at cudaMalloc.
absl::StatusOr<std::vector<Shape>> ParseShapes(absl::string_view list) {
  constexpr int64_t kMaxElements = int64_t{1} << 36;
  std::vector<Shape> shapes;
  for (absl::string_view text : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> parts = absl::StrSplit(text, 'x');
    Shape s;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &s.m) || !absl::SimpleAtoi(parts[1], &s.n) ||
        !absl::SimpleAtoi(parts[2], &s.k)) {
      return absl::InvalidArgumentError(absl::StrFormat("--shapes: bad shape '%s' (want MxNxK)", text));
    }
    if (s.m < 1 || s.n < 1 || s.k < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--shapes: '%s' has a dimension below 1 (M, N and K must each be at least 1)", text));
    }
    for (const auto [a, b] : {std::pair{s.m, s.k}, std::pair{s.n, s.k}, std::pair{s.m, s.n}}) {
      if (a > kMaxElements / b) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--shapes: '%s' has a matrix of %d x %d elements, past the benchmark's 2^36", text, a, b));
      }
    }
    shapes.push_back(s);
  }
  return shapes;
}

int Main() {
  if (const absl::Status flags = ValidateFlags(); !flags.ok()) {
    std::fprintf(stderr, "loom_bench: %s\n", flags.ToString().c_str());
    return 2;
  }
  const absl::StatusOr<std::vector<Shape>> parsed = ParseShapes(absl::GetFlag(FLAGS_shapes));
  if (!parsed.ok()) {
    std::fprintf(stderr, "loom_bench: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  const std::vector<Shape>& shapes = *parsed;
  absl::StatusOr<Runtime> runtime = Runtime::Create(0);
  if (!runtime.ok()) {
    std::fprintf(stderr, "loom_bench needs a Hopper GPU: %s\n", runtime.status().ToString().c_str());
    return 1;
  }
  std::vector<Result> all;
  for (const Shape& s : shapes) {
    absl::StatusOr<std::vector<Result>> results = BenchShape(*runtime, s, absl::GetFlag(FLAGS_ring));
    if (!results.ok()) {
      std::fprintf(stderr, "%ldx%ldx%ld: %s\n", s.m, s.n, s.k, results.status().ToString().c_str());
      return 1;
    }
    for (const Result& r : *results) {
      std::printf("%6ld x %6ld x %6ld  %-14s %9.3f ms %8.1f TF/s  ratio %.3f  %s\n", r.shape.m, r.shape.n, r.shape.k,
                  r.impl.c_str(), r.median_ms, r.tflops, r.ratio,
                  r.impl == "cublas" ? "" : (r.correct ? absl::StrFormat("ok (err/bound %.2f)", r.max_error_ratio).c_str()
                                                       : "WRONG"));
      std::fflush(stdout);
    }
    all.insert(all.end(), results->begin(), results->end());
  }
  // Geometric means of loom/cuBLAS per loom variant: square shapes and all.
  std::printf("\nsummary (%s; ratio = loom TF/s / cuBLAS TF/s, same process, same data):\n",
              absl::GetFlag(FLAGS_dtype).c_str());
  for (const std::string impl : {"loom-split", "loom-lockstep"}) {
    double log_square = 0, log_all = 0;
    int n_square = 0, n_all = 0;
    bool all_correct = true;
    for (const Result& r : all) {
      if (r.impl != impl) continue;
      all_correct &= r.correct;
      log_all += std::log(r.ratio);
      ++n_all;
      if (r.shape.m == r.shape.n && r.shape.n == r.shape.k) {
        log_square += std::log(r.ratio);
        ++n_square;
      }
    }
    if (n_all == 0) continue;
    std::printf("  %-14s geomean square %.3f (%d shapes), all %.3f (%d shapes), correctness %s\n", impl.c_str(),
                n_square ? std::exp(log_square / n_square) : 0.0, n_square, std::exp(log_all / n_all), n_all,
                all_correct ? "all ok" : "FAILURES");
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    FILE* f = std::fopen(absl::GetFlag(FLAGS_json).c_str(), "w");
    if (f != nullptr) {
      std::fprintf(f, "[\n");
      for (size_t i = 0; i < all.size(); ++i) {
        const Result& r = all[i];
        std::fprintf(f,
                     "  {\"m\": %ld, \"n\": %ld, \"k\": %ld, \"impl\": \"%s\", \"median_ms\": %.5f, \"tflops\": %.2f, "
                     "\"ratio\": %.4f, \"correct\": %s, \"err_over_bound\": %.3f}%s\n",
                     r.shape.m, r.shape.n, r.shape.k, r.impl.c_str(), r.median_ms, r.tflops, r.ratio,
                     r.correct ? "true" : "false", r.max_error_ratio, i + 1 < all.size() ? "," : "");
      }
      std::fprintf(f, "]\n");
      std::fclose(f);
    }
  }
  return 0;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Single GEMMs: loom against cublasLt, same process, same data. See the top of bench/gemm_bench.cc.");
  loom::bench::ListBenchFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  return loom::bench::Main();
}
