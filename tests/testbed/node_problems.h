// node_problems.h: the scheduler's per-node problems and dependency edges,
// spelled out for the scheduler's CPU tests (lowering, simulation).
#ifndef LOOM_TESTS_TESTBED_NODE_PROBLEMS_H_
#define LOOM_TESTS_TESTBED_NODE_PROBLEMS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "loom/scheduler/schedule.h"

namespace loom::testbed {

// An m x n x k GEMM node reading its producers through `deps`.
inline sched::NodeProblem Gemm(int64_t m, int64_t n, int64_t k, std::vector<sched::DependencyEdge> deps = {},
                               bool swiglu = false) {
  sched::NodeProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.swiglu = swiglu;
  p.dependencies = std::move(deps);
  return p;
}

// An edge from node `producer` into `operand`, at an offset into that
// operand (or covering it whole).
inline sched::DependencyEdge Edge(int producer, sched::DependencyOperand operand, int64_t row_offset = 0,
                                  int64_t col_offset = 0, bool whole_tensor = false) {
  sched::DependencyEdge e;
  e.producer = producer;
  e.operand = static_cast<uint8_t>(operand);
  e.row_offset = row_offset;
  e.col_offset = col_offset;
  e.whole_tensor = whole_tensor ? 1 : 0;
  return e;
}

}  // namespace loom::testbed

#endif  // LOOM_TESTS_TESTBED_NODE_PROBLEMS_H_
