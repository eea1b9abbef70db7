// loom/ops/host_numeric.h: element formats on the host, for the CPU reference
// and the tests.
//
// Conversions between float/double and the storage formats loom reads and
// writes (bf16, fp16, fp8 e4m3), bit-exact with the GPU's conversions:
// round to nearest, ties to even; NaN stays NaN; bf16 and fp16 overflow to
// infinity, fp8 e4m3 (which has no infinity) saturates to +-448.
// LoadElement / StoreElement read and write one element of a host TensorView
// of any DType, through double.
//
//   uint16_t bits = loom::ops::FloatToBF16(1.0f / 3.0f);   // 0x3eab
//   float back = loom::ops::BF16ToFloat(bits);              // 0.333984375
//   loom::TensorView v = loom::TensorView::Dense("v", host_ptr, loom::DType::kBF16, 4, 8);
//   loom::ops::StoreElement(v, 1, 2, 0.1);                  // rounds 0.1 to bf16 once
//   double x = loom::ops::LoadElement(v, 1, 2);             // 0.10009765625
#ifndef LOOM_OPS_HOST_NUMERIC_H_
#define LOOM_OPS_HOST_NUMERIC_H_

#include <cstdint>

#include "loom/tensor.h"

namespace loom::ops {

// bf16: 1 sign, 8 exponent, 7 mantissa bits (the top half of a float).
uint16_t FloatToBF16(float value);
uint16_t DoubleToBF16(double value);  // one rounding, straight from double
float BF16ToFloat(uint16_t bits);

// fp16 (IEEE binary16): 1 sign, 5 exponent, 10 mantissa bits; max 65504.
uint16_t FloatToFP16(float value);
uint16_t DoubleToFP16(double value);
float FP16ToFloat(uint16_t bits);

// fp8 e4m3 (the OCP "E4M3FN" form): 1 sign, 4 exponent (bias 7), 3 mantissa
// bits; no infinity, S.1111.111 is NaN, max finite 448. Conversions from
// float saturate: anything beyond +-448 (infinity included) becomes +-448.
uint8_t FloatToFP8E4M3(float value);
uint8_t DoubleToFP8E4M3(double value);
float FP8E4M3ToFloat(uint8_t bits);

// `value` rounded to `dtype` and widened back (what storing then loading gives).
double RoundTo(DType dtype, double value);

// The most that rounding a finite `value` (within the type's range) to
// `dtype` to nearest can change it: half an ulp, which is at most
// 2^-8 |value| for bf16, 2^-11 for fp16, 2^-4 for fp8 e4m3 and 2^-24 for fp32
// among normal numbers, and half the subnormal spacing near zero (bf16
// 2^-134, fp16 2^-25, fp8 e4m3 2^-10, fp32 2^-150), where the relative bound
// alone is too small (a bf16 chain's values shrinking to 1e-41 round to 0).
double RoundingErrorBound(DType dtype, double value);

// Element (row, col) of a view of HOST memory, widened to double. No bounds
// checks: the caller keeps row < rows and col < cols.
double LoadElement(const TensorView& view, int64_t row, int64_t col);
// Rounds `value` to the view's dtype (once, from double) and stores it.
void StoreElement(const TensorView& view, int64_t row, int64_t col, double value);

}  // namespace loom::ops

#endif  // LOOM_OPS_HOST_NUMERIC_H_
