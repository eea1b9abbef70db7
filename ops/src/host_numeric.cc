// host_numeric.cc: bit-exact element conversions on the host.
//
// Every narrow format is encoded by one routine, EncodeSmallFloat, straight
// from double: the value is scaled to an integer count of the format's quantum
// at its exponent, rounded once to nearest-even there, and the bits assembled.
// Rounding once from double (not double -> float -> bf16) matters: two
// roundings can land on the other side of a tie.
#include "loom/ops/host_numeric.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace loom::ops {
namespace {

// A binary floating-point storage format narrower than float.
struct SmallFloatFormat {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  bool has_infinity;     // IEEE-like: all-ones exponent is inf/NaN
  bool saturate;         // out-of-range finite values (and inf) clamp to max
  uint32_t nan_bits;     // the canonical NaN, sign bit clear
  double max_finite;
};

constexpr SmallFloatFormat kBF16{8, 7, 127, true, false, 0x7fc0, 0x1.fep127};
constexpr SmallFloatFormat kFP16{5, 10, 15, true, false, 0x7e00, 65504.0};
// e4m3fn: exponent field 15 is a normal binade except mantissa 111 (NaN).
constexpr SmallFloatFormat kFP8E4M3{4, 3, 7, false, true, 0x7f, 448.0};

uint32_t EncodeSmallFloat(const SmallFloatFormat& f, double value) {
  const int total_bits = 1 + f.exponent_bits + f.mantissa_bits;
  const uint32_t sign = std::signbit(value) ? (1u << (total_bits - 1)) : 0u;
  if (std::isnan(value)) return sign | f.nan_bits;
  const uint32_t exponent_all_ones = (1u << f.exponent_bits) - 1;
  const uint32_t infinity = exponent_all_ones << f.mantissa_bits;
  double magnitude = std::fabs(value);
  if (std::isinf(magnitude)) {
    if (f.saturate) magnitude = f.max_finite;
    else return sign | infinity;
  }
  if (magnitude == 0.0) return sign;

  // magnitude = fraction * 2^exponent with fraction in [0.5, 1): the leading
  // bit has weight 2^(exponent - 1).
  int exponent = 0;
  std::frexp(magnitude, &exponent);
  int unbiased = exponent - 1;
  const int min_normal = 1 - f.bias;
  if (unbiased < min_normal) unbiased = min_normal;  // subnormal: fixed quantum
  // Number of quanta 2^(unbiased - mantissa_bits); exact (power-of-two scale).
  double quanta = std::ldexp(magnitude, f.mantissa_bits - unbiased);
  double rounded = std::nearbyint(quanta);  // default mode: nearest, ties to even
  const double implicit_one = std::ldexp(1.0, f.mantissa_bits);
  if (rounded >= 2.0 * implicit_one) {  // rounded up into the next binade
    rounded = implicit_one;
    ++unbiased;
  }
  const double result = std::ldexp(rounded, unbiased - f.mantissa_bits);
  if (result > f.max_finite) {
    if (f.saturate) return EncodeSmallFloat(f, std::copysign(f.max_finite, value));
    return sign | infinity;
  }
  const uint32_t mantissa_count = static_cast<uint32_t>(rounded);
  if (mantissa_count < static_cast<uint32_t>(implicit_one)) {
    return sign | mantissa_count;  // subnormal (exponent field 0)
  }
  const uint32_t exponent_field = static_cast<uint32_t>(unbiased + f.bias);
  const uint32_t mantissa_field = mantissa_count - static_cast<uint32_t>(implicit_one);
  return sign | (exponent_field << f.mantissa_bits) | mantissa_field;
}

double DecodeSmallFloat(const SmallFloatFormat& f, uint32_t bits) {
  const int total_bits = 1 + f.exponent_bits + f.mantissa_bits;
  const bool negative = (bits >> (total_bits - 1)) & 1u;
  const uint32_t exponent_all_ones = (1u << f.exponent_bits) - 1;
  const uint32_t exponent_field = (bits >> f.mantissa_bits) & exponent_all_ones;
  const uint32_t mantissa_field = bits & ((1u << f.mantissa_bits) - 1);
  double magnitude;
  if (f.has_infinity && exponent_field == exponent_all_ones) {
    magnitude = mantissa_field == 0 ? std::numeric_limits<double>::infinity()
                                    : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.has_infinity && exponent_field == exponent_all_ones &&
             mantissa_field == (1u << f.mantissa_bits) - 1) {
    magnitude = std::numeric_limits<double>::quiet_NaN();
  } else if (exponent_field == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa_field), 1 - f.bias - f.mantissa_bits);
  } else {
    const double significand =
        static_cast<double>(mantissa_field | (1u << f.mantissa_bits));
    magnitude = std::ldexp(significand, static_cast<int>(exponent_field) - f.bias - f.mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

}  // namespace

uint16_t FloatToBF16(float value) {
  // Float carries bf16's exponent range, so RNE on the dropped 16 bits is exact.
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // stay quiet NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
uint16_t DoubleToBF16(double value) { return static_cast<uint16_t>(EncodeSmallFloat(kBF16, value)); }
float BF16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t FloatToFP16(float value) { return DoubleToFP16(value); }
uint16_t DoubleToFP16(double value) { return static_cast<uint16_t>(EncodeSmallFloat(kFP16, value)); }
float FP16ToFloat(uint16_t bits) { return static_cast<float>(DecodeSmallFloat(kFP16, bits)); }

uint8_t FloatToFP8E4M3(float value) { return DoubleToFP8E4M3(value); }
uint8_t DoubleToFP8E4M3(double value) {
  return static_cast<uint8_t>(EncodeSmallFloat(kFP8E4M3, value));
}
float FP8E4M3ToFloat(uint8_t bits) { return static_cast<float>(DecodeSmallFloat(kFP8E4M3, bits)); }

double RoundingErrorBound(DType dtype, double value) {
  const double magnitude = std::fabs(value);
  switch (dtype) {
    case DType::kBF16:
      return 0x1p-8 * magnitude + 0x1p-134;
    case DType::kFP16:
      return 0x1p-11 * magnitude + 0x1p-25;
    case DType::kFP8E4M3:
      return 0x1p-4 * magnitude + 0x1p-10;
    case DType::kFP32:
      return 0x1p-24 * magnitude + 0x1p-150;
  }
  return 0.0;
}

double RoundTo(DType dtype, double value) {
  switch (dtype) {
    case DType::kBF16:
      return BF16ToFloat(DoubleToBF16(value));
    case DType::kFP16:
      return FP16ToFloat(DoubleToFP16(value));
    case DType::kFP8E4M3:
      return FP8E4M3ToFloat(DoubleToFP8E4M3(value));
    case DType::kFP32:
      return static_cast<float>(value);
  }
  return value;
}

double LoadElement(const TensorView& view, int64_t row, int64_t col) {
  const std::byte* p = view.element(row, col);
  switch (view.dtype) {
    case DType::kBF16: {
      uint16_t bits;
      std::memcpy(&bits, p, sizeof(bits));
      return BF16ToFloat(bits);
    }
    case DType::kFP16: {
      uint16_t bits;
      std::memcpy(&bits, p, sizeof(bits));
      return FP16ToFloat(bits);
    }
    case DType::kFP8E4M3: {
      uint8_t bits;
      std::memcpy(&bits, p, sizeof(bits));
      return FP8E4M3ToFloat(bits);
    }
    case DType::kFP32: {
      float v;
      std::memcpy(&v, p, sizeof(v));
      return v;
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

void StoreElement(const TensorView& view, int64_t row, int64_t col, double value) {
  std::byte* p = view.element(row, col);
  switch (view.dtype) {
    case DType::kBF16: {
      const uint16_t bits = DoubleToBF16(value);
      std::memcpy(p, &bits, sizeof(bits));
      return;
    }
    case DType::kFP16: {
      const uint16_t bits = DoubleToFP16(value);
      std::memcpy(p, &bits, sizeof(bits));
      return;
    }
    case DType::kFP8E4M3: {
      const uint8_t bits = DoubleToFP8E4M3(value);
      std::memcpy(p, &bits, sizeof(bits));
      return;
    }
    case DType::kFP32: {
      const float v = static_cast<float>(value);
      std::memcpy(p, &v, sizeof(v));
      return;
    }
  }
}

}  // namespace loom::ops
