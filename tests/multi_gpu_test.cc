// multi_gpu_test.cc: a second GPU (Runtime::Create(1)): plans there beside
// plans on device 0, each launched and synchronized with its own device
// current (Plan::Launch refuses any other), and plans and views across the
// two devices' memory.
//
// Its own binary so that ctest says whether these ran: built with
// LOOM_GPU_TEST_DEVICES=2 (tests/CMakeLists.txt), its main
// (gpu_test_main.cc) runs no case on a machine with fewer than two Hopper
// GPUs, says why and exits 77, which ctest lists as Skipped. (Inside
// graph_gpu_test they skipped case by case, and the binary still showed as
// Passed.)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gpu_graph_helpers.h"
#include "gpu_harness.h"
#include "gtest/gtest.h"
#include "internal/testing_hooks.h"  // runtime/internal
#include "loom/runtime.h"

namespace loom::testbed {
namespace {

// Makes `device` current for a scope; device 0 (every other test's) after it.
class OnDevice {
 public:
  explicit OnDevice(int device) : error_(cudaSetDevice(device)) {}
  ~OnDevice() { cudaSetDevice(0); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  cudaError_t error() const { return error_; }

 private:
  cudaError_t error_;
};

// The MLP block on both GPUs from the same data, the two kernels running at
// once on a stream of each device: each node must match the reference on
// both, the two must write the same bits where their plans are the same
// (same GPU model, same schedule), and a replay on device 1 must repeat its
// first launch. Each plan's Launch is refused while the other device is
// current, and onto the other device's stream, and compiling for device 1
// leaves the caller's device current.
// Param: the block's kernel path ("narrow_packed" 16 tokens; "tiled" 300;
// "tiled_split4" 128 tokens, every node split in four: workspace, reduce).
class SecondGpuTest : public ::testing::TestWithParam<std::string> {};
TEST_P(SecondGpuTest, PlansOnBothGpusAtOnceMatchTheReference) {
  CompileOptions options;
  int64_t tokens = 300;
  if (GetParam() == "narrow_packed") {
    tokens = 16;
    options.kernel = KernelChoice::kNarrow;
    options.pack_weights = true;
  } else if (GetParam() == "tiled_split4") {
    tokens = 128;
    options = WideTiledOptions();
    options.split_k = 4;
  }
  Rng rng;
  Rng same(rng.seed());
  absl::StatusOr<Runtime> runtime1 = Runtime::Create(1);
  LOOM_ASSERT_OK(runtime1.status());

  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  GpuHarness on0;
  AddMlpBlock(on0, rng, tokens);
  LOOM_ASSERT_OK(on0.Prepare(TestRuntime(), options));
  Stream stream0;
  ASSERT_EQ(stream0.error(), cudaSuccess) << cudaGetErrorName(stream0.error());
  {
    const OnDevice device1(1);
    ASSERT_EQ(device1.error(), cudaSuccess) << cudaGetErrorName(device1.error());
    GpuHarness on1;  // its buffers on device 1
    AddMlpBlock(on1, same, tokens);
    LOOM_ASSERT_OK(on1.Prepare(*runtime1, options));
    ASSERT_EQ(on1.plan().kernel(), on0.plan().kernel());
    Stream stream1;
    ASSERT_EQ(stream1.error(), cudaSuccess) << cudaGetErrorName(stream1.error());

    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    LOOM_ASSERT_OK(on0.LaunchOn(stream0.get()));
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    LOOM_ASSERT_OK(on1.LaunchOn(stream1.get()));
    LOOM_ASSERT_OK(on1.FinishOn(stream1.get()));
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    LOOM_ASSERT_OK(on0.FinishOn(stream0.get()));
    {
      SCOPED_TRACE("device 0");
      on0.ExpectEachNodeMatchesReference();
    }
    {
      SCOPED_TRACE("device 1");
      on1.ExpectEachNodeMatchesReference();
    }
    if (on0.plan().Explain() == on1.plan().Explain()) {
      EXPECT_TRUE(TakeSnapshot(on0) == TakeSnapshot(on1)) << "the same plan wrote different bits on the two GPUs";
    } else {
      std::printf("[ loom     ] the two GPUs' plans differ; their outputs were each checked, not compared\n");
    }

    // Device 0 is current: device 1's plan is refused, and compiling for
    // device 1 does not move the caller there.
    const absl::Status refused = on1.plan().Launch(stream0.get());
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), "compiled for device 1")) << refused;
    {
      const absl::StatusOr<Plan> again = runtime1->Compile(on1.plan().graph(), options);
      LOOM_ASSERT_OK(again.status());
      int current = -1;
      ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
      EXPECT_EQ(current, 0);
    }  // destroyed with device 0 current
    // Device 0's plan onto device 1's stream: CUDA refuses the launch, and
    // the error says whose stream it was.
    const absl::Status wrong_stream = on0.plan().Launch(stream1.get());
    EXPECT_EQ(wrong_stream.code(), absl::StatusCode::kInvalidArgument) << wrong_stream;
    EXPECT_TRUE(absl::StrContains(wrong_stream.message(), "the stream belongs to device 1")) << wrong_stream;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);

    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    const absl::Status refused0 = on0.plan().Launch(stream1.get());
    EXPECT_EQ(refused0.code(), absl::StatusCode::kFailedPrecondition) << refused0;
    EXPECT_TRUE(absl::StrContains(refused0.message(), "compiled for device 0")) << refused0;
    EXPECT_TRUE(ReplayIsBitIdentical(on1));
  }
}
INSTANTIATE_TEST_SUITE_P(Kernels, SecondGpuTest, ::testing::Values("narrow_packed", "tiled", "tiled_split4"),
                         [](const auto& info) { return info.param; });

// Plans of device 1 destroyed while device 0 is current (Plan::Impl frees on
// the plan's device): 500 compiled, launched and destroyed that way must give
// back every allocation (loom's count: each free succeeded) and leave device
// 1's free memory exactly where it was, as PlanMemoryTest asks of plans on
// one device; the last launch's outputs must still be right.
TEST(SecondGpuMemoryTest, PlansFreedWithTheOtherDeviceCurrent) {
  constexpr int kRounds = 500;
  absl::StatusOr<Runtime> runtime1 = Runtime::Create(1);
  LOOM_ASSERT_OK(runtime1.status());
  const OnDevice device1(1);
  ASSERT_EQ(device1.error(), cudaSuccess) << cudaGetErrorName(device1.error());
  Rng rng;
  GpuHarness h;
  AddMlpBlock(h, rng, 16);
  CompileOptions options = WideTiledOptions();
  options.split_k = 4;  // a workspace to free too
  LOOM_ASSERT_OK(h.Run(*runtime1, options));
  auto round = [&]() -> absl::Status {
    std::optional<Plan> plan;
    {
      absl::StatusOr<Plan> compiled = runtime1->Compile(h.plan().graph(), options);
      if (!compiled.ok()) return compiled.status();
      plan.emplace(std::move(*compiled));
    }
    if (absl::Status s = plan->Launch(nullptr); !s.ok()) return s;
    if (absl::Status s = plan->Synchronize(nullptr); !s.ok()) return s;
    if (cudaSetDevice(0) != cudaSuccess) return absl::InternalError("cudaSetDevice(0)");
    plan.reset();
    if (cudaSetDevice(1) != cudaSuccess) return absl::InternalError("cudaSetDevice(1)");
    return absl::OkStatus();
  };
  LOOM_ASSERT_OK(round());  // warm-up
  const int64_t live_before = internal::LiveAllocationsForTesting();
  const FreeMemory free = FreeMemoryAround(absl::StrCat(kRounds, " plans on device 1"), [&] {
    for (int i = 0; i < kRounds; ++i) LOOM_ASSERT_OK(round());
  });
  if (HasFailure()) return;
  EXPECT_EQ(internal::LiveAllocationsForTesting(), live_before)
      << "allocations left behind by " << kRounds << " plans on device 1";
  EXPECT_EQ(free.lost(), 0) << "device 1 lost " << free.lost() << " bytes over " << kRounds << " plans";
  // One more plan after them, on re-poisoned outputs, is still right.
  LOOM_ASSERT_OK(h.PoisonDeviceOutputs());
  LOOM_ASSERT_OK(round());
  LOOM_ASSERT_OK(h.CopyOutputsBack());
  h.ExpectEachNodeMatchesReference();
}

// A view in device 1's memory, in a plan for device 0: refused by name until
// device 0 has peer access to device 1 (a launch would fault the context),
// accepted once it has, where the two GPUs can reach each other, and then
// run: x and w zero, y poisoned, y must come back zero.
TEST(SecondGpuMemoryTest, ViewsOnTheOtherDeviceNeedPeerAccess) {
  constexpr int64_t kM = 64, kN = 128, kK = 64;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  if (cudaDeviceDisablePeerAccess(1) != cudaSuccess) cudaGetLastError();  // not enabled: nothing to undo
  absl::StatusOr<DeviceBuffer> w = DeviceBuffer::Allocate(kN * kK * 2);
  LOOM_ASSERT_OK(w.status());
  absl::StatusOr<DeviceBuffer> y = DeviceBuffer::Allocate(kM * kN * 2);
  LOOM_ASSERT_OK(y.status());
  absl::StatusOr<DeviceBuffer> x = absl::UnknownError("not allocated");
  {
    const OnDevice device1(1);
    ASSERT_EQ(device1.error(), cudaSuccess) << cudaGetErrorName(device1.error());
    x = DeviceBuffer::Allocate(kM * kK * 2);
    LOOM_ASSERT_OK(x.status());
    ASSERT_EQ(cudaMemset(x->data(), 0, kM * kK * 2), cudaSuccess);
  }
  ASSERT_EQ(cudaMemset(w->data(), 0, kN * kK * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(y->data(), 0xFF, kM * kN * 2), cudaSuccess);
  GemmGraph g;
  g.AddGemm("proj", TensorView::Dense("x", x->data(), DType::kBF16, kM, kK),
            TensorView::Dense("w", w->data(), DType::kBF16, kN, kK),
            TensorView::Dense("y", y->data(), DType::kBF16, kM, kN));
  const absl::StatusOr<Plan> refused = TestRuntime().Compile(g, CompileOptions{});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "node \"proj\": A \"x\" [0x")) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "is memory of device 1 that device 0 has no access to"))
      << refused.status();
  int can_access = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can_access, 0, 1), cudaSuccess);
  if (can_access != 0) {
    ASSERT_EQ(cudaDeviceEnablePeerAccess(1, 0), cudaSuccess);
    {
      absl::StatusOr<Plan> accepted = TestRuntime().Compile(g, CompileOptions{});
      LOOM_ASSERT_OK(accepted.status());
      LOOM_ASSERT_OK(accepted->Launch(nullptr));
      LOOM_ASSERT_OK(accepted->Synchronize(nullptr));
      std::vector<uint16_t> out(kM * kN, 0xFFFF);
      ASSERT_EQ(cudaMemcpy(out.data(), y->data(), kM * kN * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(std::count(out.begin(), out.end(), uint16_t{0}), kM * kN) << "y = x · wᵀ of zeros is not zero";
    }
    EXPECT_EQ(cudaDeviceDisablePeerAccess(1), cudaSuccess);
  } else {
    std::printf("[ loom     ] devices 0 and 1 cannot reach each other: only the refusal was checked\n");
  }
  const OnDevice device1(1);  // x freed on its own device
  x = absl::UnknownError("freed");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace loom::testbed
