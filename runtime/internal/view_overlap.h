// view_overlap.h (internal): the bytes a view spans, as GemmGraph::Validate
// counts them (graph.cc), and whether two views share a byte (byte ranges,
// then rows under a shared stride, so the two column halves of one buffer do
// not overlap).
#ifndef LOOM_RUNTIME_INTERNAL_VIEW_OVERLAP_H_
#define LOOM_RUNTIME_INTERNAL_VIEW_OVERLAP_H_

#include <string>

#include "loom/tensor.h"

namespace loom::internal {

// Empty views overlap nothing.
bool ViewsOverlap(const TensorView& x, const TensorView& y);

// One past the last byte of a non-empty view, in 128 bits: a view Validate
// accepts may end at 2^64 exactly, and (rows - 1) * stride is computed
// without overflow (saturated past 2^127).
unsigned __int128 ViewEnd(const TensorView& view);

// An address as messages print it, "0x" and hex digits; 2^64 and past too.
std::string HexAddress(unsigned __int128 address);

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_VIEW_OVERLAP_H_
