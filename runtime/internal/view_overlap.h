// view_overlap.h (internal): whether two views share a byte, decided as
// GemmGraph::Validate decides it (graph.cc: byte ranges, then rows under a
// shared stride, so the two column halves of one buffer do not overlap).
#ifndef LOOM_RUNTIME_INTERNAL_VIEW_OVERLAP_H_
#define LOOM_RUNTIME_INTERNAL_VIEW_OVERLAP_H_

#include "loom/tensor.h"

namespace loom::internal {

// Empty views overlap nothing.
bool ViewsOverlap(const TensorView& x, const TensorView& y);

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_VIEW_OVERLAP_H_
