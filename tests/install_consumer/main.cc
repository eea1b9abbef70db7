// A user program built against an installed loom: describes a one-node
// GemmGraph over fake (never dereferenced) device pointers, lowers it for a
// described H200 (no GPU needed) and prints the plan. run_install_test.cmake
// checks the output.
#include <cstdint>
#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/graph.h"
#include "loom/runtime.h"
#include "loom/status.h"
#include "loom/tensor.h"

namespace {

// Fake, 16-byte aligned device addresses: lowering never dereferences them.
void* FakeDevicePointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

absl::StatusOr<std::string> ExplainOneGemm() {
  constexpr int64_t kTokens = 128, kIn = 512, kOut = 256;
  loom::TensorView x =
      loom::TensorView::Dense("x", FakeDevicePointer(0x100000), loom::DType::kBF16, kTokens, kIn);
  loom::TensorView w =
      loom::TensorView::Dense("w", FakeDevicePointer(0x200000), loom::DType::kBF16, kOut, kIn);
  loom::TensorView y =
      loom::TensorView::Dense("y", FakeDevicePointer(0x300000), loom::DType::kBF16, kTokens, kOut);
  loom::GemmGraph graph;
  graph.AddGemm("consumer_proj", x, w, y);
  LOOM_RETURN_IF_ERROR(graph.Validate());

  loom::Runtime runtime = loom::Runtime::ForDescription(loom::DeviceDescription::H200());
  LOOM_ASSIGN_OR_RETURN(loom::Plan plan, runtime.Compile(graph));
  return plan.Explain();
}

}  // namespace

int main() {
  absl::StatusOr<std::string> explained = ExplainOneGemm();
  if (!explained.ok()) {
    std::cerr << "install consumer: " << explained.status() << "\n";
    return 1;
  }
  std::cout << *explained << "\n";
  std::cout << "loom install consumer: OK\n";
  return 0;
}
