// reference.cc: FP64 GEMM tile math and the epilogue of the CPU reference.
#include "loom/ops/reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <new>
#include <numbers>
#include <system_error>
#include <thread>
#include <vector>

#include "loom/ops/host_numeric.h"

namespace loom::ops {

double Relu(double v) { return v > 0.0 ? v : 0.0; }

double Gelu(double v) { return 0.5 * v * (1.0 + std::erf(v / std::numbers::sqrt2)); }

double Silu(double v) { return v / (1.0 + std::exp(-v)); }

double ApplyActivation(Activation activation, double v) {
  switch (activation) {
    case Activation::kNone:
      return v;
    case Activation::kReLU:
      return Relu(v);
    case Activation::kGELU:
      return Gelu(v);
    case Activation::kSiLU:
    case Activation::kSwiGLU:
      return Silu(v);
  }
  return v;
}

double EpilogueValue(const Epilogue& epilogue, int64_t row, int64_t out_col, double acc,
                     double up_acc) {
  double out;
  if (epilogue.activation == Activation::kSwiGLU) {
    double gate = acc, up = up_acc;
    if (epilogue.bias) {
      gate += LoadElement(*epilogue.bias, 0, 2 * out_col);
      up += LoadElement(*epilogue.bias, 0, 2 * out_col + 1);
    }
    out = Silu(gate) * up;
  } else {
    double v = acc;
    if (epilogue.bias) v += LoadElement(*epilogue.bias, 0, out_col);
    out = ApplyActivation(epilogue.activation, v);
  }
  if (epilogue.residual) out += LoadElement(*epilogue.residual, row, out_col);
  return out;
}

void StoreEpilogueRow(const GemmNode& node, int64_t row, int64_t acc_col_begin, const double* acc,
                      int64_t count) {
  if (node.epilogue.activation == Activation::kSwiGLU) {
    const int64_t out_begin = acc_col_begin / 2;
    for (int64_t j = 0; 2 * j + 1 < count; ++j) {
      const double value = EpilogueValue(node.epilogue, row, out_begin + j, acc[2 * j], acc[2 * j + 1]);
      StoreElement(node.c, row, out_begin + j, value);
    }
    return;
  }
  for (int64_t j = 0; j < count; ++j) {
    const int64_t col = acc_col_begin + j;
    StoreElement(node.c, row, col, EpilogueValue(node.epilogue, row, col, acc[j]));
  }
}

void AccumulateTile(const double* a, int64_t a_stride, const double* b, int64_t b_stride,
                    int64_t rows, int64_t cols, int64_t k, double* acc, int64_t acc_stride) {
  // Four independent sums at a time hide the add latency; each sum still runs
  // in k order, so the result does not depend on the grouping.
  for (int64_t i = 0; i < rows; ++i) {
    const double* a_row = a + i * a_stride;
    double* acc_row = acc + i * acc_stride;
    int64_t j = 0;
    for (; j + 4 <= cols; j += 4) {
      const double* b0 = b + (j + 0) * b_stride;
      const double* b1 = b + (j + 1) * b_stride;
      const double* b2 = b + (j + 2) * b_stride;
      const double* b3 = b + (j + 3) * b_stride;
      double s0 = acc_row[j + 0], s1 = acc_row[j + 1], s2 = acc_row[j + 2], s3 = acc_row[j + 3];
      for (int64_t kk = 0; kk < k; ++kk) {
        const double x = a_row[kk];
        s0 += x * b0[kk];
        s1 += x * b1[kk];
        s2 += x * b2[kk];
        s3 += x * b3[kk];
      }
      acc_row[j + 0] = s0;
      acc_row[j + 1] = s1;
      acc_row[j + 2] = s2;
      acc_row[j + 3] = s3;
    }
    for (; j < cols; ++j) {
      const double* b_row = b + j * b_stride;
      double s = acc_row[j];
      for (int64_t kk = 0; kk < k; ++kk) s += a_row[kk] * b_row[kk];
      acc_row[j] = s;
    }
  }
}

int64_t ProductBlockColumns(int64_t k) {
  const int64_t fit = (int64_t{4} << 20) / (8 * std::max<int64_t>(k, 1));
  return std::clamp<int64_t>(fit / 2 * 2, 2, 64);
}

bool ForEachBlock(int64_t n, int64_t block, const std::function<void(int64_t, int64_t)>& work) {
  const int64_t blocks = (n + block - 1) / block;
  std::atomic<int64_t> next_block{0};
  std::atomic<bool> out_of_memory{false};
  const auto run_blocks = [&] {
    try {
      for (int64_t b = next_block++; b < blocks && !out_of_memory; b = next_block++) {
        const int64_t begin = b * block;
        work(begin, std::min(block, n - begin));
      }
    } catch (const std::bad_alloc&) {
      out_of_memory = true;
    }
  };
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  try {
    for (int64_t t = 1; t < std::min(cores, blocks); ++t) threads.emplace_back(run_blocks);
  } catch (const std::system_error&) {
    // No more threads to be had: those started and this one share the blocks.
  }
  run_blocks();
  for (std::thread& thread : threads) thread.join();
  return !out_of_memory;
}

std::vector<double> LoadBlock(const TensorView& view, int64_t row_begin, int64_t row_count,
                              int64_t col_begin, int64_t col_count) {
  std::vector<double> block(static_cast<size_t>(row_count * col_count));
  for (int64_t r = 0; r < row_count; ++r) {
    for (int64_t c = 0; c < col_count; ++c) {
      block[static_cast<size_t>(r * col_count + c)] = LoadElement(view, row_begin + r, col_begin + c);
    }
  }
  return block;
}

}  // namespace loom::ops
