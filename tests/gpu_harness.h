// gpu_harness.h: runs one GemmGraph twice, on the GPU (a Plan) and on the CPU
// (RunNaiveGraph), from the same host tensors, and compares node by node.
//
//   GpuHarness h;
//   h.Input("x", DType::kBF16, m, k, rng);  h.Input("w", DType::kBF16, n, k, rng);
//   h.Output("y", DType::kBF16, m, n);
//   h.Build([&](auto t, GemmGraph& g) { g.AddGemm("gemm", t("x"), t("w"), t("y")); });
//   ASSERT_TRUE(h.Run(runtime).ok());
//   h.ExpectMatchesReference();
#ifndef LOOM_TESTS_GPU_HARNESS_H_
#define LOOM_TESTS_GPU_HARNESS_H_

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>

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
  void Output(const std::string& name, DType dtype, int64_t rows, int64_t cols) {
    host_.Add(name, dtype, rows, cols, PaddedStride(dtype, cols));
    outputs_.push_back(name);
  }
  void Build(GraphBuilder builder) { builder_ = std::move(builder); }

  // Copies inputs (and poisoned outputs) to the device, compiles and launches
  // the graph `launches` times, copies every output back.
  absl::Status Run(const Runtime& runtime, const CompileOptions& options = {}, int launches = 1) {
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
    for (int i = 0; i < launches; ++i) {
      if (absl::Status s = plan_->Launch(nullptr); !s.ok()) return s;
      if (absl::Status s = plan_->Synchronize(nullptr); !s.ok()) return s;
    }
    return CopyOutputsBack();
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
      bool is_output = std::find(outputs_.begin(), outputs_.end(), name) != outputs_.end();
      if (!is_output) {
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
  }

  HostMatrix& host(const std::string& name) { return host_[name]; }
  Plan& plan() { return *plan_; }
  DeviceBuffer& device(const std::string& name) { return *device_.at(name); }

 private:
  HostTensors host_;
  std::vector<std::string> outputs_;
  std::map<std::string, std::unique_ptr<DeviceBuffer>> device_;
  GraphBuilder builder_;
  GemmGraph device_graph_;
  std::unique_ptr<Plan> plan_;
};

// The runtime of device 0, created once per test binary.
inline const Runtime& TestRuntime() {
  static absl::StatusOr<Runtime>* runtime = new absl::StatusOr<Runtime>(Runtime::Create(0));
  return **runtime;
}

}  // namespace loom::testbed

#endif  // LOOM_TESTS_GPU_HARNESS_H_
