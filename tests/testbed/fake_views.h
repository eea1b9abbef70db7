// fake_views.h: tensor addresses and epilogues for the CPU tests of the graph
// (validation, dependency analysis, TensorView's sub-views), which read a
// view's address, shape and strides and never dereference it.
#ifndef LOOM_TESTS_TESTBED_FAKE_VIEWS_H_
#define LOOM_TESTS_TESTBED_FAKE_VIEWS_H_

#include <cstdint>
#include <utility>

#include "loom/graph.h"
#include "loom/tensor.h"

namespace loom::testbed {

// A fake device address: tests space their tensors' regions far enough apart
// that two never meet unless the test means them to.
inline void* At(uintptr_t address) { return reinterpret_cast<void*>(address); }

// Epilogues, spelled out: GCC 12's -Wextra warns about designated initialisers
// that leave out Epilogue's optional members.
inline Epilogue WithActivation(Activation activation) {
  Epilogue epilogue;
  epilogue.activation = activation;
  return epilogue;
}
inline Epilogue WithBias(TensorView bias) {
  Epilogue epilogue;
  epilogue.bias = std::move(bias);
  return epilogue;
}
inline Epilogue WithResidual(TensorView residual) {
  Epilogue epilogue;
  epilogue.residual = std::move(residual);
  return epilogue;
}
inline Epilogue WithBiasAndResidual(TensorView bias, TensorView residual) {
  Epilogue epilogue;
  epilogue.bias = std::move(bias);
  epilogue.residual = std::move(residual);
  return epilogue;
}

}  // namespace loom::testbed

#endif  // LOOM_TESTS_TESTBED_FAKE_VIEWS_H_
