// loom/ops/reference.h: the CPU reference math of one GEMM node, in FP64.
//
// The single definition of what a node computes, shared by the tile-by-tile
// reference executor and the naive whole-graph loop (loom/reference.h), so
// the two can only disagree through the schedule:
//
//   v[n]   = acc[n] + bias[n]                 (acc = A·Bᵀ in FP64, bias optional)
//   out[j] = activation(v[j]) + residual[j]   (kNone, kReLU, kGELU, kSiLU)
//   out[j] = silu(v[2j]) * v[2j+1] + residual[j]   (kSwiGLU: gate/up column pairs)
//   C[j]   = out[j] rounded once to C's dtype
//
//   std::vector<double> a = loom::ops::LoadBlock(node.a, row0, rows, 0, k);
//   std::vector<double> b = loom::ops::LoadBlock(node.b, col0, cols, 0, k);
//   std::vector<double> acc(rows * cols, 0.0);
//   loom::ops::AccumulateTile(a.data(), k, b.data(), k, rows, cols, k, acc.data(), cols);
//   for (int64_t i = 0; i < rows; ++i)
//     loom::ops::StoreEpilogueRow(node, row0 + i, col0, &acc[i * cols], cols);
#ifndef LOOM_OPS_REFERENCE_H_
#define LOOM_OPS_REFERENCE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "loom/graph.h"
#include "loom/tensor.h"

namespace loom::ops {

double Relu(double v);
double Gelu(double v);  // exact form: v/2 * (1 + erf(v / sqrt(2)))
double Silu(double v);  // v / (1 + exp(-v))

// The elementwise activation. kSwiGLU is not elementwise; for it this returns
// silu(v), the activation of the gate (the product with `up` is the epilogue's).
double ApplyActivation(Activation activation, double v);

// Output element (row, out_col) of a node's epilogue before the final cast.
// `acc` is the accumulator of column out_col, or for kSwiGLU of column
// 2*out_col (the gate), and `up_acc` that of column 2*out_col + 1 (ignored
// otherwise). Bias and residual are read from the epilogue's host views.
double EpilogueValue(const Epilogue& epilogue, int64_t row, int64_t out_col, double acc,
                     double up_acc = 0.0);

// Applies the epilogue to `count` accumulator values of row `row`, accumulator
// columns [acc_col_begin, acc_col_begin + count), and stores the output
// elements they produce into node.c (rounded to its dtype). For kSwiGLU,
// acc_col_begin and count are even (a trailing odd column is ignored).
void StoreEpilogueRow(const GemmNode& node, int64_t row, int64_t acc_col_begin, const double* acc,
                      int64_t count);

// acc[i * acc_stride + j] += sum_{kk < k} a[i * a_stride + kk] * b[j * b_stride + kk],
// for i < rows, j < cols, each sum accumulated in FP64 in the order kk = 0, 1, ...
// One compiled routine for every caller, so equal inputs give equal bits.
void AccumulateTile(const double* a, int64_t a_stride, const double* b, int64_t b_stride,
                    int64_t rows, int64_t cols, int64_t k, double* acc, int64_t acc_stride);

// Accumulator columns a block of a whole-K host product takes: even (a
// SwiGLU pair stays in one block), at most 64, and as many as keep the
// block's rows of B as doubles within 4 MiB (2 past K = 262144), so that they
// are read from a core's cache for every row of A.
int64_t ProductBlockColumns(int64_t k);

// Calls work(begin, count) for the blocks [0, block), [block, 2 block), ...
// of [0, n), the last one ragged, spread over up to the host's cores (the
// calling thread one of them), and returns once all have run: a node's
// accumulator columns, a matrix's rows. Each block runs once, on one thread,
// in no fixed order: `work` must write only what its own block owns. false if
// a block threw std::bad_alloc (blocks not yet started are then skipped).
bool ForEachBlock(int64_t n, int64_t block, const std::function<void(int64_t, int64_t)>& work);

// Rows [row_begin, row_begin + row_count) x columns [col_begin, col_begin +
// col_count) of a host view, widened to double, packed row-major.
std::vector<double> LoadBlock(const TensorView& view, int64_t row_begin, int64_t row_count,
                              int64_t col_begin, int64_t col_count);

}  // namespace loom::ops

#endif  // LOOM_OPS_REFERENCE_H_
