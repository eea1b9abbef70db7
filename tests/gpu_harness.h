// gpu_harness.h: runs one GemmGraph twice, on the GPU (a Plan) and on the CPU
// (RunNaiveGraph), from the same host tensors, and compares node by node.
//
//   GpuHarness h;
//   h.Input("x", DType::kBF16, m, k, rng);  h.Input("w", DType::kBF16, n, k, rng);
//   h.Output("y", DType::kBF16, m, n);
//   h.Build([&](auto t, GemmGraph& g) { g.AddGemm("gemm", t("x"), t("w"), t("y")); });
//   ASSERT_TRUE(h.Run(runtime).ok());
//   h.ExpectMatchesReference();
//
// For graphs whose nodes feed each other, ExpectEachNodeMatchesReference
// checks each node against the reference computed from the inputs the GPU
// gave it. Prepare / LaunchOn / FinishOn split Run for tests that launch on
// their own streams; Replay re-poisons the outputs and launches the Plan again,
// and ReplayIsBitIdentical checks that it wrote the same bits.
#ifndef LOOM_TESTS_GPU_HARNESS_H_
#define LOOM_TESTS_GPU_HARNESS_H_

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "loom/reference.h"
#include "loom/runtime.h"
#include "testbed/testbed.h"

#define LOOM_ASSERT_OK(expr)                     \
  do {                                           \
    const ::absl::Status loom_status_ = (expr);  \
    ASSERT_TRUE(loom_status_.ok()) << loom_status_; \
  } while (false)

namespace loom::testbed {

class GpuHarness {
 public:
  using ViewOf = std::function<TensorView(const std::string&)>;
  using GraphBuilder = std::function<void(const ViewOf&, GemmGraph&)>;

  // Row strides default to the smallest multiple of 16 bytes (TMA's rule),
  // so ragged shapes get padded rows whose padding the guards check too.
  static int64_t PaddedStride(DType dtype, int64_t cols) {
    const int64_t per_16_bytes = 16 / static_cast<int64_t>(DTypeSize(dtype));
    return std::max<int64_t>(1, (cols + per_16_bytes - 1) / per_16_bytes * per_16_bytes);
  }

  void Input(const std::string& name, DType dtype, int64_t rows, int64_t cols, Rng& rng,
             bool integers = false) {
    TensorView view = host_.Add(name, dtype, rows, cols, PaddedStride(dtype, cols));
    if (integers) {
      FillIntegers(view, rng);
    } else {
      FillRandom(view, rng);
    }
  }
  // An output's guard bands span kOutputGuardRows rows (at least the default
  // 256 bytes), before and after: a store that misses its row mask writes at
  // most a tile's rows past the last one (128), and a band of one row's bytes
  // would see only the first 256 bytes of the row after.
  static constexpr int64_t kOutputGuardRows = 128;
  void Output(const std::string& name, DType dtype, int64_t rows, int64_t cols) {
    const int64_t stride = PaddedStride(dtype, cols);
    const int64_t guard = std::max<int64_t>(HostMatrix::kDefaultGuardBytes,
                                            kOutputGuardRows * stride * static_cast<int64_t>(DTypeSize(dtype)));
    host_.Add(name, dtype, rows, cols, stride, guard);
    outputs_.push_back(name);
  }
  void Build(GraphBuilder builder) { builder_ = std::move(builder); }

  // Copies inputs (and poisoned outputs) to the device, compiles and launches
  // the graph once, copies every output back (guard bands included, so
  // CheckGuards sees stray writes). A test that wants more launches checks
  // this one, then replays (ReplayIsBitIdentical). Not several launches
  // here: only the last would be compared, and re-poisoning the outputs
  // copies the host's allocation, guards included, over the device's, so a
  // launch not copied back first would have its stray writes erased unseen.
  absl::Status Run(const Runtime& runtime, const CompileOptions& options = {}) {
    if (absl::Status s = Prepare(runtime, options); !s.ok()) return s;
    if (absl::Status s = plan_->Launch(nullptr); !s.ok()) return s;
    if (absl::Status s = plan_->Synchronize(nullptr); !s.ok()) return s;
    return CopyOutputsBack();
  }

  // Run in steps, for tests that drive the launches themselves (on their own
  // streams, say):
  //   Prepare: copies inputs and poisoned outputs to the device, compiles the
  //     Plan, then waits for the whole device. NOTE: the copies (pageable
  //     cudaMemcpy) and the Plan's set-up (cudaMemset of its flags) run on the
  //     legacy default stream and may return before the data lands; a
  //     cudaStreamNonBlocking stream is not ordered after them, hence the wait.
  //   LaunchOn: enqueues one launch on `stream` and returns without waiting.
  //   FinishOn: waits for `stream` (a device time-out becomes DeadlineExceeded)
  //     and copies every output back.
  //   PoisonDeviceOutputs: re-poisons the outputs on the device (then waits for
  //     the device, as Prepare does), so a replay must write every element again.
  //   Replay: PoisonDeviceOutputs, one launch on the null stream, FinishOn.
  absl::Status Prepare(const Runtime& runtime, const CompileOptions& options = {}) {
    for (const std::string& name : outputs_) Poison(host_[name]);
    for (const auto& [name, matrix] : host_.all()) {
      absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::CopyOf(*matrix);
      if (!buffer.ok()) return buffer.status();
      device_[name] = std::make_unique<DeviceBuffer>(std::move(*buffer));
    }
    device_graph_ = GemmGraph();
    builder_([&](const std::string& name) { return device_.at(name)->view(name); }, device_graph_);
    absl::StatusOr<Plan> plan = runtime.Compile(device_graph_, options);
    if (!plan.ok()) return plan.status();
    plan_ = std::make_unique<Plan>(std::move(*plan));
    return SynchronizeDevice();
  }
  absl::Status LaunchOn(cudaStream_t stream) { return plan_->Launch(stream); }
  absl::Status FinishOn(cudaStream_t stream) {
    if (absl::Status s = plan_->Synchronize(stream); !s.ok()) return s;
    return CopyOutputsBack();
  }
  absl::Status PoisonDeviceOutputs() {
    for (const std::string& name : outputs_) {
      Poison(host_[name]);
      if (absl::Status s = device_.at(name)->CopyFrom(host_[name]); !s.ok()) return s;
    }
    return SynchronizeDevice();
  }
  absl::Status Replay() {
    if (absl::Status s = PoisonDeviceOutputs(); !s.ok()) return s;
    if (absl::Status s = LaunchOn(nullptr); !s.ok()) return s;
    return FinishOn(nullptr);
  }

  absl::Status CopyOutputsBack() {
    for (const std::string& name : outputs_) {
      if (absl::Status s = device_.at(name)->CopyTo(host_[name]); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // The CPU reference on the same host inputs, into fresh copies of the outputs.
  void ExpectMatchesReference(bool exact = false) {
    HostTensors reference;
    for (const auto& [name, matrix] : host_.all()) {
      TensorView view = reference.Add(name, matrix->dtype(), matrix->rows(), matrix->cols(), matrix->row_stride());
      if (!IsOutput(name)) {
        std::memcpy(view.data, matrix->data(), matrix->body_bytes());
      }
    }
    GemmGraph host_graph;
    builder_([&](const std::string& name) { return reference.view(name); }, host_graph);
    ASSERT_TRUE(RunNaiveGraph(host_graph).ok());
    for (const GemmNode& node : host_graph.nodes()) {
      const std::string& out_name = node.c.name;
      SCOPED_TRACE("node " + node.name);
      Tolerance tolerance;
      tolerance.exact = exact;
      if (exact) {
        EXPECT_TRUE(CompareExactly(host_[out_name].view(out_name), reference.view(out_name)));
      } else {
        EXPECT_TRUE(CompareNodeToReference(node, host_[out_name].view(out_name), reference.view(out_name), tolerance));
      }
      EXPECT_TRUE(CheckGuards(host_[out_name], out_name));
    }
    ExpectInputsUntouched();
  }

  // Checks every node on its own: the CPU reference recomputes each node from
  // the inputs the GPU actually gave it (the graph's inputs, and upstream
  // outputs as copied back from the device), then compares with
  // CompareNodeToReference. Unlike ExpectMatchesReference, whose downstream
  // nodes read the reference's own upstream outputs, a one-ulp bf16 rounding
  // difference in an intermediate cannot spread into a false mismatch
  // downstream; a consumer that read unfinished (poisoned or stale) data still
  // fails. A node's C may be a sub-view (Columns, Rows) of a harness tensor.
  // Every Output's guard bands and row padding are checked once.
  void ExpectEachNodeMatchesReference() { ExpectEachNodeMatchesReference(builder_); }
  // The same for another graph over the harness's tensors (a second Plan's,
  // launched on the device buffers), its outputs copied back.
  void ExpectEachNodeMatchesReference(const GraphBuilder& builder) {
    GemmGraph gpu_results;
    builder([&](const std::string& name) { return host_.view(name); }, gpu_results);
    for (const GemmNode& node : gpu_results.nodes()) {
      SCOPED_TRACE("node " + node.name);
      HostMatrix expected(node.c.dtype, node.c.rows, node.c.cols);
      GemmGraph alone;
      alone.AddGemm(node.name, node.a, node.b, expected.view(node.c.name), node.epilogue);
      const absl::Status status = RunNaiveGraph(alone);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(CompareNodeToReference(node, node.c, expected.view(node.c.name)));
    }
    ExpectGuardsAndInputsIntact();
  }
  // The outputs' guard bands and padding (as last copied back), and every
  // input on the device, as they were before the launch.
  void ExpectGuardsAndInputsIntact() { EXPECT_TRUE(GuardsAndInputsIntact()); }
  ::testing::AssertionResult GuardsAndInputsIntact() {
    for (const std::string& name : outputs_) {
      if (::testing::AssertionResult intact = CheckGuards(host_[name], name); !intact) return intact;
    }
    return InputsUntouched();
  }

  // Every buffer that is not an Output (A, B, biases, residuals) is on the
  // device byte for byte as the host copy, guard bands and row padding
  // included: a stray write (a wrong tensor map, an epilogue pointer) shows
  // here even where it changes no output. Checked by both Expect*Reference.
  // `except`: inputs another Plan writes (a test's second graph over the
  // harness's buffers).
  void ExpectInputsUntouched() { EXPECT_TRUE(InputsUntouched()); }
  ::testing::AssertionResult InputsUntouched(const std::vector<std::string>& except = {}) {
    for (const auto& [name, matrix] : host_.all()) {
      if (IsOutput(name) || std::find(except.begin(), except.end(), name) != except.end()) continue;
      HostMatrix copy(matrix->dtype(), matrix->rows(), matrix->cols(), matrix->row_stride(), matrix->guard_bytes());
      if (const absl::Status status = device_.at(name)->CopyTo(copy); !status.ok()) {
        return ::testing::AssertionFailure() << "input \"" << name << "\" could not be copied back: " << status;
      }
      const std::byte* end = matrix->allocation() + matrix->allocation_bytes();
      const std::byte* begin = matrix->allocation();
      const std::byte* changed = std::mismatch(begin, end, copy.allocation()).first;
      if (changed != end) {
        return ::testing::AssertionFailure() << "input \"" << name << "\" changed on the device, first at byte "
                                             << (changed - matrix->data()) << " from its element (0, 0)";
      }
    }
    return ::testing::AssertionSuccess();
  }

  HostMatrix& host(const std::string& name) { return host_[name]; }
  const std::vector<std::string>& outputs() const { return outputs_; }
  Plan& plan() { return *plan_; }
  DeviceBuffer& device(const std::string& name) { return *device_.at(name); }

 private:
  HostTensors host_;
  std::vector<std::string> outputs_;
  std::map<std::string, std::unique_ptr<DeviceBuffer>> device_;
  GraphBuilder builder_;
  GemmGraph device_graph_;
  std::unique_ptr<Plan> plan_;

  bool IsOutput(const std::string& name) const {
    return std::find(outputs_.begin(), outputs_.end(), name) != outputs_.end();
  }

  static absl::Status SynchronizeDevice() {
    const cudaError_t error = cudaDeviceSynchronize();
    if (error == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(std::string("cudaDeviceSynchronize: ") + cudaGetErrorName(error) + ": " +
                               cudaGetErrorString(error));
  }
};

// The runtime of device 0, created once per test binary.
inline const Runtime& TestRuntime() {
  static absl::StatusOr<Runtime>* runtime = new absl::StatusOr<Runtime>(Runtime::Create(0));
  return **runtime;
}

// Options for the tiled kernel on 256-wide tiles: the tests of its split-K,
// reduce, packed-weight and dependency paths, whose shapes were chosen for
// that width's tile counts (CompileOptions::tile_n = 0 would take 128-wide
// tiles at most of these tests' sizes; TileWidth128Test covers those paths).
inline CompileOptions WideTiledOptions() {
  CompileOptions options;
  options.kernel = KernelChoice::kTiled;
  options.tile_n = 256;
  return options;
}

// Every output's bytes (rows at their stride), as last copied back.
using Snapshot = std::map<std::string, std::vector<std::byte>>;

inline Snapshot TakeSnapshot(GpuHarness& h) {
  Snapshot snapshot;
  for (const std::string& name : h.outputs()) {
    const HostMatrix& m = h.host(name);
    snapshot[name].assign(m.data(), m.data() + m.body_bytes());
  }
  return snapshot;
}

inline ::testing::AssertionResult SameBits(GpuHarness& h, const Snapshot& first) {
  for (const std::string& name : h.outputs()) {
    const HostMatrix& m = h.host(name);
    const std::vector<std::byte>& before = first.at(name);
    if (static_cast<int64_t>(before.size()) != m.body_bytes()) {
      return ::testing::AssertionFailure() << "output \"" << name << "\" changed size";
    }
    const auto [first_before, first_now] = std::mismatch(before.begin(), before.end(), m.data());
    if (first_before != before.end()) {
      const int64_t byte = first_before - before.begin();
      const int64_t row_bytes = m.row_stride() * static_cast<int64_t>(DTypeSize(m.dtype()));
      return ::testing::AssertionFailure()
             << "output \"" << name << "\" differs from the first launch (replays must be bit-identical), "
             << "first at row " << byte / row_bytes << ", column "
             << byte % row_bytes / static_cast<int64_t>(DTypeSize(m.dtype()));
    }
  }
  return ::testing::AssertionSuccess();
}

// Replays the Plan with every output re-poisoned on the device; the result
// must equal the previous launch's bit for bit, and the replay must leave the
// outputs' guard bands and padding and every input as they were.
inline ::testing::AssertionResult ReplayIsBitIdentical(GpuHarness& h) {
  const Snapshot first = TakeSnapshot(h);
  if (const absl::Status status = h.Replay(); !status.ok()) {
    return ::testing::AssertionFailure() << "replay failed: " << status;
  }
  if (::testing::AssertionResult same = SameBits(h, first); !same) return same;
  return h.GuardsAndInputsIntact();
}

// The end of a one-node test that launches twice: the first launch against
// the CPU reference (with its guards and inputs), then a replay
// bit-identical to it (with its own).
inline void ExpectMatchesReferenceAndReplayIdentical(GpuHarness& h) {
  h.ExpectMatchesReference();
  EXPECT_TRUE(ReplayIsBitIdentical(h));
}

// The end of most graph tests: every node right, a replay bit-identical to
// the first launch, and the guards and inputs intact after it. A replay that
// writes the first launch's bits is right wherever that launch was, so its
// nodes are compared with the reference again only when it fails (to show
// where).
inline void ExpectNodesRightAndReplayIdentical(GpuHarness& h) {
  h.ExpectEachNodeMatchesReference();
  const ::testing::AssertionResult identical = ReplayIsBitIdentical(h);
  EXPECT_TRUE(identical);
  if (!identical) h.ExpectEachNodeMatchesReference();
}

}  // namespace loom::testbed

#endif  // LOOM_TESTS_GPU_HARNESS_H_
