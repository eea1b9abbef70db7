// graph_bench: loom's multi-GEMM graphs against the baseline a PyTorch user
// gets (cuBLAS GEMMs and an elementwise kernel, captured in one CUDA graph), in
// one process, on the same device-random data.
//
//   copy   cudaMemcpyAsync device to device of 1 GiB, the bandwidth reference:
//          (read + write bytes) / time.
//   mlp    a Llama-style SwiGLU MLP block per token count T:
//            x [T, hidden], bf16 (or fp16: --dtype, as every matrix below)
//            W_gu [2*intermediate, hidden], rows interleave gate and up
//              (row 2j = gate_j, row 2j+1 = up_j)
//            W_down [hidden, intermediate]
//            y = swiglu(x · W_guᵀ) · W_downᵀ + x
//          baseline: cublasLt GEMM -> g [T, 2*intermediate]; SwiGLU kernel
//            -> h [T, intermediate]; copy x into y; cublasLt GEMM with beta = 1
//            (the residual). The four steps are one CUDA graph.
//          loom: a two-node GemmGraph (gate_up with SwiGLU, down with residual
//            x), launched as one persistent kernel.
//   chain  --chain_layers linear layers [width x width] at each --chain_tokens
//          T: cublasLt GEMMs in one CUDA graph against one loom graph. With
//          --chain_parts=P each loom layer is P nodes over column slices of
//          its output, so each later layer's A has P producers (fan-in).
//
// Timing: the baseline and loom take turns, --rounds of them (the default 2:
// baseline, loom, loom, baseline), each turn after --cooldown_ms of idle GPU,
// so that both start from the same state of the H200's power budget (a long
// case runs into the power cap within ~0.1 s). A turn is --warmup launches
// (and more until --warmup_ms have passed: timing the clock a sustained load
// settles at instead), then --iters launches enqueued back to back on one
// stream with an event between consecutive launches (the steady state of a
// decode loop: the host's launch latency hides behind the previous launch);
// the median per launch over all rounds is reported, each round's median
// beside it. With --run_length=N an event comes only after every N launches
// and the median of the runs' means is reported: the period of a pipeline of
// launches, where consecutive loom launches overlap
// (CompileOptions::overlap_launches) and CUDA-graph launches queue up. That
// favours loom: each launch hides its start, and with --pack_weights streams
// its first weights, under the loom launch before it, which in a model would
// be another kernel (attention, a norm). --overlap_launches=false, or
// --run_length=1, times loom without that (bench/NOTES.md v1.27, v1.77).
// speedup = baseline time / loom time (> 1: loom is faster); weight bandwidth
// = weight bytes / time, next to the measured copy bandwidth.
//
// Correctness, in the same run, of one more loom launch after the timed ones
// onto poisoned (NaN) outputs: every element of loom's outputs (the MLP's h
// and y, every layer of the chain) against the baseline's, flagged WRONG past
// 0.05 |baseline| + 0.05 or when not finite; and sampled elements of each
// side against an FP64 CPU computation from its own inputs (TESTING.md's
// bound), so that a mismatch can be blamed on the right side.
//
// No buffer rotation: each launch streams every weight once and the weights
// exceed the L2 several times over (MLP 2 x 14336 x 4096 + 4096 x 14336 16-bit =
// 352 MB, chain 8 x 4096 x 4096 16-bit = 256 MB, against 60 MB of L2), so the
// weights the next launch reads first were evicted by the ones read after
// them: every launch starts cold. The activations that do fit (decode-sized x,
// g, h) are re-read from L2 by both implementations alike, as in a real
// decode loop. Smaller --hidden / --chain_width that would fit are flagged.
//
// Bounded: a watchdog ends the process (exit code 3, naming the step) past
// --max_seconds; loom's first launch of each case is synchronised and checked
// before the timed ones. Exit code 0 only when every case ran and was correct.
//
//   loom_graph_bench                                      # everything, defaults
//   loom_graph_bench --tokens=1,64 --iters=100 --json=/tmp/graph.json
//   loom_graph_bench --tokens= --chain_tokens=1           # the chain only
//   loom_graph_bench --dtype=fp16 --tokens=1,8192         # both sides in fp16
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "baseline_kernels.h"
#include "cublas_baseline.h"
#include "device_fill.h"
#include "loom/graph.h"
#include "loom/ops/host_numeric.h"
#include "loom/runtime.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "loom_option_flags.h"

ABSL_FLAG(std::string, tokens, "1,16,64,128,8192", "comma-separated token counts for the MLP block (empty: none)");
ABSL_FLAG(int64_t, hidden, 4096, "MLP model width");
ABSL_FLAG(int64_t, intermediate, 14336, "MLP intermediate width");
ABSL_FLAG(int, iters, 50, "timed launches per implementation, case and round (the median of all is reported)");
ABSL_FLAG(int, rounds, 2,
          "rounds per case: the baseline and loom take turns, each round timing --iters launches of both, the "
          "first to run alternating (baseline first in odd rounds)");
ABSL_FLAG(int, warmup, 5, "untimed launches first in every turn (at least 1)");
ABSL_FLAG(double, warmup_ms, 0,
          "untimed launches in every turn go on for at least this long: with ~300 or more every turn is timed at "
          "the clock a sustained load settles at under the power cap (0: --warmup launches only)");
ABSL_FLAG(double, cooldown_ms, 500,
          "the GPU idles this long before every turn, so that each turn starts from the same idle state rather "
          "than from where the other implementation's turn left the power budget (0: no pause)");
ABSL_FLAG(int, run_length, 1,
          "launches between consecutive timing events: each time is a run's mean per launch, and the median of "
          "the runs is reported. 1: an event between every two launches; more: the period of launches back to "
          "back, as in a pipeline of layers (where loom's launches overlap each other: "
          "CompileOptions::overlap_launches)");
ABSL_FLAG(int, chain_layers, 8, "layers in the linear chain (0: no chain)");
ABSL_FLAG(int64_t, chain_width, 4096, "width of each chain layer [width x width]");
ABSL_FLAG(std::string, chain_tokens, "1,16", "comma-separated token counts for the chain (empty: none)");
ABSL_FLAG(bool, timeline, false,
          "after timing, run one traced launch per case and print its per-node timeline (Plan::ExplainTimeline)");
ABSL_FLAG(std::string, timeline_csv, "",
          "with --timeline: also append every traced job (Plan::Timeline) to this CSV file, one row per job and CTA");
ABSL_FLAG(int, down_parts, 1,
          "loom: the MLP block's down projection as this many nodes, each a slice of K, chained through fp32 "
          "partial outputs taken as the next part's residual (1: one node)");
ABSL_FLAG(int, chain_parts, 1,
          "loom: each chain layer as this many nodes over equal column slices of its output (the weights' rows), so "
          "that every layer after the first reads its A from that many producer nodes (1: one node a layer)");
ABSL_FLAG(std::string, dtype, "bf16",
          "the 16-bit type of every input, weight and output of both sides: bf16 or fp16 (FP32 accumulate either "
          "way)");
ABSL_FLAG(std::string, json, "", "write the results as JSON to this file");
ABSL_FLAG(double, max_seconds, 120, "hard wall-clock limit; the process exits with code 3 past it (0: none)");

namespace loom::bench {
namespace {

// --- Owned CUDA objects. ---

struct DeviceFree {
  void operator()(void* pointer) const { cudaFree(pointer); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

struct GraphExecDestroy {
  void operator()(cudaGraphExec_t exec) const { cudaGraphExecDestroy(exec); }
};
using GraphExec = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDestroy>;

// Events created together and destroyed together.
class EventList {
 public:
  ~EventList() {
    for (cudaEvent_t event : events_) cudaEventDestroy(event);
  }
  absl::Status Create(int count) {
    for (int i = 0; i < count; ++i) {
      cudaEvent_t event = nullptr;
      BENCH_CUDA(cudaEventCreate(&event));
      events_.push_back(event);
    }
    return absl::OkStatus();
  }
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

constexpr size_t kHalfBytes = 2;  // bf16 and fp16 alike

absl::StatusOr<DeviceBuffer> AllocateBytes(size_t bytes, std::string_view name) {
  void* pointer = nullptr;
  bytes = std::max<size_t>(bytes, 16);
  const cudaError_t error = cudaMalloc(&pointer, bytes);
  if (error != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrFormat("cudaMalloc(%s, %d bytes): %s", name, bytes,
                                                        cudaGetErrorString(error)));
  }
  return DeviceBuffer(pointer);
}

absl::StatusOr<DeviceBuffer> AllocateHalf(int64_t elements, std::string_view name) {
  return AllocateBytes(static_cast<size_t>(elements) * kHalfBytes, name);
}

// --- The watchdog: the lead runs this once, unattended; it must end. ---

class Watchdog {
 public:
  explicit Watchdog(double seconds) : seconds_(seconds), thread_([this] { Watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void SetStep(std::string step) {
    std::lock_guard<std::mutex> lock(mutex_);
    step_ = std::move(step);
  }

 private:
  void Watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (seconds_ <= 0) {
      wake_.wait(lock, [this] { return done_; });
      return;
    }
    if (wake_.wait_for(lock, std::chrono::duration<double>(seconds_), [this] { return done_; })) return;
    std::fflush(stdout);
    std::fprintf(stderr, "\nloom_graph_bench: still running after --max_seconds=%.0f, during: %s. Exiting (a hang?).\n",
                 seconds_, step_.c_str());
    std::fflush(stderr);
    std::_Exit(3);
  }

  const double seconds_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::string step_ = "start-up";
  std::thread thread_;  // last: starts after the members it reads exist
};

// --- What every case shares. ---

struct BenchContext {
  DType dtype = DType::kBF16;  // --dtype: kBF16 or kFP16, every 16-bit matrix of both sides
  const Runtime* runtime = nullptr;
  cublasLtHandle_t lt = nullptr;
  cudaStream_t stream = nullptr;  // non-default: CUDA graphs are captured on it
  void* workspace = nullptr;
  Watchdog* watchdog = nullptr;
  int warmup = 5;
  double warmup_ms = 0;      // a turn's warm-up lasts at least this long
  double cooldown_ms = 500;  // idle time before each turn
  int iters = 50;
  int run_length = 1;  // launches between timing events
  int rounds = 2;      // turns of baseline and loom per case
  CompileOptions loom_options;
  bool timeline = false;
  std::string timeline_csv;  // with timeline: where the raw job traces go ("": nowhere)
};

// --- Timing. ---

// One implementation's time in one case: every round's runs pooled.
struct Timing {
  double median_us = 0;                  // over every timed run of every round
  int iters = 0;                         // launches timed, all rounds together
  std::vector<double> round_medians_us;  // one per round, in the order they ran

  void AddRound(std::vector<double> runs_us, int launches) {
    pooled_us_.insert(pooled_us_.end(), runs_us.begin(), runs_us.end());
    round_medians_us.push_back(Median(std::move(runs_us)));
    median_us = Median(pooled_us_);
    iters += launches;
  }

 private:
  std::vector<double> pooled_us_;
};

// The timed loop may spend about this long per implementation and case (all
// rounds together); a case slower than that runs fewer iterations a round (at
// least 3), and says so.
constexpr double kTimedBudgetMs = 4000;

// Enqueues `launch` (one launch on ctx.stream) for the warm-up (ctx.warmup
// launches, ctx.warmup_ms at least), then up to `iters` times back to back
// with an event after every ctx.run_length launches, and adds the runs (each
// its mean per launch) to `timing` as one round. `budget_ms` caps the timed
// launches' expected time.
absl::Status TimeRound(const BenchContext& ctx, const std::function<absl::Status()>& launch, int iters,
                       double budget_ms, Timing& timing) {
  // Warm-up: ctx.warmup launches, then batches of launches until ctx.warmup_ms
  // have passed, each batch sized from the launches timed so far.
  EventList events;
  LOOM_RETURN_IF_ERROR(events.Create(2));
  BENCH_CUDA(cudaEventRecord(events[0], ctx.stream));
  int warmed = 0;
  double per_launch_ms = 0;
  for (int batch = ctx.warmup;;) {
    for (int i = 0; i < batch; ++i) LOOM_RETURN_IF_ERROR(launch());
    warmed += batch;
    BENCH_CUDA(cudaEventRecord(events[1], ctx.stream));
    BENCH_CUDA(cudaEventSynchronize(events[1]));
    float warm_ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&warm_ms, events[0], events[1]));
    per_launch_ms = warm_ms / warmed;
    if (warm_ms >= ctx.warmup_ms || per_launch_ms <= 0) break;
    batch = std::clamp(static_cast<int>((ctx.warmup_ms - warm_ms) / per_launch_ms) + 1, 1, 100000);
  }
  int count = iters;
  if (per_launch_ms > 0 && per_launch_ms * iters > budget_ms) {
    count = std::max(std::min(iters, 3), static_cast<int>(budget_ms / per_launch_ms));
  }

  const int run_length = std::min(ctx.run_length, count);
  const int runs = count / run_length;
  EventList marks;
  LOOM_RETURN_IF_ERROR(marks.Create(runs + 1));
  BENCH_CUDA(cudaEventRecord(marks[0], ctx.stream));
  for (int r = 0; r < runs; ++r) {
    for (int i = 0; i < run_length; ++i) LOOM_RETURN_IF_ERROR(launch());
    BENCH_CUDA(cudaEventRecord(marks[r + 1], ctx.stream));
  }
  BENCH_CUDA(cudaEventSynchronize(marks[runs]));
  std::vector<double> times_us;
  for (int r = 0; r < runs; ++r) {
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, marks[r], marks[r + 1]));
    times_us.push_back(1000.0 * ms / run_length);
  }
  timing.AddRound(std::move(times_us), runs * run_length);
  return absl::OkStatus();
}

// Records whatever `enqueue` puts on `stream` into a CUDA graph and
// instantiates it. The capture is always ended, also when `enqueue` fails.
absl::StatusOr<GraphExec> CaptureGraph(cudaStream_t stream, const std::function<absl::Status(cudaStream_t)>& enqueue) {
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued = enqueue(stream);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!enqueued.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return enqueued;
  }
  BENCH_CUDA(ended);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  BENCH_CUDA(instantiated);
  return GraphExec(exec);
}

// Runs `enqueue` once eagerly (so cuBLAS loads its kernels outside the
// capture), captures it into one CUDA graph and launches the graph once, so
// that its outputs can be checked before the timed launches.
absl::StatusOr<GraphExec> PrepareBaselineGraph(const BenchContext& ctx,
                                               const std::function<absl::Status(cudaStream_t)>& enqueue) {
  LOOM_RETURN_IF_ERROR(enqueue(ctx.stream));
  BENCH_CUDA(cudaStreamSynchronize(ctx.stream));
  LOOM_ASSIGN_OR_RETURN(GraphExec graph, CaptureGraph(ctx.stream, enqueue));
  BENCH_CUDA(cudaGraphLaunch(graph.get(), ctx.stream));
  BENCH_CUDA(cudaStreamSynchronize(ctx.stream));
  return graph;
}

// --- Host-side reads and checks. ---

// One element of ctx.dtype, as a double.
double HalfToDouble(const BenchContext& ctx, uint16_t bits) {
  return ctx.dtype == DType::kFP16 ? ops::FP16ToFloat(bits) : ops::BF16ToFloat(bits);
}

// Fills `count` elements of ctx.dtype on ctx.stream, uniform in [-scale, scale).
cudaError_t FillUniform(const BenchContext& ctx, void* data, int64_t count, uint64_t seed, float scale = 1.0f) {
  return ctx.dtype == DType::kFP16 ? FillUniformFp16(data, count, seed, ctx.stream, scale)
                                   : FillUniformBf16(data, count, seed, ctx.stream, scale);
}

// cuBLAS's name for ctx.dtype.
cudaDataType_t CudaType(const BenchContext& ctx) { return ctx.dtype == DType::kFP16 ? CUDA_R_16F : CUDA_R_16BF; }

absl::StatusOr<std::vector<uint16_t>> CopyHalfToHost(const void* data, int64_t elements, cudaStream_t stream) {
  std::vector<uint16_t> host(static_cast<size_t>(elements));
  BENCH_CUDA(cudaMemcpyAsync(host.data(), data, host.size() * kHalfBytes, cudaMemcpyDeviceToHost, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  return host;
}

// Row `row` of a row-major [rows, cols] device matrix of ctx.dtype, as doubles.
absl::StatusOr<std::vector<double>> RowToHost(const BenchContext& ctx, const void* matrix, int64_t row,
                                              int64_t cols) {
  LOOM_ASSIGN_OR_RETURN(std::vector<uint16_t> bits,
                        CopyHalfToHost(static_cast<const uint16_t*>(matrix) + row * cols, cols, ctx.stream));
  std::vector<double> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = HalfToDouble(ctx, bits[i]);
  return values;
}

absl::StatusOr<double> ElementToHost(const BenchContext& ctx, const void* matrix, int64_t row, int64_t col,
                                     int64_t cols) {
  LOOM_ASSIGN_OR_RETURN(std::vector<uint16_t> bits,
                        CopyHalfToHost(static_cast<const uint16_t*>(matrix) + row * cols + col, 1, ctx.stream));
  return HalfToDouble(ctx, bits[0]);
}

struct Dot {
  double value = 0;
  double magnitude = 0;  // sum of |a_k b_k|
};

Dot DotProduct(const std::vector<double>& a, const std::vector<double>& b) {
  Dot dot;
  for (size_t i = 0; i < a.size(); ++i) {
    dot.value += a[i] * b[i];
    dot.magnitude += std::fabs(a[i] * b[i]);
  }
  return dot;
}

// Allowed error of a bf16-in, FP32-accumulate dot product stored as bf16
// (TESTING.md): 2^-8 |acc| (the output rounding, with a factor 2 to spare) +
// 4 sqrt(K) 2^-24 sum |a b| (the FP32 accumulation). With --dtype=fp16 the
// same bound holds with room: fp16 rounds 8 times finer.
double AccumulatorTolerance(const Dot& dot, int64_t k) {
  return std::ldexp(std::fabs(dot.value), -8) +
         4.0 * std::sqrt(static_cast<double>(k)) * std::ldexp(dot.magnitude, -24);
}

// How far loom's outputs are from the baseline's, over every element.
struct Agreement {
  int64_t elements = 0;
  int64_t bad = 0;          // |loom - baseline| > 0.05 |baseline| + 0.05, or not finite
  double max_relative = 0;  // max |loom - baseline| / (|baseline| + 1e-2)
  double max_absolute = 0;
  std::string first_bad;    // where the first bad element is, and its values
};

absl::Status CompareWithBaseline(const BenchContext& ctx, std::string_view name, const void* loom_data,
                                 const void* baseline_data, int64_t rows, int64_t cols, Agreement& agreement) {
  LOOM_ASSIGN_OR_RETURN(std::vector<uint16_t> loom_bits, CopyHalfToHost(loom_data, rows * cols, ctx.stream));
  LOOM_ASSIGN_OR_RETURN(std::vector<uint16_t> baseline_bits, CopyHalfToHost(baseline_data, rows * cols, ctx.stream));
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double loom_value = HalfToDouble(ctx, loom_bits[i]);
    const double baseline_value = HalfToDouble(ctx, baseline_bits[i]);
    const double difference = std::fabs(loom_value - baseline_value);
    const bool finite = std::isfinite(loom_value) && std::isfinite(baseline_value);
    if (finite) {
      agreement.max_absolute = std::max(agreement.max_absolute, difference);
      agreement.max_relative = std::max(agreement.max_relative, difference / (std::fabs(baseline_value) + 1e-2));
    } else {
      agreement.max_absolute = agreement.max_relative = INFINITY;
    }
    if (!finite || difference > 0.05 * std::fabs(baseline_value) + 0.05) {
      if (agreement.bad++ == 0) {
        agreement.first_bad = absl::StrFormat("%s[%d, %d]: loom %g, baseline %g", name, i / cols, i % cols,
                                              loom_value, baseline_value);
      }
    }
  }
  agreement.elements += rows * cols;
  return absl::OkStatus();
}

// Sampled (row, column) pairs, the same every run.
std::vector<std::pair<int64_t, int64_t>> SamplePositions(int64_t rows, int64_t cols, int count, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::vector<std::pair<int64_t, int64_t>> positions;
  for (int i = 0; i < count; ++i) {
    positions.emplace_back(static_cast<int64_t>(generator() % rows), static_cast<int64_t>(generator() % cols));
  }
  return positions;
}

constexpr int kFp64Samples = 24;

// --- Results. ---

struct CaseResult {
  std::string kind;  // "mlp" or "chain"
  int64_t tokens = 0;
  double weight_bytes = 0;
  double flops = 0;
  Timing baseline;
  Timing loom;
  Agreement agreement;
  double baseline_fp64_worst = 0;  // sampled |baseline - FP64| / allowed error; <= 1 is right
  double loom_fp64_worst = 0;      // the same for loom's outputs
  std::string error;               // the case stopped here

  bool correct() const {
    return error.empty() && agreement.elements > 0 && agreement.bad == 0 && baseline_fp64_worst <= 1.0 &&
           loom_fp64_worst <= 1.0;
  }
  double speedup() const { return loom.median_us > 0 ? baseline.median_us / loom.median_us : 0; }
  static double GBps(double bytes, const Timing& t) { return t.median_us > 0 ? bytes / t.median_us / 1e3 : 0; }
  static double TFps(double flops, const Timing& t) { return t.median_us > 0 ? flops / t.median_us / 1e6 : 0; }
  std::string Verdict() const {
    if (!error.empty()) return "ERROR";
    if (agreement.elements == 0) return "unchecked";
    if (agreement.bad > 0) return "WRONG";
    if (loom_fp64_worst > 1.0) return "WRONG (FP64)";
    if (baseline_fp64_worst > 1.0) return "BASELINE-WRONG";
    return "ok";
  }
};

void PrintCase(const CaseResult& r, double copy_gbps) {
  auto bandwidth = [&](const Timing& t) {
    const double gbps = CaseResult::GBps(r.weight_bytes, t);
    return copy_gbps > 0 ? absl::StrFormat("%5.0f GB/s of weights, %3.0f%% of copy %.0f GB/s", gbps,
                                           100.0 * gbps / copy_gbps, copy_gbps)
                         : absl::StrFormat("%5.0f GB/s of weights", gbps);
  };
  auto iters_note = [](const Timing& t) {
    std::string note;
    if (t.round_medians_us.size() > 1) {
      note = "  rounds " + absl::StrJoin(t.round_medians_us, " / ",
                                         [](std::string* out, double us) { absl::StrAppendFormat(out, "%.1f", us); });
    }
    const int planned = absl::GetFlag(FLAGS_iters) * static_cast<int>(t.round_medians_us.size());
    if (t.iters > 0 && t.iters < planned) absl::StrAppendFormat(&note, "  (%d launches: time budget)", t.iters);
    return note;
  };
  std::printf("%-5s T=%-5ld baseline %9.1f us  %s  %6.1f TF/s%s\n", r.kind.c_str(), r.tokens, r.baseline.median_us,
              bandwidth(r.baseline).c_str(), CaseResult::TFps(r.flops, r.baseline), iters_note(r.baseline).c_str());
  std::printf("%-13s loom     %9.1f us  %s  %6.1f TF/s%s  speedup %.3f\n", "", r.loom.median_us,
              bandwidth(r.loom).c_str(), CaseResult::TFps(r.flops, r.loom), iters_note(r.loom).c_str(), r.speedup());
  std::printf("%-13s loom vs baseline: max rel diff %.2e, max abs diff %.2e over %ld elements; "
              "vs FP64 (sampled): err/bound baseline %.2f, loom %.2f  -> %s\n",
              "", r.agreement.max_relative, r.agreement.max_absolute, r.agreement.elements, r.baseline_fp64_worst,
              r.loom_fp64_worst, r.Verdict().c_str());
  if (r.agreement.bad > 0) {
    std::printf("%-13s %ld of %ld elements differ; first: %s\n", "", r.agreement.bad, r.agreement.elements,
                r.agreement.first_bad.c_str());
  }
  if (!r.error.empty()) std::printf("%-13s error: %s\n", "", r.error.c_str());
  std::fflush(stdout);
}

void WarnIfWeightsFitInL2(const BenchContext& ctx, std::string_view what, double weight_bytes) {
  const double l2 = static_cast<double>(ctx.runtime->device().l2_bytes);
  if (weight_bytes < 2 * l2) {
    std::printf("note: %.*s weights (%.0f MB) are under twice the L2 (%.0f MB): launches may read them from L2, "
                "flattering both timings\n",
                static_cast<int>(what.size()), what.data(), weight_bytes / 1e6, l2 / 1e6);
  }
}

// Times the baseline and loom in ctx.rounds rounds of one turn each, the
// first to run alternating (baseline first in the first round), each turn
// after ctx.cooldown_ms of idle GPU. A long case (the 8192-token block) runs
// the H200 into its power cap within ~0.1 s, and its clock then stays down:
// timing one side wholly before the other credited the first with the idle
// GPU's clock (~10% at 8192 tokens, bench/NOTES.md v1.49).
absl::Status TimeBothInTurns(const BenchContext& ctx, const std::string& step,
                             const std::function<absl::Status()>& baseline_launch,
                             const std::function<absl::Status()>& loom_launch, CaseResult& result) {
  const double budget_ms = kTimedBudgetMs / ctx.rounds;
  for (int round = 0; round < ctx.rounds; ++round) {
    const bool baseline_first = round % 2 == 0;
    for (int turn = 0; turn < 2; ++turn) {
      const bool baseline = (turn == 0) == baseline_first;
      ctx.watchdog->SetStep(absl::StrFormat("%s: %s timed launches, round %d", step,
                                            baseline ? "baseline" : "loom", round + 1));
      BENCH_CUDA(cudaStreamSynchronize(ctx.stream));
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ctx.cooldown_ms));
      LOOM_RETURN_IF_ERROR(TimeRound(ctx, baseline ? baseline_launch : loom_launch, ctx.iters, budget_ms,
                                     baseline ? result.baseline : result.loom));
    }
  }
  return absl::OkStatus();
}

// --- Copy bandwidth. ---

absl::StatusOr<double> MeasureCopyGBps(BenchContext& ctx) {
  ctx.watchdog->SetStep("copy bandwidth");
  constexpr int64_t kCopyBytes = int64_t{1} << 30;
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer source, AllocateHalf(kCopyBytes / kHalfBytes, "copy source"));
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer destination, AllocateHalf(kCopyBytes / kHalfBytes, "copy destination"));
  BENCH_CUDA(FillUniformBf16(source.get(), kCopyBytes / kHalfBytes, 7, ctx.stream));
  BenchContext copy_ctx = ctx;
  copy_ctx.warmup = 2;
  copy_ctx.warmup_ms = 0;
  Timing timing;
  LOOM_RETURN_IF_ERROR(TimeRound(
      copy_ctx,
      [&]() -> absl::Status {
        BENCH_CUDA(cudaMemcpyAsync(destination.get(), source.get(), kCopyBytes, cudaMemcpyDeviceToDevice, ctx.stream));
        return absl::OkStatus();
      },
      10, kTimedBudgetMs, timing));
  return 2.0 * kCopyBytes / timing.median_us / 1e3;
}

// --- loom's side of a case. ---

// Appends one CSV row per traced job and CTA (times in us from the launch's
// first fetch; -1 where the event did not happen; part: JobTrace::part), with
// a header if the file is new, for looking at a launch's critical path off
// the device.
absl::Status AppendTimelineCsv(const std::string& path, const std::string& step, const std::vector<JobTrace>& jobs) {
  FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) return absl::InvalidArgumentError(absl::StrCat("--timeline_csv: cannot open ", path));
  if (std::ftell(file) == 0) {
    std::fprintf(file,
                 "case,job,rank,node,sm,reduce,fetched,data_ready,mma_done,staged,published,a_dependency,part\n");
  }
  for (const JobTrace& t : jobs) {
    std::fprintf(file, "\"%s\",%d,%d,%d,%d,%d,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%d\n", step.c_str(), t.job, t.rank,
                 t.node, t.sm, t.reduce ? 1 : 0, t.fetched, t.data_ready, t.mma_done, t.staged, t.published,
                 t.a_dependency, t.part);
  }
  const bool ok = std::fclose(file) == 0;
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("--timeline_csv: cannot write ", path));
}

// Compiles `graph`, launches it once (checked), then times it in turns with
// the baseline's `baseline_graph` into result. With --timeline, one more
// launch of a traced plan prints where each node's time went (its outputs are
// the same bits).
// After timing, loom's outputs (`loom_outputs`: device buffers and their
// 16-bit element counts) are poisoned and written by one more launch, so that
// what the comparisons then read is that launch's, not whatever some earlier
// launch left there.
absl::Status TimeAgainstBaseline(BenchContext& ctx, const GemmGraph& graph, const GraphExec& baseline_graph,
                                 const std::string& step, std::span<const std::pair<void*, int64_t>> loom_outputs,
                                 CaseResult& result) {
  ctx.watchdog->SetStep(step + ": loom compile");
  LOOM_ASSIGN_OR_RETURN(Plan plan, ctx.runtime->Compile(graph, ctx.loom_options));
  ctx.watchdog->SetStep(step + ": loom first launch");
  LOOM_RETURN_IF_ERROR(plan.Launch(ctx.stream));
  LOOM_RETURN_IF_ERROR(plan.Synchronize(ctx.stream));
  LOOM_RETURN_IF_ERROR(TimeBothInTurns(
      ctx, step,
      [&]() -> absl::Status {
        BENCH_CUDA(cudaGraphLaunch(baseline_graph.get(), ctx.stream));
        return absl::OkStatus();
      },
      [&] { return plan.Launch(ctx.stream); }, result));
  LOOM_RETURN_IF_ERROR(plan.Synchronize(ctx.stream));
  ctx.watchdog->SetStep(step + ": loom checked launch");
  for (const auto& [output, elements] : loom_outputs) {
    BENCH_CUDA(cudaMemsetAsync(output, 0xFF, elements * kHalfBytes, ctx.stream));  // NaN in bf16 and fp16
  }
  LOOM_RETURN_IF_ERROR(plan.Launch(ctx.stream));
  LOOM_RETURN_IF_ERROR(plan.Synchronize(ctx.stream));
  if (!ctx.timeline) return absl::OkStatus();
  ctx.watchdog->SetStep(step + ": traced launch");
  CompileOptions traced = ctx.loom_options;
  traced.trace = true;
  LOOM_ASSIGN_OR_RETURN(Plan traced_plan, ctx.runtime->Compile(graph, traced));
  for (int launch = 0; launch < 2; ++launch) {  // the second one, warm, is reported
    LOOM_RETURN_IF_ERROR(traced_plan.Launch(ctx.stream));
    LOOM_RETURN_IF_ERROR(traced_plan.Synchronize(ctx.stream));
  }
  LOOM_ASSIGN_OR_RETURN(std::string timeline, traced_plan.ExplainTimeline());
  std::cout << step << ", traced launch (timed median " << absl::StrFormat("%.1f", result.loom.median_us)
            << " us):\n" << timeline << std::flush;
  if (ctx.timeline_csv.empty()) return absl::OkStatus();
  LOOM_ASSIGN_OR_RETURN(std::vector<JobTrace> jobs, traced_plan.Timeline());
  return AppendTimelineCsv(ctx.timeline_csv, step, jobs);
}

// --- The MLP block. ---

struct MlpShape {
  int64_t hidden = 0;
  int64_t intermediate = 0;
  double weight_bytes() const { return 3.0 * static_cast<double>(hidden) * intermediate * kHalfBytes; }
};

struct MlpWeights {
  DeviceBuffer gate_up;  // [2 * intermediate, hidden], rows interleave gate_j and up_j
  DeviceBuffer down;     // [hidden, intermediate]
};

absl::StatusOr<MlpWeights> MakeMlpWeights(const BenchContext& ctx, const MlpShape& shape) {
  MlpWeights weights;
  LOOM_ASSIGN_OR_RETURN(weights.gate_up, AllocateHalf(2 * shape.intermediate * shape.hidden, "W_gu"));
  LOOM_ASSIGN_OR_RETURN(weights.down, AllocateHalf(shape.hidden * shape.intermediate, "W_down"));
  BENCH_CUDA(FillUniform(ctx, weights.gate_up.get(), 2 * shape.intermediate * shape.hidden, 11,
                         std::sqrt(3.0f / static_cast<float>(shape.hidden))));
  BENCH_CUDA(FillUniform(ctx, weights.down.get(), shape.hidden * shape.intermediate, 12,
                         std::sqrt(3.0f / static_cast<float>(shape.intermediate))));
  BENCH_CUDA(cudaStreamSynchronize(ctx.stream));
  return weights;
}

// Sampled elements of one implementation's h and y against FP64 from its own
// inputs (x, the weights, and its own h for y). Returns the worst error /
// allowed error.
// h's bound carries the errors of gate and up (each stored as 16-bit) through
// silu(g) u (|silu'| <= 1.1), plus the rounding of h.
absl::StatusOr<double> CheckMlpAgainstFp64(const BenchContext& ctx, const MlpShape& shape, const MlpWeights& weights,
                                        int64_t tokens, const void* x, const void* h, const void* y) {
  const int64_t hidden = shape.hidden, intermediate = shape.intermediate;
  double worst = 0;
  for (const auto& [row, col] : SamplePositions(tokens, intermediate, kFp64Samples, 21)) {
    LOOM_ASSIGN_OR_RETURN(std::vector<double> x_row, RowToHost(ctx, x, row, hidden));
    // W_gu row 2j is gate_j, row 2j + 1 is up_j.
    const void* gate_up = weights.gate_up.get();
    LOOM_ASSIGN_OR_RETURN(std::vector<double> gate_row, RowToHost(ctx, gate_up, 2 * col, hidden));
    LOOM_ASSIGN_OR_RETURN(std::vector<double> up_row, RowToHost(ctx, gate_up, 2 * col + 1, hidden));
    LOOM_ASSIGN_OR_RETURN(double out, ElementToHost(ctx, h, row, col, intermediate));
    const Dot gate = DotProduct(x_row, gate_row), up = DotProduct(x_row, up_row);
    const double silu = gate.value / (1.0 + std::exp(-gate.value));
    const double reference = silu * up.value;
    const double gate_error = AccumulatorTolerance(gate, hidden), up_error = AccumulatorTolerance(up, hidden);
    const double bound = 1.13 * gate_error * std::fabs(up.value) + std::fabs(silu) * up_error + gate_error * up_error +
                         std::ldexp(std::fabs(reference), -8) + 1e-30;
    worst = std::max(worst, std::isfinite(out) ? std::fabs(out - reference) / bound : INFINITY);
  }
  for (const auto& [row, col] : SamplePositions(tokens, hidden, kFp64Samples, 22)) {
    LOOM_ASSIGN_OR_RETURN(std::vector<double> h_row, RowToHost(ctx, h, row, intermediate));
    LOOM_ASSIGN_OR_RETURN(std::vector<double> down_row, RowToHost(ctx, weights.down.get(), col, intermediate));
    LOOM_ASSIGN_OR_RETURN(double residual, ElementToHost(ctx, x, row, col, hidden));
    LOOM_ASSIGN_OR_RETURN(double out, ElementToHost(ctx, y, row, col, hidden));
    const Dot down = DotProduct(h_row, down_row);
    const double reference = down.value + residual;
    const double bound = AccumulatorTolerance(down, intermediate) + std::ldexp(std::fabs(reference), -8) + 1e-30;
    worst = std::max(worst, std::isfinite(out) ? std::fabs(out - reference) / bound : INFINITY);
  }
  return worst;
}

absl::Status RunMlpCase(BenchContext& ctx, const MlpShape& shape, const MlpWeights& weights, int64_t tokens,
                        CaseResult& result) {
  const int64_t hidden = shape.hidden, intermediate = shape.intermediate;
  const std::string step = absl::StrFormat("mlp T=%d", tokens);
  ctx.watchdog->SetStep(step + ": setup");
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer x, AllocateHalf(tokens * hidden, "x"));
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer g, AllocateHalf(tokens * 2 * intermediate, "g (baseline)"));
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer h_baseline, AllocateHalf(tokens * intermediate, "h (baseline)"));
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer y_baseline, AllocateHalf(tokens * hidden, "y (baseline)"));
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer h_loom, AllocateHalf(tokens * intermediate, "h (loom)"));
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer y_loom, AllocateHalf(tokens * hidden, "y (loom)"));
  BENCH_CUDA(FillUniform(ctx, x.get(), tokens * hidden, 100 + tokens));
  // Outputs start as NaN (0xFFFF, in bf16 and fp16): anything left unwritten fails the comparison.
  const std::pair<void*, int64_t> outputs[] = {{g.get(), tokens * 2 * intermediate},
                                               {h_baseline.get(), tokens * intermediate},
                                               {y_baseline.get(), tokens * hidden},
                                               {h_loom.get(), tokens * intermediate},
                                               {y_loom.get(), tokens * hidden}};
  for (const auto& [output, elements] : outputs) {
    BENCH_CUDA(cudaMemsetAsync(output, 0xFF, elements * kHalfBytes, ctx.stream));
  }

  // Baseline: GEMM, SwiGLU, copy x into y, GEMM with beta = 1, as one CUDA graph.
  ctx.watchdog->SetStep(step + ": baseline");
  LtMatmul gate_up_gemm, down_gemm;
  LOOM_RETURN_IF_ERROR(gate_up_gemm.Init(ctx.lt, tokens, 2 * intermediate, hidden, CudaType(ctx)));
  LOOM_RETURN_IF_ERROR(down_gemm.Init(ctx.lt, tokens, hidden, intermediate, CudaType(ctx)));
  auto enqueue_baseline = [&](cudaStream_t stream) -> absl::Status {
    LOOM_RETURN_IF_ERROR(gate_up_gemm.Enqueue(x.get(), weights.gate_up.get(), g.get(), 0.0f, ctx.workspace, stream));
    BENCH_CUDA(SwiGLUInterleaved(g.get(), h_baseline.get(), tokens * intermediate, CudaType(ctx), stream));
    BENCH_CUDA(
        cudaMemcpyAsync(y_baseline.get(), x.get(), tokens * hidden * kHalfBytes, cudaMemcpyDeviceToDevice, stream));
    LOOM_RETURN_IF_ERROR(down_gemm.Enqueue(h_baseline.get(), weights.down.get(), y_baseline.get(), 1.0f,
                                           ctx.workspace, stream));
    return absl::OkStatus();
  };
  LOOM_ASSIGN_OR_RETURN(GraphExec baseline_graph, PrepareBaselineGraph(ctx, enqueue_baseline));
  ctx.watchdog->SetStep(step + ": baseline FP64 check");
  LOOM_ASSIGN_OR_RETURN(result.baseline_fp64_worst,
                        CheckMlpAgainstFp64(ctx, shape, weights, tokens, x.get(), h_baseline.get(), y_baseline.get()));

  // loom: the same block as one graph, one persistent kernel.
  const TensorView x_view = TensorView::Dense("x", x.get(), ctx.dtype, tokens, hidden);
  GemmGraph graph;
  graph.AddGemm("gate_up", x_view,
                TensorView::Dense("w_gate_up", weights.gate_up.get(), ctx.dtype, 2 * intermediate, hidden),
                TensorView::Dense("h", h_loom.get(), ctx.dtype, tokens, intermediate),
                Epilogue{.activation = Activation::kSwiGLU});
  const TensorView h_view = TensorView::Dense("h", h_loom.get(), ctx.dtype, tokens, intermediate);
  const TensorView w_down_view = TensorView::Dense("w_down", weights.down.get(), ctx.dtype, hidden, intermediate);
  const TensorView y_view = TensorView::Dense("y", y_loom.get(), ctx.dtype, tokens, hidden);
  const int parts = absl::GetFlag(FLAGS_down_parts);
  if (parts < 1 || parts > intermediate) {
    // More parts than K's columns would leave some with K = 0; slices that
    // are not 16-byte aligned the runtime refuses by name at Compile.
    return absl::InvalidArgumentError(
        absl::StrFormat("--down_parts must be in [1, %d] (the intermediate width), got %d", intermediate, parts));
  }
  std::vector<DeviceBuffer> partials;
  if (parts == 1) {
    graph.AddGemm("down", h_view, w_down_view, y_view, Epilogue{.residual = x_view});
  } else {
    // Part p multiplies K slice p and adds part p - 1's fp32 output (x for
    // the first); the last part writes y.
    const int64_t slice = intermediate / parts;
    TensorView residual = x_view;
    for (int p = 0; p < parts; ++p) {
      const int64_t k0 = p * slice, k = p + 1 == parts ? intermediate - k0 : slice;
      TensorView out = y_view;
      if (p + 1 < parts) {
        LOOM_ASSIGN_OR_RETURN(DeviceBuffer partial,
                              AllocateBytes(static_cast<size_t>(tokens * hidden) * sizeof(float), "down partial"));
        out = TensorView::Dense(absl::StrCat("y_part", p), partial.get(), DType::kFP32, tokens, hidden);
        partials.push_back(std::move(partial));
      }
      graph.AddGemm(absl::StrCat("down", p), h_view.Columns(k0, k).Named(absl::StrCat("h", p)),
                    w_down_view.Columns(k0, k).Named(absl::StrCat("w_down", p)), out,
                    Epilogue{.residual = residual});
      residual = out;
    }
  }
  const std::pair<void*, int64_t> loom_outputs[] = {{h_loom.get(), tokens * intermediate},
                                                    {y_loom.get(), tokens * hidden}};
  LOOM_RETURN_IF_ERROR(TimeAgainstBaseline(ctx, graph, baseline_graph, step, loom_outputs, result));

  ctx.watchdog->SetStep(step + ": comparison");
  LOOM_ASSIGN_OR_RETURN(result.loom_fp64_worst,
                        CheckMlpAgainstFp64(ctx, shape, weights, tokens, x.get(), h_loom.get(), y_loom.get()));
  LOOM_RETURN_IF_ERROR(
      CompareWithBaseline(ctx, "h", h_loom.get(), h_baseline.get(), tokens, intermediate, result.agreement));
  LOOM_RETURN_IF_ERROR(
      CompareWithBaseline(ctx, "y", y_loom.get(), y_baseline.get(), tokens, hidden, result.agreement));
  return absl::OkStatus();
}

// --- The chain of linear layers. ---

// Sampled elements of every layer of one implementation against FP64 from
// that layer's input (its own previous layer's output). Returns the worst
// error / allowed error.
absl::StatusOr<double> CheckChainAgainstFp64(const BenchContext& ctx, const std::vector<DeviceBuffer>& weights,
                                          const std::vector<const void*>& activations, int64_t tokens, int64_t width) {
  double worst = 0;
  const int per_layer = std::max<int>(2, kFp64Samples / static_cast<int>(weights.size()));
  for (size_t layer = 0; layer < weights.size(); ++layer) {
    for (const auto& [row, col] : SamplePositions(tokens, width, per_layer, 31 + layer)) {
      LOOM_ASSIGN_OR_RETURN(std::vector<double> input_row, RowToHost(ctx, activations[layer], row, width));
      LOOM_ASSIGN_OR_RETURN(std::vector<double> weight_row, RowToHost(ctx, weights[layer].get(), col, width));
      LOOM_ASSIGN_OR_RETURN(double out, ElementToHost(ctx, activations[layer + 1], row, col, width));
      const Dot dot = DotProduct(input_row, weight_row);
      const double bound = AccumulatorTolerance(dot, width) + 1e-30;
      worst = std::max(worst, std::isfinite(out) ? std::fabs(out - dot.value) / bound : INFINITY);
    }
  }
  return worst;
}

absl::Status RunChainCase(BenchContext& ctx, const std::vector<DeviceBuffer>& weights, int64_t width, int64_t tokens,
                          CaseResult& result) {
  const int layers = static_cast<int>(weights.size());
  const std::string step = absl::StrFormat("chain T=%d", tokens);
  ctx.watchdog->SetStep(step + ": setup");
  LOOM_ASSIGN_OR_RETURN(DeviceBuffer x, AllocateHalf(tokens * width, "x"));
  BENCH_CUDA(FillUniform(ctx, x.get(), tokens * width, 200 + tokens));
  // outputs[l] is layer l's output; layer l reads x (l = 0) or outputs[l - 1].
  std::vector<DeviceBuffer> baseline_outputs, loom_outputs;
  for (int layer = 0; layer < layers; ++layer) {
    LOOM_ASSIGN_OR_RETURN(DeviceBuffer baseline_out, AllocateHalf(tokens * width, "chain output (baseline)"));
    LOOM_ASSIGN_OR_RETURN(DeviceBuffer loom_out, AllocateHalf(tokens * width, "chain output (loom)"));
    BENCH_CUDA(cudaMemsetAsync(baseline_out.get(), 0xFF, tokens * width * kHalfBytes, ctx.stream));
    BENCH_CUDA(cudaMemsetAsync(loom_out.get(), 0xFF, tokens * width * kHalfBytes, ctx.stream));
    baseline_outputs.push_back(std::move(baseline_out));
    loom_outputs.push_back(std::move(loom_out));
  }
  auto baseline_input = [&](int layer) -> const void* {
    return layer == 0 ? x.get() : baseline_outputs[layer - 1].get();
  };

  ctx.watchdog->SetStep(step + ": baseline");
  LtMatmul layer_gemm;
  LOOM_RETURN_IF_ERROR(layer_gemm.Init(ctx.lt, tokens, width, width, CudaType(ctx)));
  auto enqueue_baseline = [&](cudaStream_t stream) -> absl::Status {
    for (int layer = 0; layer < layers; ++layer) {
      LOOM_RETURN_IF_ERROR(layer_gemm.Enqueue(baseline_input(layer), weights[layer].get(),
                                              baseline_outputs[layer].get(), 0.0f, ctx.workspace, stream));
    }
    return absl::OkStatus();
  };
  LOOM_ASSIGN_OR_RETURN(GraphExec baseline_graph, PrepareBaselineGraph(ctx, enqueue_baseline));
  ctx.watchdog->SetStep(step + ": baseline FP64 check");
  std::vector<const void*> baseline_activations = {x.get()};
  for (const DeviceBuffer& out : baseline_outputs) baseline_activations.push_back(out.get());
  LOOM_ASSIGN_OR_RETURN(result.baseline_fp64_worst,
                        CheckChainAgainstFp64(ctx, weights, baseline_activations, tokens, width));

  const int parts = absl::GetFlag(FLAGS_chain_parts);  // divides width (CheckFlags)
  GemmGraph graph;
  for (int layer = 0; layer < layers; ++layer) {
    const TensorView input =
        layer == 0 ? TensorView::Dense("x", x.get(), ctx.dtype, tokens, width)
                   : TensorView::Dense(absl::StrCat("y", layer - 1), loom_outputs[layer - 1].get(), ctx.dtype,
                                       tokens, width);
    const TensorView w =
        TensorView::Dense(absl::StrCat("w", layer), weights[layer].get(), ctx.dtype, width, width);
    const TensorView y =
        TensorView::Dense(absl::StrCat("y", layer), loom_outputs[layer].get(), ctx.dtype, tokens, width);
    // Part p computes output columns [p slice, (p + 1) slice) from the same
    // rows of the weights: the layer's products, in `parts` nodes.
    const int64_t slice = width / parts;
    for (int p = 0; p < parts; ++p) {
      const std::string suffix = parts == 1 ? "" : absl::StrCat("_", p);
      graph.AddGemm(absl::StrCat("layer", layer, suffix), input,
                    parts == 1 ? w : w.Rows(p * slice, slice).Named(absl::StrCat("w", layer, suffix)),
                    parts == 1 ? y : y.Columns(p * slice, slice).Named(absl::StrCat("y", layer, suffix)));
    }
  }
  std::vector<std::pair<void*, int64_t>> poisoned;  // every loom layer's output
  for (const DeviceBuffer& out : loom_outputs) poisoned.emplace_back(out.get(), tokens * width);
  LOOM_RETURN_IF_ERROR(TimeAgainstBaseline(ctx, graph, baseline_graph, step, poisoned, result));

  ctx.watchdog->SetStep(step + ": comparison");
  std::vector<const void*> loom_activations = {x.get()};
  for (const DeviceBuffer& out : loom_outputs) loom_activations.push_back(out.get());
  LOOM_ASSIGN_OR_RETURN(result.loom_fp64_worst, CheckChainAgainstFp64(ctx, weights, loom_activations, tokens, width));
  for (int layer = 0; layer < layers; ++layer) {
    LOOM_RETURN_IF_ERROR(CompareWithBaseline(ctx, absl::StrCat("y", layer), loom_outputs[layer].get(),
                                             baseline_outputs[layer].get(), tokens, width, result.agreement));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<DeviceBuffer>> MakeChainWeights(const BenchContext& ctx, int layers, int64_t width) {
  std::vector<DeviceBuffer> weights;
  for (int layer = 0; layer < layers; ++layer) {
    LOOM_ASSIGN_OR_RETURN(DeviceBuffer w, AllocateHalf(width * width, absl::StrCat("w", layer)));
    BENCH_CUDA(FillUniform(ctx, w.get(), width * width, 300 + layer, std::sqrt(3.0f / static_cast<float>(width))));
    weights.push_back(std::move(w));
  }
  BENCH_CUDA(cudaStreamSynchronize(ctx.stream));
  return weights;
}

// --- Output. ---

std::string JsonNumber(double value) { return std::isfinite(value) ? absl::StrFormat("%.6g", value) : "null"; }

std::string JsonNumbers(const std::vector<double>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ", ", [](std::string* out, double v) { out->append(JsonNumber(v)); }),
                      "]");
}

std::string JsonString(std::string_view text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&quoted, "\\u%04x", static_cast<int>(c));
    } else {
      quoted += c;
    }
  }
  return quoted + "\"";
}

absl::Status WriteJson(const std::string& path, const DeviceDescription& device, const CompileOptions& options,
                       double copy_gbps, const std::vector<CaseResult>& results) {
  std::string text = "{\n";
  absl::StrAppendFormat(&text, "  \"device\": %s,\n  \"copy_gbps\": %s,\n  \"dtype\": %s,\n",
                        JsonString(device.name), JsonNumber(copy_gbps), JsonString(absl::GetFlag(FLAGS_dtype)));
  absl::StrAppendFormat(&text, "  \"hidden\": %d,\n  \"intermediate\": %d,\n", absl::GetFlag(FLAGS_hidden),
                        absl::GetFlag(FLAGS_intermediate));
  absl::StrAppendFormat(&text, "  \"chain_layers\": %d,\n  \"chain_width\": %d,\n", absl::GetFlag(FLAGS_chain_layers),
                        absl::GetFlag(FLAGS_chain_width));
  // How it was timed: back-to-back runs let loom's launches overlap each
  // other (overlap_launches), which the baseline's graph replays cannot.
  absl::StrAppendFormat(&text,
                        "  \"run_length\": %d,\n  \"overlap_launches\": %s,\n  \"pack_weights\": %s,\n"
                        "  \"iters\": %d,\n  \"rounds\": %d,\n  \"warmup_ms\": %s,\n  \"cooldown_ms\": %s,\n",
                        absl::GetFlag(FLAGS_run_length), options.overlap_launches ? "true" : "false",
                        options.pack_weights ? "true" : "false", absl::GetFlag(FLAGS_iters),
                        absl::GetFlag(FLAGS_rounds), JsonNumber(absl::GetFlag(FLAGS_warmup_ms)),
                        JsonNumber(absl::GetFlag(FLAGS_cooldown_ms)));
  text += "  \"cases\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const CaseResult& r = results[i];
    absl::StrAppendFormat(
        &text,
        "    {\"kind\": %s, \"tokens\": %d, \"baseline_us\": %s, \"loom_us\": %s, \"speedup\": %s, "
        "\"baseline_weight_gbps\": %s, \"loom_weight_gbps\": %s, \"baseline_tflops\": %s, \"loom_tflops\": %s, "
        "\"baseline_iters\": %d, \"loom_iters\": %d, \"baseline_round_us\": %s, \"loom_round_us\": %s, "
        "\"max_rel_diff\": %s, \"max_abs_diff\": %s, "
        "\"bad_elements\": %d, \"compared_elements\": %d, \"baseline_fp64_err_over_bound\": %s, "
        "\"loom_fp64_err_over_bound\": %s, "
        "\"correct\": %s, \"verdict\": %s, \"error\": %s}%s\n",
        JsonString(r.kind), r.tokens, JsonNumber(r.baseline.median_us), JsonNumber(r.loom.median_us),
        JsonNumber(r.speedup()), JsonNumber(CaseResult::GBps(r.weight_bytes, r.baseline)),
        JsonNumber(CaseResult::GBps(r.weight_bytes, r.loom)), JsonNumber(CaseResult::TFps(r.flops, r.baseline)),
        JsonNumber(CaseResult::TFps(r.flops, r.loom)), r.baseline.iters, r.loom.iters,
        JsonNumbers(r.baseline.round_medians_us), JsonNumbers(r.loom.round_medians_us),
        JsonNumber(r.agreement.max_relative), JsonNumber(r.agreement.max_absolute), r.agreement.bad,
        r.agreement.elements, JsonNumber(r.baseline_fp64_worst), JsonNumber(r.loom_fp64_worst),
        r.correct() ? "true" : "false",
        JsonString(r.Verdict()), JsonString(r.error), i + 1 < results.size() ? "," : "");
  }
  text += "  ]\n}\n";
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return absl::UnavailableError(absl::StrFormat("cannot open --json=%s for writing", path));
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) return absl::DataLossError(absl::StrFormat("writing --json=%s failed", path));
  return absl::OkStatus();
}

void PrintSummary(const std::vector<CaseResult>& results, double copy_gbps) {
  std::printf("\nsummary (speedup = baseline time / loom time, > 1: loom faster; GB/s = weight bytes / time; "
              "copy bandwidth %.0f GB/s)\n",
              copy_gbps);
  std::printf("%-6s %6s %12s %10s %8s %10s %10s %10s %10s %13s  %s\n", "case", "tokens", "baseline_us", "loom_us",
              "speedup", "base_GB/s", "loom_GB/s", "base_TF/s", "loom_TF/s", "max_rel_diff", "check");
  for (const CaseResult& r : results) {
    std::printf("%-6s %6ld %12.1f %10.1f %8.3f %10.0f %10.0f %10.1f %10.1f %13.2e  %s\n", r.kind.c_str(), r.tokens,
                r.baseline.median_us, r.loom.median_us, r.speedup(), CaseResult::GBps(r.weight_bytes, r.baseline),
                CaseResult::GBps(r.weight_bytes, r.loom), CaseResult::TFps(r.flops, r.baseline),
                CaseResult::TFps(r.flops, r.loom), r.agreement.max_relative, r.Verdict().c_str());
  }
  for (const char* kind : {"mlp", "chain"}) {
    double log_sum = 0;
    int count = 0;
    for (const CaseResult& r : results) {
      if (r.kind != kind || r.speedup() <= 0) continue;
      log_sum += std::log(r.speedup());
      ++count;
    }
    if (count > 0) std::printf("geomean speedup %-5s %.3f over %d cases\n", kind, std::exp(log_sum / count), count);
  }
  std::fflush(stdout);
}

// --- Flags and main. ---

absl::StatusOr<std::vector<int64_t>> ParseTokenList(std::string_view flag, const std::string& text) {
  std::vector<int64_t> values;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(item, &value) || value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--%s: '%s' is not a positive integer", flag, std::string(item)));
    }
    values.push_back(value);
  }
  return values;
}

absl::Status CheckWidth(std::string_view flag, int64_t value) {
  // loom and cuBLAS both want 16-byte aligned rows: a multiple of 8 16-bit elements.
  if (value <= 0 || value % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("--%s=%d: must be a positive multiple of 8", flag, value));
  }
  return absl::OkStatus();
}

absl::Status CheckFlags() {
  LOOM_RETURN_IF_ERROR(CheckWidth("hidden", absl::GetFlag(FLAGS_hidden)));
  LOOM_RETURN_IF_ERROR(CheckWidth("intermediate", absl::GetFlag(FLAGS_intermediate)));
  LOOM_RETURN_IF_ERROR(CheckWidth("chain_width", absl::GetFlag(FLAGS_chain_width)));
  if (const int iters = absl::GetFlag(FLAGS_iters); iters < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--iters must be at least 1, got ", iters));
  }
  if (const int run_length = absl::GetFlag(FLAGS_run_length); run_length < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--run_length must be at least 1, got ", run_length));
  }
  if (const int rounds = absl::GetFlag(FLAGS_rounds); rounds < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--rounds must be at least 1, got ", rounds));
  }
  for (const auto& [name, ms] : {std::pair{"warmup_ms", absl::GetFlag(FLAGS_warmup_ms)},
                                 std::pair{"cooldown_ms", absl::GetFlag(FLAGS_cooldown_ms)}}) {
    if (!(ms >= 0 && ms <= 60000)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be in [0, 60000], got ", ms));
    }
  }
  if (const int warmup = absl::GetFlag(FLAGS_warmup); warmup < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--warmup must be at least 1, got ", warmup));
  }
  // A week at most: the watchdog's deadline is a duration in nanoseconds,
  // which overflows past ~292 years (and for inf or NaN) into one already
  // past.
  if (const double seconds = absl::GetFlag(FLAGS_max_seconds); !(seconds >= 0 && seconds <= 604800)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_seconds must be in [0, 604800] (0: no limit), got ", seconds));
  }
  if (const std::string dtype = absl::GetFlag(FLAGS_dtype); dtype != "bf16" && dtype != "fp16") {
    return absl::InvalidArgumentError(absl::StrCat("--dtype must be bf16 or fp16, got '", dtype, "'"));
  }
  if (const int layers = absl::GetFlag(FLAGS_chain_layers); layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--chain_layers must be at least 0, got ", layers));
  }
  // Equal slices, so that every part is the same GEMM.
  if (const int parts = absl::GetFlag(FLAGS_chain_parts);
      parts < 1 || absl::GetFlag(FLAGS_chain_width) % parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--chain_parts must be at least 1 and divide --chain_width (",
                                                   absl::GetFlag(FLAGS_chain_width), "), got ", parts));
  }
  return absl::OkStatus();
}

// A failed case may leave the CUDA context unusable (a kernel fault is sticky);
// then no further case can run.
bool ContextStillUsable() {
  cudaGetLastError();  // clears a non-sticky error
  const cudaError_t error = cudaDeviceSynchronize();
  if (error == cudaSuccess) return true;
  std::printf("the CUDA context is unusable (%s: %s); skipping the remaining cases\n", cudaGetErrorName(error),
              cudaGetErrorString(error));
  return false;
}

// The cases of one kind (mlp, chain) at each token count, on weights made
// once: each runs through run(weights, tokens, result) and is printed as it
// ends. Returns whether every case ran and agreed; `usable` turns false once a
// failure has left the CUDA context unusable.
template <typename Weights, typename Run>
bool RunCases(const std::string& kind, const std::vector<int64_t>& token_counts, double weight_bytes,
              double flops_per_token, const absl::StatusOr<Weights>& weights, double copy_gbps, Run&& run,
              std::vector<CaseResult>& results, bool& usable) {
  if (!weights.ok()) {
    std::printf("%s weights: error: %s\n", kind.c_str(), weights.status().ToString().c_str());
    usable = ContextStillUsable();
    return false;
  }
  bool all_ok = true;
  for (int64_t tokens : token_counts) {
    if (!usable) break;
    CaseResult result;
    result.kind = kind;
    result.tokens = tokens;
    result.weight_bytes = weight_bytes;
    result.flops = flops_per_token * static_cast<double>(tokens);
    if (absl::Status status = run(*weights, tokens, result); !status.ok()) result.error = status.ToString();
    PrintCase(result, copy_gbps);
    all_ok &= result.correct();
    results.push_back(std::move(result));
    if (!results.back().error.empty()) usable = ContextStillUsable();
  }
  return all_ok;
}

int Main() {
  if (absl::Status flags = CheckFlags(); !flags.ok()) {
    std::fprintf(stderr, "loom_graph_bench: %s\n", std::string(flags.message()).c_str());
    return 2;
  }
  absl::StatusOr<std::vector<int64_t>> mlp_tokens = ParseTokenList("tokens", absl::GetFlag(FLAGS_tokens));
  absl::StatusOr<std::vector<int64_t>> chain_tokens =
      ParseTokenList("chain_tokens", absl::GetFlag(FLAGS_chain_tokens));
  for (const auto* parsed : {&mlp_tokens, &chain_tokens}) {
    if (!parsed->ok()) {
      std::fprintf(stderr, "loom_graph_bench: %s\n", std::string(parsed->status().message()).c_str());
      return 2;
    }
  }

  Watchdog watchdog(absl::GetFlag(FLAGS_max_seconds));
  absl::StatusOr<Runtime> runtime = Runtime::Create(0);
  if (!runtime.ok()) {
    std::fprintf(stderr, "loom_graph_bench needs a Hopper GPU (sm_90) on device 0: %s\n",
                 runtime.status().ToString().c_str());
    return 1;
  }
  const DeviceDescription& device = runtime->device();
  std::printf("device: %s, %d SMs, L2 %.0f MB; cublasLt %zu\n", device.name.c_str(), device.sm_count,
              device.l2_bytes / 1e6, cublasLtGetVersion());

  BenchContext ctx;
  ctx.dtype = absl::GetFlag(FLAGS_dtype) == "fp16" ? DType::kFP16 : DType::kBF16;
  ctx.runtime = &*runtime;
  ctx.loom_options = LoomOptionsFromFlags();
  ctx.timeline = absl::GetFlag(FLAGS_timeline);
  ctx.timeline_csv = absl::GetFlag(FLAGS_timeline_csv);
  ctx.watchdog = &watchdog;
  ctx.warmup = absl::GetFlag(FLAGS_warmup);
  ctx.warmup_ms = absl::GetFlag(FLAGS_warmup_ms);
  ctx.cooldown_ms = absl::GetFlag(FLAGS_cooldown_ms);
  ctx.iters = absl::GetFlag(FLAGS_iters);
  ctx.run_length = absl::GetFlag(FLAGS_run_length);
  ctx.rounds = absl::GetFlag(FLAGS_rounds);
  DeviceBuffer workspace;
  const absl::Status setup = [&]() -> absl::Status {
    BENCH_CUBLAS(cublasLtCreate(&ctx.lt));
    BENCH_CUDA(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
    BENCH_CUDA(cudaMalloc(&ctx.workspace, kCublasWorkspaceBytes));
    workspace.reset(ctx.workspace);
    return absl::OkStatus();
  }();
  auto release = [&] {
    workspace.reset();
    if (ctx.stream != nullptr) cudaStreamDestroy(ctx.stream);
    if (ctx.lt != nullptr) cublasLtDestroy(ctx.lt);
  };
  if (!setup.ok()) {
    std::fprintf(stderr, "loom_graph_bench: setup failed: %s\n", setup.ToString().c_str());
    release();
    return 1;
  }

  // Within a run of launches back to back, loom's launches overlap each other
  // (overlap_launches); the baseline's graph replays cannot. An event between
  // launches ends the overlap, so with --run_length=1 neither side overlaps.
  const bool self_overlap = ctx.run_length > 1 && ctx.loom_options.overlap_launches;
  std::printf("timing: %s; %d round%s of baseline and loom in turns, %.0f ms idle before each%s; %s; loom weights "
              "%s\n",
              ctx.run_length == 1 ? "an event between every two launches"
                                  : absl::StrFormat("runs of %d launches back to back", ctx.run_length).c_str(),
              ctx.rounds, ctx.rounds == 1 ? "" : "s", ctx.cooldown_ms,
              ctx.warmup_ms > 0 ? absl::StrFormat(", warmed for %.0f ms", ctx.warmup_ms).c_str() : "",
              self_overlap ? "loom's launches overlap the loom launch before them (the baseline's cannot)"
                           : "no launch overlaps another",
              ctx.loom_options.pack_weights ? "packed at Compile" : "read in place");
  bool all_ok = true;
  bool usable = true;
  double copy_gbps = 0;
  if (absl::StatusOr<double> copy = MeasureCopyGBps(ctx); copy.ok()) {
    copy_gbps = *copy;
    std::printf("copy bandwidth (1 GiB device to device, read + write): %.0f GB/s\n", copy_gbps);
  } else {
    std::printf("copy bandwidth: error: %s\n", copy.status().ToString().c_str());
    all_ok = false;
    usable = ContextStillUsable();
  }
  std::fflush(stdout);

  std::vector<CaseResult> results;
  const MlpShape mlp{absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_intermediate)};
  if (usable && !mlp_tokens->empty()) {
    std::printf("\nMLP block: hidden %ld, intermediate %ld, %s, weights %.0f MB\n", mlp.hidden, mlp.intermediate,
                absl::GetFlag(FLAGS_dtype).c_str(), mlp.weight_bytes() / 1e6);
    WarnIfWeightsFitInL2(ctx, "MLP", mlp.weight_bytes());
    ctx.watchdog->SetStep("mlp weights");
    all_ok &= RunCases<MlpWeights>(
        "mlp", *mlp_tokens, mlp.weight_bytes(), 6.0 * mlp.hidden * mlp.intermediate, MakeMlpWeights(ctx, mlp),
        copy_gbps,
        [&](const MlpWeights& weights, int64_t tokens, CaseResult& result) {
          return RunMlpCase(ctx, mlp, weights, tokens, result);
        },
        results, usable);
  }

  const int layers = absl::GetFlag(FLAGS_chain_layers);
  const int64_t width = absl::GetFlag(FLAGS_chain_width);
  if (usable && layers > 0 && !chain_tokens->empty()) {
    const double weight_bytes = static_cast<double>(layers) * width * width * kHalfBytes;
    std::printf("\nchain: %d layers of %ld x %ld, %s, weights %.0f MB\n", layers, width, width,
                absl::GetFlag(FLAGS_dtype).c_str(), weight_bytes / 1e6);
    WarnIfWeightsFitInL2(ctx, "chain", weight_bytes);
    ctx.watchdog->SetStep("chain weights");
    all_ok &= RunCases<std::vector<DeviceBuffer>>(
        "chain", *chain_tokens, weight_bytes, 2.0 * width * width * layers, MakeChainWeights(ctx, layers, width),
        copy_gbps,
        [&](const std::vector<DeviceBuffer>& weights, int64_t tokens, CaseResult& result) {
          return RunChainCase(ctx, weights, width, tokens, result);
        },
        results, usable);
  }

  watchdog.SetStep("summary");
  PrintSummary(results, copy_gbps);
  if (!usable) all_ok = false;
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    if (absl::Status written = WriteJson(path, device, ctx.loom_options, copy_gbps, results); !written.ok()) {
      std::printf("%s\n", written.ToString().c_str());
      all_ok = false;
    } else {
      std::printf("wrote %s\n", path.c_str());
    }
  }
  std::printf("%s\n", all_ok ? "all cases ran and agree" : "FAILURES (see above)");
  release();
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "loom's MLP block and layer chain against cuBLAS in a CUDA graph (the PyTorch baseline), "
      "same process, same data. See the top of bench/graph_bench.cc.");
  loom::bench::ListBenchFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  return loom::bench::Main();
}
