// demos/demo_common.cc: the GPU and CPU-reference runs shared by loom's demos
// (see demo_common.h), and the checks they print.
#include "demo_common.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "loom/ops/host_numeric.h"
#include "loom/reference.h"
#include "loom/status.h"

ABSL_FLAG(bool, explain, false, "Print the plan (Plan::Explain) and the graph's dependency list.");
ABSL_FLAG(bool, cpu, false,
          "Run the CPU reference executor even when a GPU is present (at a reduced size "
          "unless the size flags are given).");
ABSL_FLAG(int64_t, check_rows, 16,
          "Rows of every node's output to verify against a CPU computation (0: none).");
ABSL_FLAG(int32_t, iters, 50, "Timed launches on the GPU; the median is reported (0: none).");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the random inputs; 0 picks a fresh one (printed).");
ABSL_FLAG(loom::KernelChoice, kernel, loom::KernelChoice::kAuto,
          "The kernel: auto (the runtime chooses), tiled or narrow (CompileOptions::kernel).");
ABSL_FLAG(std::string, dtype, "bf16", "Every matrix's element type: bf16 or fp16.");
ABSL_FLAG(bool, pack_weights, false,
          "Copy the weights into the kernel's stage order at Compile (the tiled kernel: nodes of at most two row "
          "blocks, split rings; CompileOptions::pack_weights).");

namespace loom::demo {
namespace {

CompileOptions DemoOptions() {
  CompileOptions options;
  options.kernel = absl::GetFlag(FLAGS_kernel);
  options.pack_weights = absl::GetFlag(FLAGS_pack_weights);
  return options;
}

// Every demo matrix's element type (--dtype, checked by RunDemo).
DType MatrixType() { return absl::GetFlag(FLAGS_dtype) == "fp16" ? DType::kFP16 : DType::kBF16; }

constexpr uint16_t kPoison = 0xFFFF;  // a NaN in bf16 and in fp16: any element left unwritten shows up

absl::Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrFormat("%s: %s (%s)", what, cudaGetErrorString(error), cudaGetErrorName(error)));
}

// SplitMix64: a small, fast, seedable generator; plenty for test data.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  // Uniform in [-1, 1), never exactly 0.
  float Symmetric() {
    state_ += 0x9E3779B97F4A7C15ull;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // 24 random bits, centred on the half-way points: never 0.
    return (static_cast<float>(z >> 40) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
  }

 private:
  uint64_t state_;
};

// Host copies of every demo matrix (16-bit patterns of MatrixType()), filled
// by role.
class HostMatrices {
 public:
  HostMatrices(const std::vector<MatrixSpec>& specs, uint64_t seed) {
    Random random(seed);
    for (const MatrixSpec& spec : specs) {
      Entry& entry = entries_[spec.name];
      entry.spec = spec;
      entry.bits.resize(static_cast<size_t>(spec.rows * spec.cols));
      const float scale =
          spec.role == MatrixRole::kWeight
              ? std::sqrt(3.0f / static_cast<float>(std::max<int64_t>(spec.cols, 1)))
              : 1.0f;
      const auto round = MatrixType() == DType::kFP16 ? ops::FloatToFP16 : ops::FloatToBF16;
      for (uint16_t& bits : entry.bits) {
        bits = spec.role == MatrixRole::kProduced ? kPoison : round(scale * random.Symmetric());
      }
    }
  }

  TensorView View(std::string_view name) {
    Entry& entry = Find(name);
    return TensorView::Dense(entry.spec.name, entry.bits.data(), MatrixType(), entry.spec.rows,
                             entry.spec.cols);
  }
  std::vector<uint16_t>& Bits(std::string_view name) { return Find(name).bits; }

  template <typename Fn>
  void ForEach(Fn&& fn) {
    for (auto& [name, entry] : entries_) fn(entry.spec, entry.bits);
  }

 private:
  struct Entry {
    MatrixSpec spec;
    std::vector<uint16_t> bits;
  };
  Entry& Find(std::string_view name) {
    auto it = entries_.find(std::string(name));
    if (it == entries_.end()) {
      std::cerr << "demo bug: no matrix called \"" << name << "\"\n";
      std::abort();
    }
    return it->second;
  }
  std::map<std::string, Entry> entries_;
};

// Device memory that frees itself.
struct DeviceFree {
  void operator()(void* ptr) const { cudaFree(ptr); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

// Device copies of every demo matrix: inputs copied, produced ones poisoned.
class DeviceMatrices {
 public:
  absl::Status Upload(HostMatrices& host) {
    absl::Status status = absl::OkStatus();
    host.ForEach([&](const MatrixSpec& spec, std::vector<uint16_t>& bits) {
      if (!status.ok()) return;
      const size_t bytes = bits.size() * sizeof(uint16_t);
      void* raw = nullptr;
      status = CudaStatus(cudaMalloc(&raw, std::max<size_t>(bytes, 16)),
                          absl::StrFormat("cudaMalloc(%s, %d bytes)", spec.name, bytes));
      if (!status.ok()) return;
      buffers_[spec.name] = {spec, DeviceBuffer(raw)};
      status = spec.role == MatrixRole::kProduced
                   ? CudaStatus(cudaMemset(raw, 0xFF, bytes),
                                absl::StrFormat("cudaMemset(%s)", spec.name))
                   : CudaStatus(cudaMemcpy(raw, bits.data(), bytes, cudaMemcpyHostToDevice),
                                absl::StrFormat("cudaMemcpy(%s, host to device)", spec.name));
    });
    return status;
  }

  // Copies every produced matrix back into `host`.
  absl::Status DownloadProduced(HostMatrices& host) {
    for (auto& [name, entry] : buffers_) {
      if (entry.spec.role != MatrixRole::kProduced) continue;
      std::vector<uint16_t>& bits = host.Bits(name);
      LOOM_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpy(bits.data(), entry.buffer.get(), bits.size() * sizeof(uint16_t),
                                cudaMemcpyDeviceToHost),
                     absl::StrFormat("cudaMemcpy(%s, device to host)", name)));
    }
    return absl::OkStatus();
  }

  TensorView View(std::string_view name) {
    auto it = buffers_.find(std::string(name));
    if (it == buffers_.end()) {
      std::cerr << "demo bug: no matrix called \"" << name << "\"\n";
      std::abort();
    }
    const MatrixSpec& spec = it->second.spec;
    return TensorView::Dense(spec.name, it->second.buffer.get(), MatrixType(), spec.rows,
                             spec.cols);
  }

 private:
  struct Entry {
    MatrixSpec spec;
    DeviceBuffer buffer;
  };
  std::map<std::string, Entry> buffers_;
};

// --- The CPU check: a naive loop per node, FP64 accumulation. ---

double Activate(Activation activation, double x) {
  switch (activation) {
    case Activation::kNone:
    case Activation::kSwiGLU:  // handled by the caller (pairs of columns)
      return x;
    case Activation::kReLU:
      return x > 0 ? x : 0;
    case Activation::kGELU:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::kSiLU:
      return x / (1.0 + std::exp(-x));
  }
  return x;
}

// Up to `count` rows of [0, rows), spread evenly, first and last included.
std::vector<int64_t> SampleRows(int64_t rows, int64_t count) {
  std::vector<int64_t> sample;
  if (count <= 0 || rows <= 0) return sample;
  if (count >= rows) {
    for (int64_t r = 0; r < rows; ++r) sample.push_back(r);
    return sample;
  }
  for (int64_t i = 0; i < count; ++i) {
    sample.push_back(count == 1 ? 0 : i * (rows - 1) / (count - 1));
  }
  return sample;
}

// Checks the sampled rows of one node's output, computed from the node's
// actual inputs (host memory), against
//   acc  = sum_k A[r,k] B[n,k] (+ bias[n])        in FP64
//   out  = act(acc) + residual                    (SwiGLU: silu(acc[2j]) acc[2j+1])
// Tolerance (TESTING.md, bf16 in / fp32 accumulate), per accumulator:
//   e(acc) = 2^-8 |acc| + 4 sqrt(K) 2^-24 (|A| |B|)_rn
// carried through the activation (|slope| <= 1.13 for relu/gelu/silu;
// SwiGLU: 1.13 e(g) |u| + |silu(g)| e(u) + e(g) e(u)), plus the rounding of
// the output, 2^-8 |out| in bf16 (2^-11 in fp16).
absl::Status CheckNode(const GemmNode& node, int64_t max_rows, int64_t* checked) {
  const int64_t k = node.k(), n = node.n(), out_cols = node.out_cols();
  const std::vector<int64_t> rows = SampleRows(node.m(), max_rows);
  if (rows.empty() || out_cols == 0) return absl::OkStatus();

  std::vector<double> a(rows.size() * k);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t kk = 0; kk < k; ++kk) a[i * k + kk] = ops::LoadElement(node.a, rows[i], kk);
  }
  std::vector<double> acc(rows.size() * n), magnitude(rows.size() * n), b_row(k);
  for (int64_t col = 0; col < n; ++col) {
    for (int64_t kk = 0; kk < k; ++kk) b_row[kk] = ops::LoadElement(node.b, col, kk);
    const double bias = node.epilogue.bias ? ops::LoadElement(*node.epilogue.bias, 0, col) : 0.0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const double* a_row = &a[i * k];
      double sum[4] = {0, 0, 0, 0}, abs_sum[4] = {0, 0, 0, 0};
      int64_t kk = 0;
      for (; kk + 4 <= k; kk += 4) {
        for (int lane = 0; lane < 4; ++lane) {
          const double product = a_row[kk + lane] * b_row[kk + lane];
          sum[lane] += product;
          abs_sum[lane] += std::fabs(product);
        }
      }
      for (; kk < k; ++kk) {
        sum[0] += a_row[kk] * b_row[kk];
        abs_sum[0] += std::fabs(a_row[kk] * b_row[kk]);
      }
      acc[i * n + col] = sum[0] + sum[1] + sum[2] + sum[3] + bias;
      magnitude[i * n + col] = abs_sum[0] + abs_sum[1] + abs_sum[2] + abs_sum[3] + std::fabs(bias);
    }
  }

  const double accumulate_slack = 4.0 * std::sqrt(static_cast<double>(k)) * std::ldexp(1.0, -24);
  auto accumulator_tolerance = [&](size_t index) {
    return std::ldexp(std::fabs(acc[index]), -8) + accumulate_slack * magnitude[index];
  };

  int64_t mismatches = 0;
  std::string first_mismatch;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t j = 0; j < out_cols; ++j) {
      double expected = 0, tolerance = 0;
      if (node.epilogue.activation == Activation::kSwiGLU) {
        const size_t gate_index = i * n + 2 * j, up_index = gate_index + 1;
        const double gate = acc[gate_index], up = acc[up_index];
        const double silu_gate = gate / (1.0 + std::exp(-gate));
        const double gate_tol = accumulator_tolerance(gate_index);
        const double up_tol = accumulator_tolerance(up_index);
        expected = silu_gate * up;
        tolerance =
            1.13 * gate_tol * std::fabs(up) + std::fabs(silu_gate) * up_tol + gate_tol * up_tol;
      } else {
        const size_t index = i * n + j;
        expected = Activate(node.epilogue.activation, acc[index]);
        tolerance = 1.13 * accumulator_tolerance(index);
      }
      if (node.epilogue.residual) {
        const double residual = ops::LoadElement(*node.epilogue.residual, rows[i], j);
        expected += residual;
        tolerance += std::ldexp(std::fabs(residual), -24);
      }
      tolerance += ops::RoundingErrorBound(node.c.dtype, expected);  // the output's rounding
      const double got = ops::LoadElement(node.c, rows[i], j);
      ++*checked;
      if (!(std::fabs(got - expected) <= tolerance)) {  // NaN (unwritten) fails too
        if (mismatches++ == 0) {
          first_mismatch = absl::StrFormat("%s[%d, %d] = %.6g, expected %.6g +- %.3g", node.c.name,
                                           rows[i], j, got, expected, tolerance);
        }
      }
    }
  }
  if (mismatches > 0) {
    return absl::InternalError(absl::StrFormat(
        "node \"%s\": %d of %d checked elements (%d rows) out of tolerance; first: %s", node.name,
        mismatches, static_cast<int64_t>(rows.size()) * out_cols, rows.size(), first_mismatch));
  }
  return absl::OkStatus();
}

// Checks every node of `graph` (host views). Prints a one-line verdict.
absl::Status CheckGraph(const GemmGraph& graph, int64_t max_rows, std::string_view against) {
  if (max_rows <= 0) {
    std::cout << "check: skipped (--check_rows=0)\n";
    return absl::OkStatus();
  }
  int64_t checked = 0;
  for (const GemmNode& node : graph.nodes()) {
    LOOM_RETURN_IF_ERROR(CheckNode(node, max_rows, &checked));
  }
  std::cout << absl::StrFormat(
      "check: OK, %d elements (up to %d rows of each of %d nodes) match %s within tolerance\n",
      checked, max_rows, graph.size(), against);
  return absl::OkStatus();
}

// --- Reporting. ---

void PrintGraph(const DemoGraph& demo, const GemmGraph& graph) {
  std::cout << demo.title << "\n";
  for (const GemmNode& node : graph.nodes()) {
    std::cout << absl::StrFormat(
        "  node %-10s %s[%d, %d] x %s[%d, %d]^T -> %s[%d, %d]  %s%s\n", node.name, node.a.name,
        node.a.rows, node.a.cols, node.b.name, node.b.rows, node.b.cols, node.c.name, node.c.rows,
        node.c.cols, ActivationName(node.epilogue.activation),
        node.epilogue.residual ? absl::StrCat(" + residual ", node.epilogue.residual->name)
                               : std::string());
  }
}

void PrintExplain(const Plan& plan, const GemmGraph& graph) {
  std::cout << "--- plan ---\n" << plan.Explain() << "\n--- dependencies ---\n";
  const std::vector<DataDependency> dependencies = graph.Dependencies();
  if (dependencies.empty()) std::cout << "  (none: every node is independent)\n";
  for (const DataDependency& dep : dependencies) {
    const GemmNode& consumer = graph.nodes()[dep.consumer];
    const GemmNode& producer = graph.nodes()[dep.producer];
    std::cout << absl::StrFormat("  %s waits on %s: operand %s reads %s", consumer.name,
                                 producer.name, OperandName(dep.operand), producer.c.name);
    if (dep.whole_tensor) {
      std::cout << " (whole tensor)\n";
    } else {
      std::cout << absl::StrFormat(" (offset rows %+d, cols %+d)\n", dep.row_offset,
                                   dep.col_offset);
    }
  }
  std::cout << "---\n";
}

// Prints a checksum and a few values of each result matrix.
void PrintResults(const DemoGraph& demo, HostMatrices& host) {
  for (const std::string& name : demo.results) {
    const TensorView view = host.View(name);
    double checksum = 0;
    for (int64_t r = 0; r < view.rows; ++r) {
      for (int64_t c = 0; c < view.cols; ++c) checksum += ops::LoadElement(view, r, c);
    }
    std::cout << absl::StrFormat("%s: checksum (sum of all %d elements) = %.6f\n", name,
                                 view.rows * view.cols, checksum);
    std::vector<int64_t> rows_to_print = {0};
    if (view.rows > 1) rows_to_print.push_back(view.rows - 1);
    for (int64_t r : rows_to_print) {
      std::string values;
      for (int64_t c = 0; c < std::min<int64_t>(view.cols, 6); ++c) {
        absl::StrAppendFormat(&values, "%s%.5f", c == 0 ? "" : ", ", ops::LoadElement(view, r, c));
      }
      std::cout << absl::StrFormat("  %s[%d, 0:%d] = [%s%s]\n", name, r,
                                   std::min<int64_t>(view.cols, 6), values,
                                   view.cols > 6 ? ", ..." : "");
    }
  }
}

uint64_t ResolveSeed() {
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) {
    std::random_device device;
    seed = (static_cast<uint64_t>(device()) << 32) ^ device();
    if (seed == 0) seed = 1;
  }
  return seed;
}

double GemmFlops(const GemmGraph& graph) {
  double flops = 0;
  for (const GemmNode& node : graph.nodes()) {
    flops += 2.0 * static_cast<double>(node.m()) * static_cast<double>(node.n()) *
             static_cast<double>(node.k());
  }
  return flops;
}

double WeightBytes(const GemmGraph& graph) {
  double bytes = 0;
  for (const GemmNode& node : graph.nodes()) {
    bytes += static_cast<double>(node.b.rows) * static_cast<double>(node.b.cols) *
             static_cast<double>(node.b.element_size());
  }
  return bytes;
}

absl::Status RunOnCpu(const DemoGraph& demo, uint64_t seed) {
  HostMatrices host(demo.matrices, seed);
  const GemmGraph graph = demo.build([&](std::string_view name) { return host.View(name); });
  PrintGraph(demo, graph);
  std::cout << absl::StrFormat("%s; seed: %d (rerun with --seed=%d)\n", DTypeName(MatrixType()), seed, seed);

  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  LOOM_ASSIGN_OR_RETURN(const Plan plan, runtime.Compile(graph, DemoOptions()));
  if (absl::GetFlag(FLAGS_explain)) PrintExplain(plan, graph);

  const auto start = std::chrono::steady_clock::now();
  LOOM_RETURN_IF_ERROR(RunReference(plan));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << absl::StrFormat("CPU reference executor: %d jobs of %d nodes in %.3f s\n",
                               plan.schedule().queue.size(), graph.size(), seconds);
  PrintResults(demo, host);
  return CheckGraph(graph, absl::GetFlag(FLAGS_check_rows), "a naive per-node loop");
}

absl::Status RunOnGpu(const Runtime& runtime, const DemoGraph& demo, uint64_t seed) {
  HostMatrices host(demo.matrices, seed);
  DeviceMatrices device;
  LOOM_RETURN_IF_ERROR(device.Upload(host));
  const GemmGraph host_graph = demo.build([&](std::string_view name) { return host.View(name); });
  const GemmGraph device_graph =
      demo.build([&](std::string_view name) { return device.View(name); });
  PrintGraph(demo, device_graph);
  std::cout << absl::StrFormat("device: %s, %d SMs; %s; seed: %d (rerun with --seed=%d)\n",
                               runtime.device().name, runtime.device().sm_count, DTypeName(MatrixType()), seed,
                               seed);

  LOOM_ASSIGN_OR_RETURN(Plan plan, runtime.Compile(device_graph, DemoOptions()));
  std::cout << absl::StrFormat("plan: %d jobs, %s kernel, %d clusters of %d CTAs\n",
                               plan.schedule().queue.size(), AbslUnparseFlag(plan.kernel()),
                               plan.grid_clusters(), plan.schedule().cluster_size);
  if (absl::GetFlag(FLAGS_explain)) PrintExplain(plan, device_graph);

  cudaStream_t stream = nullptr;
  LOOM_RETURN_IF_ERROR(CudaStatus(cudaStreamCreate(&stream), "cudaStreamCreate"));
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_owner(
      stream, [](cudaStream_t s) { cudaStreamDestroy(s); });

  // One launch, then the check of every node on host copies.
  LOOM_RETURN_IF_ERROR(plan.Launch(stream));
  LOOM_RETURN_IF_ERROR(plan.Synchronize(stream));
  LOOM_RETURN_IF_ERROR(device.DownloadProduced(host));
  PrintResults(demo, host);
  LOOM_RETURN_IF_ERROR(CheckGraph(host_graph, absl::GetFlag(FLAGS_check_rows),
                                  "a CPU computation (FP64) on host copies"));

  // Timing: warm-up, then one event pair around each launch; the median.
  const int iters = absl::GetFlag(FLAGS_iters);
  if (iters <= 0) return absl::OkStatus();
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events(iters, {nullptr, nullptr});
  auto destroy_events = [&] {
    for (auto& [begin, end] : events) {
      if (begin) cudaEventDestroy(begin);
      if (end) cudaEventDestroy(end);
    }
  };
  absl::Status status = [&]() -> absl::Status {
    for (auto& [begin, end] : events) {
      LOOM_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&begin), "cudaEventCreate"));
      LOOM_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&end), "cudaEventCreate"));
    }
    for (int i = 0; i < 3; ++i) LOOM_RETURN_IF_ERROR(plan.Launch(stream));
    for (auto& [begin, end] : events) {
      LOOM_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(begin, stream), "cudaEventRecord"));
      LOOM_RETURN_IF_ERROR(plan.Launch(stream));
      LOOM_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(end, stream), "cudaEventRecord"));
    }
    LOOM_RETURN_IF_ERROR(plan.Synchronize(stream));
    std::vector<float> milliseconds;
    for (auto& [begin, end] : events) {
      float ms = 0;
      LOOM_RETURN_IF_ERROR(
          CudaStatus(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime"));
      milliseconds.push_back(ms);
    }
    std::sort(milliseconds.begin(), milliseconds.end());
    const double median_s = milliseconds[milliseconds.size() / 2] * 1e-3;
    std::cout << absl::StrFormat(
        "latency: %.1f us (median of %d launches); %.1f TF/s; %.0f GB/s of weights\n",
        median_s * 1e6, iters, GemmFlops(device_graph) / median_s * 1e-12,
        WeightBytes(device_graph) / median_s * 1e-9);
    return absl::OkStatus();
  }();
  destroy_events();
  LOOM_RETURN_IF_ERROR(status);

  // Every replay computes the same bits as the first run.
  std::map<std::string, std::vector<uint16_t>> first_run;
  for (const std::string& name : demo.results) first_run[name] = host.Bits(name);
  LOOM_RETURN_IF_ERROR(device.DownloadProduced(host));
  for (const std::string& name : demo.results) {
    if (host.Bits(name) != first_run[name]) {
      return absl::InternalError(absl::StrFormat(
          "%s after %d replays differs from the first run's bits", name, iters + 3));
    }
  }
  std::cout << absl::StrFormat("replays: %d launches reproduced the first run bit for bit\n",
                               iters + 3);
  return absl::OkStatus();
}

}  // namespace

Target ChooseTarget() {
  Target target;
  if (absl::GetFlag(FLAGS_cpu)) {
    std::cout << "--cpu: running the CPU reference at a reduced size "
                 "(size flags given explicitly are kept)\n";
    return target;
  }
  absl::StatusOr<Runtime> runtime = Runtime::Create(0);
  if (!runtime.ok()) {
    std::cout << "no GPU found (" << runtime.status().message()
              << "): running the CPU reference at a reduced size\n";
    return target;
  }
  target.gpu.emplace(*std::move(runtime));
  return target;
}

int64_t ResolveSize(const std::optional<int64_t>& flag, int64_t gpu_default, int64_t cpu_default,
                    const Target& target) {
  if (flag.has_value()) return *flag;
  return target.use_gpu() ? gpu_default : cpu_default;
}

absl::Status CheckPositive(std::string_view flag_name, int64_t value, int64_t at_most, std::string_view limit) {
  if (value < 1) return absl::InvalidArgumentError(absl::StrFormat("--%s=%d: must be at least 1", flag_name, value));
  if (value > at_most) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s=%d: must be at most %d (%s)", flag_name, value, at_most, limit));
  }
  return absl::OkStatus();
}

absl::Status RunDemo(const Target& target, const DemoGraph& demo) {
  for (auto [name, value] : {std::pair{"check_rows", absl::GetFlag(FLAGS_check_rows)},
                             std::pair{"iters", int64_t{absl::GetFlag(FLAGS_iters)}}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("--%s=%d: must not be negative", name, value));
    }
  }
  if (const std::string dtype = absl::GetFlag(FLAGS_dtype); dtype != "bf16" && dtype != "fp16") {
    return absl::InvalidArgumentError(absl::StrFormat("--dtype=%s: must be bf16 or fp16", dtype));
  }
  // A size flag that makes a matrix past 2^39 elements (1 TiB of bf16), or
  // whose element count overflows, is refused by name before anything is
  // allocated; host memory that runs out below that is ResourceExhausted.
  constexpr int64_t kMaxElements = int64_t{1} << 39;
  for (const MatrixSpec& matrix : demo.matrices) {
    int64_t elements = 0;
    if (__builtin_mul_overflow(matrix.rows, matrix.cols, &elements) || elements > kMaxElements) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %d x %d elements, past the %d a demo matrix may have (check the size flags)", matrix.name,
          matrix.rows, matrix.cols, kMaxElements));
    }
  }
  const uint64_t seed = ResolveSeed();
  try {
    if (target.use_gpu()) return RunOnGpu(*target.gpu, demo, seed);
    return RunOnCpu(demo, seed);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: the host memory for its matrices ran out (check the size flags)", demo.title));
  }
}

int Finish(const absl::Status& status) {
  if (status.ok()) return 0;
  std::cerr << "error: " << status << "\n";
  return 1;
}

void ListDemoFlagsInHelp() {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) { return absl::StrContains(file, "demos/"); };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace loom::demo
