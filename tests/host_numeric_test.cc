// host_numeric_test.cc: the host element conversions (loom/ops/host_numeric.h)
// and the reference epilogue math (loom/ops/reference.h). CPU only.
//
// The conversions are checked three ways: known bit patterns; every bit
// pattern of each 8/16-bit format round-tripping; and random values against
// an independent oracle that finds the nearest representable value by
// searching the sorted table of all finite values of the format.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "loom/ops/host_numeric.h"
#include "loom/ops/reference.h"
#include "testbed/testbed.h"

namespace loom::ops {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// --- bf16 --------------------------------------------------------------------

TEST(BF16Test, KnownValues) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBF16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBF16(1.0f / 3.0f), 0x3eab);
  EXPECT_EQ(FloatToBF16(0.1f), 0x3dcd);
  EXPECT_EQ(FloatToBF16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBF16(-0.0f), 0x8000);
  EXPECT_EQ(BF16ToFloat(0x3eab), 0.333984375f);
  EXPECT_EQ(BF16ToFloat(0x7f7f), 0x1.fep127f);  // max finite
}

TEST(BF16Test, RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: the even one (1) wins.
  EXPECT_EQ(FloatToBF16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(FloatToBF16(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just past the tie rounds up.
  EXPECT_EQ(FloatToBF16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
  EXPECT_EQ(DoubleToBF16(1.0 + 0x1p-8), 0x3f80);
  EXPECT_EQ(DoubleToBF16(1.0 + 3 * 0x1p-8), 0x3f82);
}

TEST(BF16Test, DoubleRoundsOnce) {
  // Rounding to float first would land exactly on the tie and go to even (down);
  // rounding once from double sees the value is above the tie.
  const double above_tie = 1.0 + 0x1p-8 + 0x1p-40;
  EXPECT_EQ(FloatToBF16(static_cast<float>(above_tie)), 0x3f80);
  EXPECT_EQ(DoubleToBF16(above_tie), 0x3f81);
  EXPECT_EQ(RoundTo(DType::kBF16, above_tie), 1.0 + 0x1p-7);
}

TEST(BF16Test, SpecialValues) {
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(BF16ToFloat(DoubleToBF16(kNaN))));
  // A NaN whose payload lives only in the low 16 bits must stay a NaN.
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_TRUE(std::signbit(BF16ToFloat(DoubleToBF16(-kNaN))));
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(DoubleToBF16(-kInf), 0xff80);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past max
  EXPECT_EQ(DoubleToBF16(1e39), 0x7f80);
  EXPECT_EQ(DoubleToBF16(0x1.fep127), 0x7f7f);
  // Subnormals: the smallest is 2^-133; half of it ties to even (zero).
  EXPECT_EQ(DoubleToBF16(0x1p-133), 0x0001);
  EXPECT_EQ(DoubleToBF16(0x1p-134), 0x0000);
  EXPECT_EQ(DoubleToBF16(1.5 * 0x1p-134), 0x0001);
  EXPECT_EQ(FloatToBF16(0x1p-133f), 0x0001);
  EXPECT_EQ(BF16ToFloat(0x0001), 0x1p-133f);
}

TEST(BF16Test, EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = BF16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(value)))) << bits;
      continue;
    }
    ASSERT_EQ(FloatToBF16(value), bits) << "bits 0x" << std::hex << bits;
    ASSERT_EQ(DoubleToBF16(value), bits) << "bits 0x" << std::hex << bits;
  }
}

TEST(BF16Test, FloatAndDoublePathsAgreeOnFloats) {
  testbed::Rng rng;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng.engine()());
    const float value = std::bit_cast<float>(bits);
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToBF16(value), DoubleToBF16(value)) << "float bits 0x" << std::hex << bits;
  }
}

// --- An independent oracle: nearest value in the sorted table of a format. ---

struct FormatTable {
  std::vector<std::pair<double, uint32_t>> finite;  // non-negative finite values, sorted
};

template <class Decode>
FormatTable BuildTable(uint32_t patterns, uint32_t sign_bit, Decode decode) {
  FormatTable table;
  for (uint32_t bits = 0; bits < patterns; ++bits) {
    if (bits & sign_bit) continue;
    const double v = decode(bits);
    if (std::isfinite(v)) table.finite.push_back({v, bits});
  }
  std::sort(table.finite.begin(), table.finite.end());
  return table;
}

// Bits of the nearest finite value to |x| (ties: even bit pattern), or
// `above_max` when |x| is at least max + half an ulp of max.
uint32_t NearestBits(const FormatTable& t, double magnitude, uint32_t above_max) {
  const auto& f = t.finite;
  const double max = f.back().first;
  const double half_ulp_max = (max - f[f.size() - 2].first) / 2;
  if (magnitude >= max + half_ulp_max) return above_max;
  auto upper = std::lower_bound(f.begin(), f.end(), std::make_pair(magnitude, uint32_t{0}));
  if (upper == f.end()) return f.back().second;
  if (upper->first == magnitude || upper == f.begin()) return upper->second;
  auto lower = upper - 1;
  const double below = magnitude - lower->first, above = upper->first - magnitude;
  if (below < above) return lower->second;
  if (above < below) return upper->second;
  return (lower->second & 1u) == 0 ? lower->second : upper->second;
}

TEST(HostNumericOracleTest, BF16MatchesNearestValue) {
  const FormatTable table =
      BuildTable(0x10000, 0x8000, [](uint32_t b) { return BF16ToFloat(static_cast<uint16_t>(b)); });
  testbed::Rng rng;
  for (int i = 0; i < 100000; ++i) {
    // Magnitudes across the whole range, including subnormals and overflow.
    const double x = std::ldexp(rng.Uniform(-1.0, 1.0), static_cast<int>(rng.UniformInt(-140, 129)));
    const uint32_t expected = NearestBits(table, std::fabs(x), 0x7f80) | (std::signbit(x) ? 0x8000 : 0);
    ASSERT_EQ(DoubleToBF16(x), expected) << "x = " << x;
  }
}

TEST(HostNumericOracleTest, FP16MatchesNearestValue) {
  const FormatTable table =
      BuildTable(0x10000, 0x8000, [](uint32_t b) { return FP16ToFloat(static_cast<uint16_t>(b)); });
  testbed::Rng rng;
  for (int i = 0; i < 100000; ++i) {
    const double x = std::ldexp(rng.Uniform(-1.0, 1.0), static_cast<int>(rng.UniformInt(-26, 17)));
    const uint32_t expected = NearestBits(table, std::fabs(x), 0x7c00) | (std::signbit(x) ? 0x8000 : 0);
    ASSERT_EQ(DoubleToFP16(x), expected) << "x = " << x;
    ASSERT_EQ(FloatToFP16(static_cast<float>(x)),
              NearestBits(table, std::fabs(static_cast<double>(static_cast<float>(x))), 0x7c00) |
                  (std::signbit(x) ? 0x8000 : 0))
        << "x = " << x;
  }
}

TEST(HostNumericOracleTest, FP8E4M3MatchesNearestValueAndSaturates) {
  const FormatTable table =
      BuildTable(0x100, 0x80, [](uint32_t b) { return FP8E4M3ToFloat(static_cast<uint8_t>(b)); });
  ASSERT_EQ(table.finite.back().first, 448.0);
  testbed::Rng rng;
  for (int i = 0; i < 100000; ++i) {
    const double x = std::ldexp(rng.Uniform(-1.0, 1.0), static_cast<int>(rng.UniformInt(-11, 11)));
    // Saturating: anything past max + half an ulp clamps to max (0x7e).
    const uint32_t expected = NearestBits(table, std::fabs(x), 0x7e) | (std::signbit(x) ? 0x80 : 0);
    ASSERT_EQ(DoubleToFP8E4M3(x), expected) << "x = " << x;
  }
}

// --- fp16 --------------------------------------------------------------------

TEST(FP16Test, KnownValues) {
  EXPECT_EQ(FloatToFP16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFP16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFP16(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(FloatToFP16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFP16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToFP16(65520.0f), 0x7c00);  // the tie past max rounds to infinity
  EXPECT_EQ(FloatToFP16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToFP16(0x1p-25f), 0x0000);  // tie, to even
  EXPECT_EQ(FloatToFP16(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToFP16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFP16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(FP16ToFloat(FloatToFP16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(FP16ToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(FP16ToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(FP16ToFloat(0x7e00)));
}

TEST(FP16Test, EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = FP16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(FP16ToFloat(FloatToFP16(value))));
      continue;
    }
    ASSERT_EQ(FloatToFP16(value), bits) << "bits 0x" << std::hex << bits;
  }
}

// --- fp8 e4m3 ----------------------------------------------------------------

TEST(FP8E4M3Test, KnownValues) {
  EXPECT_EQ(FP8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(FP8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(FP8E4M3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(FP8E4M3ToFloat(0x08), 0x1p-6f);   // smallest normal
  EXPECT_EQ(FP8E4M3ToFloat(0x01), 0x1p-9f);   // smallest subnormal
  EXPECT_EQ(FP8E4M3ToFloat(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(FP8E4M3ToFloat(0x78), 256.0f);    // exponent field 15 is a normal binade
  EXPECT_TRUE(std::isnan(FP8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(FP8E4M3ToFloat(0xff)));
  EXPECT_EQ(FloatToFP8E4M3(1.0f), 0x38);
  EXPECT_EQ(FloatToFP8E4M3(-0.0f), 0x80);
  EXPECT_EQ(FloatToFP8E4M3(1.0625f), 0x38);  // tie between 1 and 1.125: even
  EXPECT_EQ(FloatToFP8E4M3(1.1875f), 0x3a);  // tie between 1.125 and 1.25: even
}

TEST(FP8E4M3Test, Saturates) {
  EXPECT_EQ(FloatToFP8E4M3(448.0f), 0x7e);
  EXPECT_EQ(FloatToFP8E4M3(464.0f), 0x7e);  // would round to 480, past max
  EXPECT_EQ(FloatToFP8E4M3(500.0f), 0x7e);
  EXPECT_EQ(FloatToFP8E4M3(-1e9f), 0xfe);
  EXPECT_EQ(FloatToFP8E4M3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(FloatToFP8E4M3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_TRUE(std::isnan(FP8E4M3ToFloat(FloatToFP8E4M3(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(FP8E4M3Test, EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xff; ++bits) {
    const float value = FP8E4M3ToFloat(static_cast<uint8_t>(bits));
    if (std::isnan(value)) continue;
    EXPECT_EQ(FloatToFP8E4M3(value), bits) << "bits 0x" << std::hex << bits;
  }
}

// --- LoadElement / StoreElement ----------------------------------------------

class ElementAccessTest : public ::testing::TestWithParam<DType> {};

TEST_P(ElementAccessTest, StoresRoundedAndLoadsBack) {
  const DType dtype = GetParam();
  // 3 x 5 inside rows of stride 8: the padding must stay untouched.
  testbed::HostMatrix m(dtype, 3, 5, /*row_stride=*/8);
  const TensorView v = m.view("m");
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t c = 0; c < 5; ++c) StoreElement(v, r, c, 0.1 * (r * 5 + c) - 0.7);
  }
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t c = 0; c < 5; ++c) {
      const double stored = LoadElement(v, r, c);
      EXPECT_EQ(stored, RoundTo(dtype, 0.1 * (r * 5 + c) - 0.7)) << r << "," << c;
      EXPECT_EQ(m.at(r, c), stored);
    }
  }
  EXPECT_TRUE(testbed::CheckGuards(m, "m"));
  StoreElement(v, 2, 4, kNaN);
  EXPECT_TRUE(std::isnan(LoadElement(v, 2, 4)));
}

TEST_P(ElementAccessTest, RoundToIsIdempotent) {
  const DType dtype = GetParam();
  testbed::Rng rng;
  for (int i = 0; i < 10000; ++i) {
    const double once = RoundTo(dtype, rng.Uniform(-300.0, 300.0));
    EXPECT_EQ(RoundTo(dtype, once), once);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, ElementAccessTest,
                         ::testing::Values(DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kFP32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// RoundingErrorBound holds for every value, normal or subnormal, and is not
// loose: at half-way points between two neighbours it is at most twice the
// error, and near zero it is the subnormal half-spacing (a bf16 value of
// 6.7e-42 rounds to 0, an error 6.7e-42 that 2^-8 of it would not allow).
TEST(RoundingErrorBoundTest, HoldsForNormalAndSubnormalValues) {
  const DType types[] = {DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kFP32};
  const double largest[] = {3e38, 65000, 440, 3e38};
  for (int t = 0; t < 4; ++t) {
    SCOPED_TRACE(static_cast<int>(types[t]));
    for (double magnitude = largest[t]; magnitude > 1e-300; magnitude /= 1.37) {
      for (const double v : {magnitude, -magnitude, magnitude * 0.999, magnitude * 1.0003}) {
        if (std::fabs(v) > largest[t]) continue;
        const double error = std::fabs(RoundTo(types[t], v) - v);
        ASSERT_LE(error, RoundingErrorBound(types[t], v)) << v;
      }
    }
  }
  EXPECT_EQ(RoundTo(DType::kBF16, 6.72623e-42), 0.0);
  EXPECT_GT(0x1p-8 * 6.72623e-42, 0.0);
  EXPECT_LT(0x1p-8 * 6.72623e-42, 6.72623e-42);  // the relative bound alone would refuse it
  EXPECT_GE(RoundingErrorBound(DType::kBF16, 6.72623e-42), 6.72623e-42);
  // Half-way between 1 and bf16's next value up (1 + 2^-7): the error is 2^-8,
  // the bound 2^-8 (1 + 2^-8) + 2^-134.
  const double tie = 1 + 0x1p-8;
  EXPECT_LE(RoundingErrorBound(DType::kBF16, tie), 2 * std::fabs(RoundTo(DType::kBF16, tie) - tie));
}

// The bound is tight for every dtype, not bf16 alone: at a point half-way
// between two neighbours (1 + half an ulp, and half the smallest subnormal,
// which ties to zero) the rounding error is half a spacing, and the bound may
// be at most twice that. A looser relative or absolute term (2^-10 for fp16's
// 2^-11, 2^-23 for fp32's 2^-24, 2^-3 for fp8's 2^-4, a subnormal term of a
// whole spacing) would let the demos' tolerance pass a wrong output rounding.
TEST(RoundingErrorBoundTest, TightAtTiesForEveryDType) {
  struct Case {
    DType dtype;
    double half_ulp_at_one;        // half the spacing above 1
    double half_smallest_subnormal;
  };
  for (const Case& c : {Case{DType::kBF16, 0x1p-8, 0x1p-134}, Case{DType::kFP16, 0x1p-11, 0x1p-25},
                        Case{DType::kFP8E4M3, 0x1p-4, 0x1p-10}, Case{DType::kFP32, 0x1p-24, 0x1p-150}}) {
    SCOPED_TRACE(DTypeName(c.dtype));
    for (const double tie : {1.0 + c.half_ulp_at_one, c.half_smallest_subnormal}) {
      const double error = std::fabs(RoundTo(c.dtype, tie) - tie);
      EXPECT_EQ(error, tie == c.half_smallest_subnormal ? tie : c.half_ulp_at_one) << tie;
      EXPECT_LE(error, RoundingErrorBound(c.dtype, tie)) << tie;
      EXPECT_LE(RoundingErrorBound(c.dtype, tie), 2 * error) << tie;
    }
  }
}

TEST(StoreElementTest, FP32StoresTheNearestFloat) {
  testbed::HostMatrix m(DType::kFP32, 1, 1);
  StoreElement(m.view(), 0, 0, 0.1);
  EXPECT_EQ(LoadElement(m.view(), 0, 0), static_cast<double>(0.1f));
}

// StoreElement rounds once, from double, for the 16-bit formats too (as
// BF16Test.DoubleRoundsOnce checks DoubleToBF16): a value just above a tie
// that rounding to float first would land on the tie, and then round to even.
TEST(StoreElementTest, SixteenBitFormatsRoundOnceFromDouble) {
  struct Case {
    DType dtype;
    double above_tie;  // 1 + half an ulp + a little; as a float exactly the tie
    double expected;   // 1 + one ulp
  };
  for (const Case& c : {Case{DType::kBF16, 1.0 + 0x1p-8 + 0x1p-40, 1.0 + 0x1p-7},
                        Case{DType::kFP16, 1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-10}}) {
    SCOPED_TRACE(DTypeName(c.dtype));
    ASSERT_EQ(static_cast<double>(static_cast<float>(c.above_tie)), c.above_tie - 0x1p-40);  // float: the tie
    testbed::HostMatrix m(c.dtype, 1, 2);
    StoreElement(m.view(), 0, 0, c.above_tie);
    StoreElement(m.view(), 0, 1, -c.above_tie);
    EXPECT_EQ(LoadElement(m.view(), 0, 0), c.expected);
    EXPECT_EQ(LoadElement(m.view(), 0, 1), -c.expected);
    EXPECT_EQ(LoadElement(m.view(), 0, 0), RoundTo(c.dtype, c.above_tie));
  }
}

// --- The reference epilogue math ---------------------------------------------

TEST(ReferenceMathTest, Activations) {
  EXPECT_EQ(ApplyActivation(Activation::kNone, -1.5), -1.5);
  EXPECT_EQ(ApplyActivation(Activation::kReLU, -1.5), 0.0);
  EXPECT_EQ(ApplyActivation(Activation::kReLU, 2.5), 2.5);
  // gelu(x) = x * Phi(x): Phi(1) = 0.841344746068543, Phi(-1) = 0.158655253931457.
  EXPECT_NEAR(ApplyActivation(Activation::kGELU, 1.0), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(ApplyActivation(Activation::kGELU, -1.0), -0.15865525393145707, 1e-15);
  EXPECT_EQ(ApplyActivation(Activation::kGELU, 0.0), 0.0);
  // silu(x) = x * sigmoid(x): sigmoid(1) = 0.7310585786300049.
  EXPECT_NEAR(ApplyActivation(Activation::kSiLU, 1.0), 0.7310585786300049, 1e-15);
  EXPECT_NEAR(ApplyActivation(Activation::kSiLU, -2.0), -2.0 * 0.11920292202211755, 1e-15);
  EXPECT_EQ(ApplyActivation(Activation::kSiLU, -800.0), -0.0);  // exp overflow: 0, not NaN
  EXPECT_EQ(ApplyActivation(Activation::kSiLU, 800.0), 800.0);
  EXPECT_EQ(ApplyActivation(Activation::kSwiGLU, 1.0), Silu(1.0));  // the gate's activation
}

TEST(ReferenceMathTest, EpilogueValueAppliesBiasActivationResidual) {
  testbed::HostMatrix bias(DType::kFP32, 1, 4), residual(DType::kBF16, 2, 4);
  for (int c = 0; c < 4; ++c) bias.set(0, c, 0.5 * c);
  for (int c = 0; c < 4; ++c) residual.set(1, c, -1.0 + c);
  Epilogue e{.activation = Activation::kReLU, .bias = bias.view("bias"), .residual = residual.view("res")};
  // relu(-3 + 1.5) + 2 = 2; relu(1 + 1.0) + 1 = 3.
  EXPECT_EQ(EpilogueValue(e, 1, 3, -3.0), 2.0);
  EXPECT_EQ(EpilogueValue(e, 1, 2, 1.0), 3.0);
}

TEST(ReferenceMathTest, SwiGLUPairsGateAndUpColumns) {
  // Accumulator columns (2j, 2j + 1) = (gate_j, up_j); C is half as wide.
  testbed::HostMatrix bias(DType::kBF16, 1, 4), c(DType::kFP32, 1, 2);
  bias.set(0, 0, 0.5);   // gate_0
  bias.set(0, 1, -1.0);  // up_0
  bias.set(0, 2, 0.0);
  bias.set(0, 3, 2.0);
  GemmNode node;
  node.c = c.view("c");
  node.epilogue = {.activation = Activation::kSwiGLU, .bias = bias.view("bias"), .residual = {}};
  const double acc[4] = {1.0, 3.0, -2.0, 0.25};
  StoreEpilogueRow(node, 0, 0, acc, 4);
  EXPECT_EQ(c.at(0, 0), static_cast<float>(Silu(1.5) * 2.0));
  EXPECT_EQ(c.at(0, 1), static_cast<float>(Silu(-2.0) * 2.25));
}

TEST(ReferenceMathTest, AccumulateTileSumsInKOrder) {
  // Summation order is visible in FP64: (1 + 1e16) - 1e16 is 0 (the 1 is
  // lost to 1e16's ulp of 2), where the reversed order, or the two large
  // terms first, gives 1.
  const double a[3] = {1.0, 1e16, -1e16};
  const double b[3] = {1.0, 1.0, 1.0};
  double acc = 0.0;
  AccumulateTile(a, 3, b, 3, 1, 1, 3, &acc, 1);
  EXPECT_EQ(acc, 0.0);
  // Grouped (4 columns at a time) and single-column paths give the same bits.
  std::vector<double> aa(64), bb(5 * 64);
  for (int i = 0; i < 64; ++i) aa[i] = std::sin(i + 1.0) * 1e3;
  for (int i = 0; i < 5 * 64; ++i) bb[i] = std::cos(i * 0.37);
  std::vector<double> grouped(5, 0.0), single(5, 0.0);
  AccumulateTile(aa.data(), 64, bb.data(), 64, 1, 5, 64, grouped.data(), 5);
  for (int j = 0; j < 5; ++j) AccumulateTile(aa.data(), 64, &bb[j * 64], 64, 1, 1, 64, &single[j], 1);
  EXPECT_EQ(grouped, single);
}

// Each product is rounded before it is added, in the grouped (4 columns) and
// the single-column path alike: -1 + (1 + 2^-30)(1 - 2^-30) is 0 that way (the
// product, 1 - 2^-60, rounds to 1) and -2^-60 with a fused multiply-add. The
// sin/cos data of AccumulateTileSumsInKOrder happens to give the same bits
// both ways, so it cannot tell a path that fuses from one that does not.
TEST(ReferenceMathTest, EveryPathRoundsEachProduct) {
  const double a[2] = {-1.0, 1.0 + 0x1p-30};
  std::vector<double> b(5 * 2);
  for (int j = 0; j < 5; ++j) {
    b[j * 2 + 0] = 1.0;
    b[j * 2 + 1] = 1.0 - 0x1p-30;
  }
  std::vector<double> acc(5, 0.0);
  AccumulateTile(a, 2, b.data(), 2, 1, 5, 2, acc.data(), 5);  // columns 0-3 grouped, 4 single
  for (int j = 0; j < 5; ++j) EXPECT_EQ(acc[j], 0.0) << "column " << j;
}

}  // namespace
}  // namespace loom::ops
