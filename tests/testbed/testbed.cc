// testbed.cc: the shared test bed (see testbed.h).
#include "testbed.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "loom/ops/host_numeric.h"
#include "loom/ops/reference.h"

namespace loom::testbed {
namespace {

std::string SeedMessage(uint64_t seed) {
  return absl::StrCat("random seed ", seed, " (replay: LOOM_TEST_SEED=", seed, ")");
}

// The error of an output's final rounding to `dtype` at reference value
// `ref`: half an ulp (ops::RoundingErrorBound: relative, and half the
// subnormal spacing near zero). FP32's is left out, as TESTING.md does.
double OutputRounding(DType dtype, double ref) {
  return dtype == DType::kFP32 ? 0.0 : ops::RoundingErrorBound(dtype, ref);
}

std::string ViewName(const TensorView& view) { return view.name.empty() ? "output" : view.name; }

// Walks every element of `out` against `ref` with a per-element bound; the
// shared body of the Compare* functions.
class ComparisonBuilder {
 public:
  static constexpr int kMaxReported = 8;

  explicit ComparisonBuilder(const TensorView& out) : out_(out) {}

  // Records element (row, col). bound < 0: exact comparison.
  void Check(int64_t row, int64_t col, double out, double ref, double bound, double ab = -1.0) {
    ++result_.compared;
    if (IsPoison(out_, row, col)) {
      if (result_.unwritten++ < kMaxReported) {
        absl::StrAppendFormat(&details_, "\n  (%d, %d): unwritten (poison), ref=%.9g", row, col, ref);
      }
      return;
    }
    const double diff = std::fabs(out - ref);
    bool bad = std::isnan(out) || std::isnan(ref);
    if (!bad && (std::isinf(out) || std::isinf(ref))) {
      // An infinite reference makes a relative bound infinite: an infinity is
      // matched only by itself (same sign), and never by a finite value.
      bad = out != ref;
      if (bad) result_.worst_ratio = std::numeric_limits<double>::infinity();
    } else if (!bad) {
      if (bound <= 0.0) {
        bad = diff != 0.0;
        if (bad) result_.worst_ratio = std::numeric_limits<double>::infinity();
      } else {
        result_.worst_ratio = std::max(result_.worst_ratio, diff / bound);
        bad = diff > bound;
      }
    }
    if (!bad) return;
    if (result_.mismatches++ < kMaxReported) {
      absl::StrAppendFormat(&details_, "\n  (%d, %d): out=%.9g ref=%.9g |diff|=%.3g bound=%.3g", row,
                            col, out, ref, diff, std::max(bound, 0.0));
      if (ab >= 0.0) absl::StrAppendFormat(&details_, " (|A||B|=%.4g)", ab);
    }
  }

  void ShapeMismatch(const std::string& why) {
    ++result_.mismatches;
    absl::StrAppend(&details_, "\n  ", why);
  }

  Comparison Finish() {
    result_.report = absl::StrFormat(
        "%s [%dx%d %s]: %d of %d elements outside tolerance, %d unwritten (poison); worst "
        "|out - ref| / bound = %.3g",
        ViewName(out_), out_.rows, out_.cols, DTypeName(out_.dtype), result_.mismatches,
        result_.compared, result_.unwritten, result_.worst_ratio);
    if (!details_.empty()) absl::StrAppend(&result_.report, "; first:", details_);
    return std::move(result_);
  }

 private:
  const TensorView& out_;
  Comparison result_;
  std::string details_;
};

bool SameShape(const TensorView& out, const TensorView& ref, ComparisonBuilder& builder) {
  if (out.rows == ref.rows && out.cols == ref.cols) return true;
  builder.ShapeMismatch(absl::StrFormat("shape mismatch: out is %dx%d, ref is %dx%d", out.rows,
                                        out.cols, ref.rows, ref.cols));
  return false;
}

absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

}  // namespace

// --- Rng -------------------------------------------------------------------

uint64_t TestSeed() {
  if (const char* env = std::getenv("LOOM_TEST_SEED"); env != nullptr && *env != '\0') {
    return std::strtoull(env, nullptr, 0);
  }
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

Rng::Rng(std::source_location where) : Rng(TestSeed(), where) {}

Rng::Rng(uint64_t seed, std::source_location where)
    : seed_(seed), engine_(seed), trace_(where.file_name(), static_cast<int>(where.line()),
                                         SeedMessage(seed)) {
  std::printf("[ loom     ] %s at %s:%u\n", SeedMessage(seed).c_str(), where.file_name(),
              static_cast<unsigned>(where.line()));
  std::fflush(stdout);
}

double Rng::Uniform(double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(engine_);
}

int64_t Rng::UniformInt(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
}

// --- HostMatrix --------------------------------------------------------------

HostMatrix::HostMatrix(DType dtype, int64_t rows, int64_t cols, int64_t row_stride,
                       int64_t guard_bytes)
    : dtype_(dtype),
      rows_(rows),
      cols_(cols),
      row_stride_(row_stride > 0 ? row_stride : cols),
      guard_bytes_((std::max<int64_t>(guard_bytes, 0) + 15) / 16 * 16) {
  const int64_t total = allocation_bytes();
  allocation_ = std::make_unique<std::byte[]>(static_cast<size_t>(std::max<int64_t>(total, 1)));
  std::memset(allocation_.get(), static_cast<int>(kGuardByte), static_cast<size_t>(total));
  const int64_t row_bytes = cols_ * static_cast<int64_t>(DTypeSize(dtype_));
  for (int64_t r = 0; r < rows_; ++r) {
    std::memset(data() + r * row_stride_ * static_cast<int64_t>(DTypeSize(dtype_)), 0,
                static_cast<size_t>(row_bytes));
  }
}

int64_t HostMatrix::body_bytes() const {
  return rows_ * row_stride_ * static_cast<int64_t>(DTypeSize(dtype_));
}

TensorView HostMatrix::view(std::string name) const {
  return TensorView{std::move(name), data(), dtype_, rows_, cols_, row_stride_};
}

double HostMatrix::at(int64_t row, int64_t col) const { return ops::LoadElement(view(), row, col); }

void HostMatrix::set(int64_t row, int64_t col, double value) {
  ops::StoreElement(view(), row, col, value);
}

TensorView HostTensors::Add(const std::string& name, DType dtype, int64_t rows, int64_t cols,
                            int64_t row_stride, int64_t guard_bytes) {
  auto& slot = matrices_[name];
  slot = std::make_unique<HostMatrix>(dtype, rows, cols, row_stride, guard_bytes);
  return slot->view(name);
}

HostMatrix& HostTensors::operator[](const std::string& name) { return *matrices_.at(name); }

TensorView HostTensors::view(const std::string& name) { return matrices_.at(name)->view(name); }

// --- Fills -----------------------------------------------------------------

namespace {

bool AllZero(const TensorView& view) {
  for (int64_t r = 0; r < view.rows; ++r) {
    for (int64_t c = 0; c < view.cols; ++c) {
      if (ops::LoadElement(view, r, c) != 0.0) return false;
    }
  }
  return true;
}

}  // namespace

void FillRandom(const TensorView& view, Rng& rng, double lo, double hi) {
  // Rows in chunks of about 2^20 elements, filled over the host's cores, each
  // chunk from its own engine seeded by one draw of rng's: the values depend
  // on rng's seed alone, not on how many threads filled them.
  const int64_t chunk_rows = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(view.cols, 1));
  std::vector<uint64_t> seeds(static_cast<size_t>((view.rows + chunk_rows - 1) / chunk_rows));
  for (uint64_t& seed : seeds) seed = rng.engine()();
  ops::ForEachBlock(view.rows, chunk_rows, [&](int64_t row_begin, int64_t rows) {
    std::mt19937_64 engine(seeds[static_cast<size_t>(row_begin / chunk_rows)]);
    std::uniform_real_distribution<double> uniform(lo, hi);
    for (int64_t r = row_begin; r < row_begin + rows; ++r) {
      for (int64_t c = 0; c < view.cols; ++c) ops::StoreElement(view, r, c, uniform(engine));
    }
  });
  if (!view.empty() && AllZero(view)) {
    // Every value rounded to zero (a range below the dtype's smallest): use
    // the nearest non-zero value on hi's side of zero instead.
    double value = hi > 0.0 ? hi / 2 : lo / 2;
    if (value == 0.0) value = 1.0;
    while (ops::RoundTo(view.dtype, value) == 0.0) value *= 2.0;
    ops::StoreElement(view, 0, 0, value);
  }
}

void FillRandom(HostMatrix& matrix, Rng& rng, double lo, double hi) {
  FillRandom(matrix.view(), rng, lo, hi);
}

void FillIntegers(const TensorView& view, Rng& rng, int lo, int hi) {
  for (int64_t r = 0; r < view.rows; ++r) {
    for (int64_t c = 0; c < view.cols; ++c) {
      ops::StoreElement(view, r, c, static_cast<double>(rng.UniformInt(lo, hi)));
    }
  }
  if (!view.empty() && AllZero(view)) ops::StoreElement(view, 0, 0, 1.0);
}

void FillIntegers(HostMatrix& matrix, Rng& rng, int lo, int hi) {
  FillIntegers(matrix.view(), rng, lo, hi);
}

void FillConstant(const TensorView& view, double value) {
  for (int64_t r = 0; r < view.rows; ++r) {
    for (int64_t c = 0; c < view.cols; ++c) ops::StoreElement(view, r, c, value);
  }
}

void Poison(const TensorView& view) {
  for (int64_t r = 0; r < view.rows; ++r) {
    std::memset(view.element(r, 0), static_cast<int>(kPoisonByte),
                static_cast<size_t>(view.cols) * view.element_size());
  }
}

void Poison(HostMatrix& matrix) { Poison(matrix.view()); }

bool IsPoison(const TensorView& view, int64_t row, int64_t col) {
  const std::byte* p = view.element(row, col);
  for (size_t i = 0; i < view.element_size(); ++i) {
    if (p[i] != kPoisonByte) return false;
  }
  return true;
}

int64_t CountUnwritten(const TensorView& view) {
  int64_t count = 0;
  for (int64_t r = 0; r < view.rows; ++r) {
    for (int64_t c = 0; c < view.cols; ++c) count += IsPoison(view, r, c) ? 1 : 0;
  }
  return count;
}

::testing::AssertionResult CheckGuards(const HostMatrix& matrix, std::string_view name) {
  const std::string label = name.empty() ? "matrix" : std::string(name);
  const std::byte* base = matrix.allocation();
  const int64_t guard = matrix.guard_bytes();
  for (int64_t i = 0; i < guard; ++i) {
    if (base[i] != kGuardByte) {
      return ::testing::AssertionFailure()
             << label << ": guard band before the data touched, " << (guard - i)
             << " bytes before element (0, 0)";
    }
  }
  const std::byte* after = matrix.data() + matrix.body_bytes();
  for (int64_t i = 0; i < guard; ++i) {
    if (after[i] != kGuardByte) {
      return ::testing::AssertionFailure()
             << label << ": guard band after the data touched, " << i
             << " bytes past the last row (" << matrix.rows() << " rows of stride "
             << matrix.row_stride() << ")";
    }
  }
  const int64_t element = static_cast<int64_t>(DTypeSize(matrix.dtype()));
  for (int64_t r = 0; r < matrix.rows(); ++r) {
    const std::byte* row = matrix.data() + r * matrix.row_stride() * element;
    for (int64_t i = matrix.cols() * element; i < matrix.row_stride() * element; ++i) {
      if (row[i] != kGuardByte) {
        return ::testing::AssertionFailure()
               << label << ": row padding touched at row " << r << ", column " << i / element
               << " (cols " << matrix.cols() << ", row stride " << matrix.row_stride() << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// --- Comparison ------------------------------------------------------------

Comparison::operator ::testing::AssertionResult() const {
  if (ok()) return ::testing::AssertionSuccess() << report;
  return ::testing::AssertionFailure() << report;
}

Comparison CompareToReference(const TensorView& out, const TensorView& ref, const TensorView& a,
                              const TensorView& b, const Tolerance& tolerance) {
  ComparisonBuilder builder(out);
  if (!SameShape(out, ref, builder)) return builder.Finish();
  if (a.rows != out.rows || b.rows != out.cols || a.cols != b.cols) {
    builder.ShapeMismatch(absl::StrFormat("A is %dx%d and B %dx%d, not [M, K] and [N, K] of a "
                                          "%dx%d output",
                                          a.rows, a.cols, b.rows, b.cols, out.rows, out.cols));
    return builder.Finish();
  }
  const int64_t m = out.rows, n = out.cols, k = a.cols;
  std::vector<double> abs_a = ops::LoadBlock(a, 0, m, 0, k);
  std::vector<double> abs_b = ops::LoadBlock(b, 0, n, 0, k);
  for (double& v : abs_a) v = std::fabs(v);
  for (double& v : abs_b) v = std::fabs(v);
  std::vector<double> ab(static_cast<size_t>(n));
  const double accumulation =
      tolerance.accumulation * std::sqrt(static_cast<double>(k)) * tolerance.unit_roundoff;
  for (int64_t i = 0; i < m; ++i) {
    std::fill(ab.begin(), ab.end(), 0.0);
    ops::AccumulateTile(abs_a.data() + i * k, k, abs_b.data(), k, 1, n, k, ab.data(), n);  // K may be 0
    for (int64_t j = 0; j < n; ++j) {
      const double o = ops::LoadElement(out, i, j), r = ops::LoadElement(ref, i, j);
      const double bound = tolerance.exact ? 0.0
                                           : tolerance.relative * std::fabs(r) + OutputRounding(out.dtype, r) +
                                                 accumulation * ab[j];
      builder.Check(i, j, o, r, bound, ab[j]);
    }
  }
  return builder.Finish();
}

Comparison CompareToReference(const HostMatrix& out, const HostMatrix& ref, const HostMatrix& a,
                              const HostMatrix& b, const Tolerance& tolerance) {
  return CompareToReference(out.view("out"), ref.view("ref"), a.view("A"), b.view("B"), tolerance);
}

Comparison CompareNodeToReference(const GemmNode& node, const TensorView& out, const TensorView& ref,
                                  const Tolerance& tolerance) {
  TensorView named_out = out;
  if (named_out.name.empty()) named_out.name = node.c.name;
  ComparisonBuilder builder(named_out);
  if (!SameShape(out, ref, builder)) return builder.Finish();
  if (out.rows != node.m() || out.cols != node.out_cols()) {
    builder.ShapeMismatch(absl::StrFormat("node \"%s\" writes %dx%d, out is %dx%d", node.name,
                                          node.m(), node.out_cols(), out.rows, out.cols));
    return builder.Finish();
  }
  constexpr double kSiluSlope = 1.10;  // max |silu'| ~= 1.0998
  constexpr double kGeluSlope = 1.13;  // max |gelu'| ~= 1.1289
  constexpr double kEpilogueArithmetic = 0x1p-20;
  const Epilogue& epilogue = node.epilogue;
  const int64_t m = node.m(), n = node.n(), k = node.k();
  const std::vector<double> a = ops::LoadBlock(node.a, 0, m, 0, k);
  std::vector<double> abs_a(a);
  for (double& v : abs_a) v = std::fabs(v);
  const double accumulation =
      tolerance.accumulation * std::sqrt(static_cast<double>(k)) * tolerance.unit_roundoff;
  double slope = 1.0;
  if (epilogue.activation == Activation::kGELU) slope = kGeluSlope;
  if (epilogue.activation == Activation::kSiLU) slope = kSiluSlope;
  auto bias = [&](int64_t col) {
    return epilogue.bias ? ops::LoadElement(*epilogue.bias, 0, col) : 0.0;
  };
  // A·Bᵀ and |A|·|B|ᵀ for a chunk of rows at a time (at most 4 Mi elements,
  // 32 MiB, of each), their columns in blocks over the host's cores; then the
  // chunk's elements are checked in row-major order. An output past one
  // chunk converts B's blocks to doubles again for each chunk: the price of
  // holding only a chunk of both products.
  const int64_t chunk_rows =
      std::clamp<int64_t>((int64_t{4} << 20) / std::max<int64_t>(n, 1), 1, std::max<int64_t>(m, 1));
  std::vector<double> acc_rows, ab_rows;
  for (int64_t row0 = 0; row0 < m; row0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, m - row0);
    acc_rows.assign(static_cast<size_t>(rows * n), 0.0);
    ab_rows.assign(static_cast<size_t>(rows * n), 0.0);
    const bool fitted = ops::ForEachBlock(n, ops::ProductBlockColumns(k), [&](int64_t col, int64_t cols) {
      const std::vector<double> b = ops::LoadBlock(node.b, col, cols, 0, k);
      std::vector<double> abs_b(b);
      for (double& v : abs_b) v = std::fabs(v);
      for (int64_t i = 0; i < rows; ++i) {
        // data() + offset, not &v[offset]: with K = 0 the vectors are empty.
        const int64_t a_offset = (row0 + i) * k, acc_offset = i * n + col;
        ops::AccumulateTile(a.data() + a_offset, k, b.data(), k, 1, cols, k, acc_rows.data() + acc_offset, n);
        ops::AccumulateTile(abs_a.data() + a_offset, k, abs_b.data(), k, 1, cols, k, ab_rows.data() + acc_offset, n);
      }
    });
    if (!fitted) {
      builder.ShapeMismatch(absl::StrFormat("node \"%s\": B's column blocks as doubles do not fit in host memory",
                                            node.name));
      return builder.Finish();
    }
    for (int64_t i = row0; i < row0 + rows; ++i) {
      const double* acc = acc_rows.data() + (i - row0) * n;
      const double* ab = ab_rows.data() + (i - row0) * n;
      for (int64_t j = 0; j < out.cols; ++j) {
        const double residual = epilogue.residual ? ops::LoadElement(*epilogue.residual, i, j) : 0.0;
        double carried, terms, ab_shown;
        if (epilogue.activation == Activation::kSwiGLU) {
          const double gate = acc[2 * j] + bias(2 * j), up = acc[2 * j + 1] + bias(2 * j + 1);
          const double e_gate = accumulation * ab[2 * j], e_up = accumulation * ab[2 * j + 1];
          const double silu_gate = ops::Silu(gate);
          carried = kSiluSlope * std::fabs(up) * e_gate + (std::fabs(silu_gate) + kSiluSlope * e_gate) * e_up;
          terms = std::fabs(silu_gate * up) + std::fabs(residual);
          ab_shown = std::max(ab[2 * j], ab[2 * j + 1]);
        } else {
          const double f = ops::ApplyActivation(epilogue.activation, acc[j] + bias(j));
          carried = slope * accumulation * ab[j];
          terms = std::fabs(f) + std::fabs(residual);
          ab_shown = ab[j];
        }
        const double o = ops::LoadElement(out, i, j), r = ops::LoadElement(ref, i, j);
        const double bound =
            tolerance.exact ? 0.0
                            : tolerance.relative * std::fabs(r) + OutputRounding(out.dtype, r) + carried +
                                  kEpilogueArithmetic * terms;
        builder.Check(i, j, o, r, bound, ab_shown);
      }
    }
  }
  return builder.Finish();
}

Comparison CompareExactly(const TensorView& out, const TensorView& ref) {
  ComparisonBuilder builder(out);
  if (!SameShape(out, ref, builder)) return builder.Finish();
  for (int64_t i = 0; i < out.rows; ++i) {
    for (int64_t j = 0; j < out.cols; ++j) {
      builder.Check(i, j, ops::LoadElement(out, i, j), ops::LoadElement(ref, i, j), 0.0);
    }
  }
  return builder.Finish();
}

// --- GPU helpers -------------------------------------------------------------

bool HasHopperGpu(std::string* why, int device) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  std::string reason;
  if (error != cudaSuccess) {
    reason = absl::StrCat("no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorName(error),
                          ": ", cudaGetErrorString(error), ")");
  } else if (count == 0) {
    reason = "no CUDA device";
  } else if (device >= count) {
    reason = absl::StrCat("needs CUDA device ", device, "; this machine has ", count, " device",
                          count == 1 ? "" : "s");
  } else {
    int major = 0, minor = 0;
    error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (error == cudaSuccess) {
      error = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    }
    if (error != cudaSuccess) {
      reason = absl::StrCat("cannot query device ", device, ": ", cudaGetErrorName(error));
    } else if (major != 9) {
      reason = absl::StrCat("device ", device, " is sm_", major, minor, "; loom needs sm_90 (Hopper)");
    } else {
      return true;
    }
  }
  if (why != nullptr) *why = reason;
  return false;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    allocation_ = std::exchange(other.allocation_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    dtype_ = other.dtype_;
    rows_ = std::exchange(other.rows_, -1);
    cols_ = other.cols_;
    row_stride_ = other.row_stride_;
    guard_bytes_ = other.guard_bytes_;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

void DeviceBuffer::Release() {
  if (allocation_ != nullptr) cudaFree(allocation_);
  allocation_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int64_t bytes) {
  DeviceBuffer buffer;
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("DeviceBuffer: ", bytes, " bytes"));
  if (bytes > 0) {
    absl::Status status =
        CudaStatus(cudaMalloc(&buffer.allocation_, static_cast<size_t>(bytes)), "cudaMalloc");
    if (!status.ok()) return status;
  }
  buffer.bytes_ = bytes;
  return buffer;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::CopyOf(const HostMatrix& host) {
  absl::StatusOr<DeviceBuffer> buffer = Allocate(host.allocation_bytes());
  if (!buffer.ok()) return buffer.status();
  buffer->dtype_ = host.dtype();
  buffer->rows_ = host.rows();
  buffer->cols_ = host.cols();
  buffer->row_stride_ = host.row_stride();
  buffer->guard_bytes_ = host.guard_bytes();
  absl::Status status = buffer->CopyFrom(host);
  if (!status.ok()) return status;
  return buffer;
}

absl::Status DeviceBuffer::CopyFrom(const HostMatrix& host) {
  if (host.allocation_bytes() != bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceBuffer::CopyFrom: host allocation is ",
                                                   host.allocation_bytes(), " bytes, device ",
                                                   bytes_));
  }
  if (bytes_ == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpy(allocation_, host.allocation(), static_cast<size_t>(bytes_),
                               cudaMemcpyHostToDevice),
                    "cudaMemcpy (host to device)");
}

absl::Status DeviceBuffer::CopyTo(HostMatrix& host) const {
  if (host.allocation_bytes() != bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceBuffer::CopyTo: host allocation is ",
                                                   host.allocation_bytes(), " bytes, device ",
                                                   bytes_));
  }
  if (bytes_ == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpy(host.allocation(), allocation_, static_cast<size_t>(bytes_),
                               cudaMemcpyDeviceToHost),
                    "cudaMemcpy (device to host)");
}

TensorView DeviceBuffer::view(std::string name) const {
  if (rows_ < 0) return TensorView{std::move(name), nullptr, dtype_, 0, 0, 0};
  return TensorView{std::move(name), static_cast<std::byte*>(allocation_) + guard_bytes_, dtype_,
                    rows_, cols_, row_stride_};
}

}  // namespace loom::testbed
