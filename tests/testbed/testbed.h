// testbed.h: the shared test bed of loom's tests (library loom_testbed).
//
//  * Rng: a seeded random source; the seed is printed and attached to every
//    failure (a gtest scoped trace), and LOOM_TEST_SEED=<seed> replays it.
//  * HostMatrix: a host buffer of any DType with sentinel-filled guard bands
//    before and after and in the row padding, handing out TensorViews.
//  * FillRandom / FillIntegers / Poison / CheckGuards / CountUnwritten.
//  * CompareToReference: TESTING.md's per-element tolerance (see Tolerance).
//  * GPU helpers: HasHopperGpu, LOOM_SKIP_WITHOUT_GPU(), DeviceBuffer. Only the
//    CUDA runtime API, so the library links (and skips) on a GPU-less machine.
//
//   TEST(Gemm, Small) {
//     loom::testbed::Rng rng;                      // seed printed + traced
//     loom::testbed::HostMatrix a(loom::DType::kBF16, 65, 64), b(loom::DType::kBF16, 63, 64);
//     loom::testbed::HostMatrix c(loom::DType::kFP32, 65, 63), ref(loom::DType::kFP32, 65, 63);
//     loom::testbed::FillRandom(a, rng);
//     loom::testbed::FillRandom(b, rng);
//     loom::testbed::Poison(c);
//     ... run something that writes c, and the reference that writes ref ...
//     EXPECT_TRUE(loom::testbed::CompareToReference(c, ref, a, b));
//     EXPECT_TRUE(loom::testbed::CheckGuards(c));
//   }
#ifndef LOOM_TESTS_TESTBED_TESTBED_H_
#define LOOM_TESTS_TESTBED_TESTBED_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "loom/graph.h"
#include "loom/tensor.h"

namespace loom::testbed {

// ---------------------------------------------------------------------------
// Random numbers
// ---------------------------------------------------------------------------

// A seeded random source. The seed comes from $LOOM_TEST_SEED when set, else
// it is fresh (std::random_device). It is printed when the Rng is made and
// shown with every gtest failure while the Rng lives, so
//   LOOM_TEST_SEED=<seed> ./reference_test --gtest_filter=<test>
// replays a failure. Make one Rng per test body (each one prints its seed).
// Not copyable or movable: it holds a gtest scoped trace, which is scoped.
class Rng {
 public:
  explicit Rng(std::source_location where = std::source_location::current());
  explicit Rng(uint64_t seed, std::source_location where = std::source_location::current());
  Rng(const Rng&) = delete;
  Rng& operator=(const Rng&) = delete;

  uint64_t seed() const { return seed_; }
  double Uniform(double lo, double hi);     // [lo, hi)
  int64_t UniformInt(int64_t lo, int64_t hi);  // [lo, hi], inclusive
  std::mt19937_64& engine() { return engine_; }

 private:
  uint64_t seed_;
  std::mt19937_64 engine_;
  ::testing::ScopedTrace trace_;
};

// The seed an Rng() without arguments uses: $LOOM_TEST_SEED, else fresh.
uint64_t TestSeed();

// ---------------------------------------------------------------------------
// Host matrices
// ---------------------------------------------------------------------------

// Byte written into guard bands and row padding; checked by CheckGuards.
inline constexpr std::byte kGuardByte{0xA5};
// Byte of the poison pattern: all-ones is a NaN in bf16, fp16, fp8 e4m3, fp32.
inline constexpr std::byte kPoisonByte{0xFF};

// An owned row-major host matrix: `rows` rows of `cols` elements, `row_stride`
// elements apart, inside an allocation with `guard_bytes` of sentinel before
// and after. Guard bytes are rounded up to 16 so the first element stays
// 16-byte aligned (as TMA requires of device copies). Elements start as zeros;
// the row padding [cols, row_stride) and the guards hold kGuardByte.
class HostMatrix {
 public:
  static constexpr int64_t kDefaultGuardBytes = 256;

  HostMatrix(DType dtype, int64_t rows, int64_t cols, int64_t row_stride = 0,
             int64_t guard_bytes = kDefaultGuardBytes);

  // A view of the elements under `name` (the name errors and reports use).
  TensorView view(std::string name = "") const;

  DType dtype() const { return dtype_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t row_stride() const { return row_stride_; }
  int64_t guard_bytes() const { return guard_bytes_; }

  double at(int64_t row, int64_t col) const;             // widened to double
  void set(int64_t row, int64_t col, double value);      // rounded to dtype

  std::byte* data() const { return allocation_.get() + guard_bytes_; }  // element (0, 0)
  int64_t body_bytes() const;  // rows * row_stride elements
  // The whole allocation, guards included (what DeviceBuffer mirrors).
  std::byte* allocation() const { return allocation_.get(); }
  int64_t allocation_bytes() const { return body_bytes() + 2 * guard_bytes_; }

 private:
  DType dtype_;
  int64_t rows_, cols_, row_stride_, guard_bytes_;
  std::unique_ptr<std::byte[]> allocation_;
};

// A set of named host matrices, for building graphs in tests.
//   HostTensors t;
//   g.AddGemm("up", t.Add("x", DType::kBF16, m, k), t.Add("w", DType::kBF16, n, k), ...);
class HostTensors {
 public:
  // Adds a matrix (zero-filled) and returns its view, named `name`.
  TensorView Add(const std::string& name, DType dtype, int64_t rows, int64_t cols,
                 int64_t row_stride = 0, int64_t guard_bytes = HostMatrix::kDefaultGuardBytes);
  HostMatrix& operator[](const std::string& name);  // must exist
  TensorView view(const std::string& name);
  const std::map<std::string, std::unique_ptr<HostMatrix>>& all() const { return matrices_; }

 private:
  std::map<std::string, std::unique_ptr<HostMatrix>> matrices_;
};

// Uniform values in [lo, hi), rounded to the dtype; never all zero (if every
// element rounded to zero, element (0, 0) becomes the smallest of hi / 2 * 2^i
// that the dtype does not round to zero).
void FillRandom(const TensorView& view, Rng& rng, double lo = -1.0, double hi = 1.0);
void FillRandom(HostMatrix& matrix, Rng& rng, double lo = -1.0, double hi = 1.0);
// Integers uniform in [lo, hi]; never all zero (element (0, 0) becomes 1).
void FillIntegers(const TensorView& view, Rng& rng, int lo = -2, int hi = 2);
void FillIntegers(HostMatrix& matrix, Rng& rng, int lo = -2, int hi = 2);
// Every element := `value` (rounded to the dtype).
void FillConstant(const TensorView& view, double value);

// Every element := the poison pattern (kPoisonByte bytes, a NaN).
void Poison(const TensorView& view);
void Poison(HostMatrix& matrix);
// Whether element (row, col) still holds the poison pattern.
bool IsPoison(const TensorView& view, int64_t row, int64_t col);
// Elements that still hold the poison pattern.
int64_t CountUnwritten(const TensorView& view);

// Success iff the guard bands and the row padding still hold kGuardByte; the
// failure message names the first touched byte (row and column for padding).
::testing::AssertionResult CheckGuards(const HostMatrix& matrix, std::string_view name = "");

// ---------------------------------------------------------------------------
// Comparison against the FP64 reference
// ---------------------------------------------------------------------------

// Per element (TESTING.md), for a GEMM with BF16/FP16 inputs and FP32
// accumulation over K:
//   |out - ref| <= 2^-8 |ref| + 4 sqrt(K) 2^-24 (|A| |B|)_ij
//                 [+ 2^-8 |ref| when out is bf16: its output rounding]
// where (|A||B|)_ij = sum_k |A_ik| |B_jk| is computed in FP64. The first term
// is the relative slack of the inputs' and the epilogue's FP32 arithmetic, the
// second the rounding error of a length-K FP32 sum (a random walk, sqrt(K)
// steps of 2^-24 of the running magnitude, with a factor 4 of margin).
// With `exact`, out must equal ref exactly (integer-valued data).
struct Tolerance {
  double relative = 0x1p-8;
  double accumulation = 4.0;
  double unit_roundoff = 0x1p-24;  // of the accumulator (FP32)
  bool exact = false;
};

struct Comparison {
  int64_t compared = 0;
  int64_t mismatches = 0;   // outside tolerance (a computed NaN counts here)
  int64_t unwritten = 0;    // still the poison pattern
  double worst_ratio = 0;   // max |out - ref| / bound over written elements
  std::string report;       // counts and the first few mismatches

  bool ok() const { return mismatches == 0 && unwritten == 0; }
  // EXPECT_TRUE(CompareToReference(...)) prints the report on failure.
  operator ::testing::AssertionResult() const;  // NOLINT: implicit on purpose
};

// Compares out against ref (same shape) for C = A·Bᵀ (no epilogue, or an
// epilogue whose slope is at most 1: bias, residual, relu). A is [M, K], B
// [N, K], all views of host memory; K = a.cols.
Comparison CompareToReference(const TensorView& out, const TensorView& ref, const TensorView& a,
                              const TensorView& b, const Tolerance& tolerance = {});
Comparison CompareToReference(const HostMatrix& out, const HostMatrix& ref, const HostMatrix& a,
                              const HostMatrix& b, const Tolerance& tolerance = {});

// Compares one node's output `out` against `ref` with the accumulation term
// carried through the node's epilogue (the node's views: host memory):
//   elementwise activation f:  slope(f) * e_j,        slope <= 1.13 (gelu), 1.10 (silu), 1
//   SwiGLU silu(g) * u:        1.10 |u| e_g + (|silu(g)| + 1.10 e_g) e_u
// with e_n = 4 sqrt(K) 2^-24 (|A||B|)_in, plus 2^-20 (|f| + |residual|) for the
// epilogue's own FP32 arithmetic (matters only when the residual cancels f).
// That term does not bound every activation's fp32 error relative to f: GELU's
// 1 + erf(v / sqrt 2) cancels in the negative tail (~4% of gelu(-5) ~ -1.4e-6,
// an absolute 6e-8), SiLU's rounded exp argument ~|v| 2^-24 relative; the
// 2^-8 relative term (TESTING.md's) and e_n cover them wherever K > 0 and
// the pre-activation values are those of random data.
// Infinities match only the same infinity.
Comparison CompareNodeToReference(const GemmNode& node, const TensorView& out, const TensorView& ref,
                                  const Tolerance& tolerance = {});

// out == ref element by element (as values; NaN never equal, equal
// infinities equal), same shape.
Comparison CompareExactly(const TensorView& out, const TensorView& ref);

// ---------------------------------------------------------------------------
// GPU helpers (CUDA runtime API only; no kernels)
// ---------------------------------------------------------------------------

// True when CUDA device `device` exists and is a Hopper (sm_90) GPU;
// otherwise false and `why` (if non-null) says what was found instead.
bool HasHopperGpu(std::string* why = nullptr, int device = 0);

// In a test body: skips the test, with the reason, when there is no sm_90 GPU.
#define LOOM_SKIP_WITHOUT_GPU()                                   \
  do {                                                            \
    std::string loom_skip_reason_;                                \
    if (!::loom::testbed::HasHopperGpu(&loom_skip_reason_)) {     \
      GTEST_SKIP() << loom_skip_reason_;                          \
    }                                                             \
  } while (false)

// A device allocation (cudaMalloc / cudaFree), move-only. Made from a
// HostMatrix it mirrors the whole host allocation, guard bands included, so a
// copy back lets CheckGuards see stray device writes.
//   ASSERT_OK_AND_ASSIGN-style:
//   absl::StatusOr<DeviceBuffer> d_c = DeviceBuffer::CopyOf(c);  // c poisoned on host
//   ... launch with d_c->view("c") ...
//   ASSERT_TRUE(d_c->CopyTo(c).ok());
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  static absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes);
  // Allocates like `host` and copies its whole allocation over.
  static absl::StatusOr<DeviceBuffer> CopyOf(const HostMatrix& host);

  // Whole-allocation copies; the sizes must match.
  absl::Status CopyFrom(const HostMatrix& host);
  absl::Status CopyTo(HostMatrix& host) const;

  // The device view of the elements, laid out as the HostMatrix this buffer
  // was made from (an empty view for a buffer made by Allocate).
  TensorView view(std::string name = "") const;

  void* data() const { return allocation_; }
  int64_t bytes() const { return bytes_; }

 private:
  void Release();
  void* allocation_ = nullptr;
  int64_t bytes_ = 0;
  // The HostMatrix layout this buffer mirrors (rows_ < 0: none).
  DType dtype_ = DType::kBF16;
  int64_t rows_ = -1, cols_ = 0, row_stride_ = 0, guard_bytes_ = 0;
};

}  // namespace loom::testbed

#endif  // LOOM_TESTS_TESTBED_TESTBED_H_
