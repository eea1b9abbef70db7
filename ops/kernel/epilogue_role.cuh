// epilogue_role.cuh: the consumers' fused epilogue, from accumulators to the
// staging buffers. Each consumer warpgroup, after its main loop, applies the
// fused epilogue in FP32, out = activation(acc + bias) + residual, or for
// SwiGLU out[j] = silu(acc[2j] + bias[2j]) * (acc[2j+1] + bias[2j+1]) +
// residual, converts to the output type and writes 64-row x 128-byte panels
// into its staging buffers (128B swizzled, the layout the TMA store reads).
// The store thread (store_role.cuh) takes it from there. Protocol and fences:
// cta_context.cuh.
#ifndef LOOM_OPS_KERNEL_EPILOGUE_ROLE_CUH_
#define LOOM_OPS_KERNEL_EPILOGUE_ROLE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cta_context.cuh"
#include "half_types.cuh"

namespace loom::kernel {

// How a tile's output splits into 128-byte-wide panels.
template <ElementType kOut, bool kSwiGLU>
struct PanelShape {
  static constexpr int kOutBytes = IsHalf(kOut) ? 2 : 4;
  static constexpr int kOutCols = KernelConfig::kPanelBytes / kOutBytes;  // output columns per panel
  static constexpr int kAccCols = kOutCols * (kSwiGLU ? 2 : 1);          // accumulator columns per panel
  static constexpr int kChunks = kAccCols / 8;  // 8-column accumulator chunks (4 registers each)
};

// Panels of this tile that hold at least one output column (the rest are
// past the tensor's last column and are neither staged nor stored).
__device__ inline int OutputPanels(int64_t out_cols, int32_t out_tile_n, int cols_per_panel, int32_t n_block) {
  const int64_t out_col0 = static_cast<int64_t>(n_block) * out_tile_n;
  const int64_t panels = (out_cols - out_col0 + cols_per_panel - 1) / cols_per_panel;
  const int tile_panels = out_tile_n / cols_per_panel;
  return panels < tile_panels ? static_cast<int>(panels) : tile_panels;
}

// NOTE: the epilogue runs once per tile over every accumulator register of
// the thread (128 in a 256-column tile, 64 in a 128-column one), fully
// unrolled (register arrays need compile-time indices). Every per-element
// branch is multiplied by 128 and by each instantiation, and straight-line
// code this long misses the instruction cache on every tile: the first
// version, with the activation switch and the bounds checks inside the
// element loop, cost as much time as the main loop (bench/NOTES.md). So each
// fused op is its own pass, chosen by one uniform branch per tile, and the
// common case (no bias, no residual, no activation, a full-width tile) is a
// pass of conversions and shared-memory stores alone.

// silu(v) = v * sigmoid(v) = v / (1 + 2^(-v log2 e)): two SFU instructions
// and three FP32 ones. Where 1 + 2^(-v log2 e) reaches 2^126 (v below about
// -87) or overflows, the reciprocal flushes to 0 and so does silu, as it
// should (its true value is below 1e-36).
// NOTE: IEEE division ('/') is a range check plus a called slow path: with a
// decode tile's rows past M all zero, the SwiGLU pass of one panel took 6 us
// (traced, v1.7). __fdividef's own range check (a compare and two scaling
// multiplies an element, for denominators of 2^126 and more) cost a fifth
// of the SwiGLU pass's instructions (bench/NOTES.md v1.20).
__device__ __forceinline__ float Silu(float v) {
  constexpr float kLog2E = 1.4426950408889634f;
  return v * ptx::rcp_approx_ftz(1.0f + ptx::ex2_approx_ftz(v * -kLog2E));
}

template <EpilogueActivation kActivation>
__device__ __forceinline__ float Activate(float v) {
  if constexpr (kActivation == EpilogueActivation::kReLU) return fmaxf(v, 0.0f);
  if constexpr (kActivation == EpilogueActivation::kGELU) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  if constexpr (kActivation == EpilogueActivation::kSiLU) return Silu(v);
  return v;
}

// The same, chosen at run time (for the few values of a decode reduce,
// splitk_reduce.cuh; SwiGLU is not an element-wise activation).
__device__ __forceinline__ float Activate(EpilogueActivation activation, float v) {
  switch (activation) {
    case EpilogueActivation::kReLU:
      return Activate<EpilogueActivation::kReLU>(v);
    case EpilogueActivation::kGELU:
      return Activate<EpilogueActivation::kGELU>(v);
    case EpilogueActivation::kSiLU:
      return Activate<EpilogueActivation::kSiLU>(v);
    default:
      return v;
  }
}

// The passes below each cover the registers [begin, end) of one panel, so
// their temporaries (loaded bias and residual values) stay few.
template <EpilogueActivation kActivation, int kAcc>
__device__ __forceinline__ void ActivateRange(float (&acc)[kAcc], int begin, int end) {
#pragma unroll
  for (int i = begin; i < end; ++i) acc[i] = Activate<kActivation>(acc[i]);
}

// The plan's 16-bit type as a C++ type (Config: a TiledConfig).
template <class Config>
using HalfOf = typename HalfType<Config::kHalf>::T;

// Element `index` of a tensor of T (float, __nv_bfloat16 or __half), as a
// float.
template <typename T>
__device__ __forceinline__ float LoadFloat(const void* base, int64_t index) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<const float*>(base)[index];
  } else {
    return HalfType<kElementTypeOf<T>>::ToFloat(static_cast<const T*>(base)[index]);
  }
}

// Two consecutive elements, from an address aligned to two of them.
template <typename T>
__device__ __forceinline__ float2 LoadFloatPair(const T* pair) {
  if constexpr (std::is_same_v<T, float>) {
    return *reinterpret_cast<const float2*>(pair);
  } else {
    using Half = HalfType<kElementTypeOf<T>>;
    return Half::ToFloat2(*reinterpret_cast<const typename Half::T2*>(pair));
  }
}

// The same, the element type chosen at run time: the plan's 16-bit type
// kHalf or fp32 (a bias or residual of either, read a few values at a time;
// the narrow kernel's).
template <ElementType kHalf>
__device__ __forceinline__ float LoadAsFloat(ElementType type, const void* base, int64_t index) {
  return type == kHalf ? LoadFloat<typename HalfType<kHalf>::T>(base, index) : LoadFloat<float>(base, index);
}

// The tile column of accumulator register i of this lane.
__device__ __forceinline__ int AccColumn(int i, int lane) { return 8 * (i / 4) + 2 * (lane % 4) + (i % 2); }
// The warpgroup row (0..63) of accumulator register i of this lane and warp.
__device__ __forceinline__ int AccRow(int i, int warp, int lane) { return warp * 16 + lane / 4 + 8 * ((i / 2) % 2); }

// The node fields the epilogue reads, copied into registers once per tile
// (the barrier and fence asm clobber memory, which would force reloads).
struct EpilogueFields {
  void* c;
  int64_t c_stride;
  int64_t c_tma_cols;
  const void* bias;
  const void* residual;
  int64_t residual_stride;
  int64_t m, n, out_cols;
  int32_t out_tile_n;
  EpilogueActivation activation;
  ElementType bias_type, residual_type;

  __device__ explicit EpilogueFields(const KernelNode& node)
      : c(node.c),
        c_stride(node.c_stride),
        c_tma_cols(node.c_tma_cols),
        bias(node.bias),
        residual(node.residual),
        residual_stride(node.residual_stride),
        m(node.schedule.m),
        n(node.schedule.n),
        out_cols(node.schedule.out_cols),
        out_tile_n(node.schedule.out_tile_n),
        activation(node.activation),
        bias_type(node.bias_type),
        residual_type(node.residual_type) {}
};

// The first row of this warpgroup's part of the tile, and the tile's first
// (accumulator) column.
__device__ __forceinline__ int64_t WarpgroupRow0(const CtaWork& work, int warpgroup) {
  return static_cast<int64_t>(work.m_block) * KernelConfig::kBlockM + warpgroup * KernelConfig::kRowsPerConsumer;
}
template <class Config>
__device__ __forceinline__ int64_t TileCol0(const CtaWork& work) {
  return static_cast<int64_t>(work.n_block) * Config::kBlockN;
}

// Whether output tile column n_block lies wholly inside C's TMA columns: its
// panels are stored whole by TMA, with no column left for the consumers to
// write themselves (WriteRaggedPanel).
__device__ __forceinline__ bool TileInsideTmaColumns(int32_t n_block, int32_t out_tile_n, int64_t c_tma_cols) {
  return int64_t{n_block} * out_tile_n + out_tile_n <= c_tma_cols;
}

// acc[i] += bias[column of i] (accumulator columns). Registers 4c..4c+3 hold
// columns 8c + 2 * (lane % 4) + {0, 1} of two rows, so each chunk loads two
// values. kChecked: the tile reaches past N, so columns are bounds-checked.
template <typename T, bool kChecked, int kAcc>
__device__ __forceinline__ void AddBias(const EpilogueFields& node, int64_t acc_col0, int lane, float (&acc)[kAcc],
                                        int begin, int end) {
  const int64_t first = acc_col0 + 2 * (lane % 4);
  const T* bias = static_cast<const T*>(node.bias) + first;
  const int64_t columns_left = node.n - first;
#pragma unroll
  for (int i = begin; i < end; i += 4) {
    const int offset = 8 * (i / 4);
    const float b0 = (!kChecked || offset < columns_left) ? LoadFloat<T>(bias, offset) : 0.0f;
    const float b1 = (!kChecked || offset + 1 < columns_left) ? LoadFloat<T>(bias, offset + 1) : 0.0f;
    acc[i] += b0;
    acc[i + 1] += b1;
    acc[i + 2] += b0;
    acc[i + 3] += b1;
  }
}

// acc[i] += residual[row][column] for the output elements this lane holds:
// every register, or for SwiGLU the even registers (which hold the outputs).
// The two rows' base pointers are computed once; kChecked: the tile reaches
// past M or past the output's last column. kPairLoads (unchecked, not
// SwiGLU): one load for each pair of columns a lane holds, whose first
// column is even and whose rows start 16-byte aligned (graph.cc, rule 4).
template <typename T, bool kSwiGLU, bool kChecked, bool kPairLoads = false, int kAcc = 0>
__device__ __forceinline__ void AddResidual(const EpilogueFields& node, int64_t row0, int64_t out_col0, int warp,
                                            int lane, float (&acc)[kAcc], int begin, int end) {
  const int64_t row_lo = row0 + warp * 16 + lane / 4;
  const T* base_lo = static_cast<const T*>(node.residual) + row_lo * node.residual_stride + out_col0;
  const T* base_hi = base_lo + 8 * node.residual_stride;
  const bool row_lo_ok = row_lo < node.m, row_hi_ok = row_lo + 8 < node.m;
  const int64_t columns_left = node.out_cols - out_col0;
#pragma unroll
  for (int i = begin; i < end; i += 4) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const T* base = half == 0 ? base_lo : base_hi;
      const bool row_ok = half == 0 ? row_lo_ok : row_hi_ok;
      const int r = i + 2 * half;
      if constexpr (kSwiGLU) {
        const int col = 4 * (i / 4) + lane % 4;
        if (!kChecked || (row_ok && col < columns_left)) acc[r] += LoadFloat<T>(base, col);
      } else if constexpr (kPairLoads) {
        static_assert(!kChecked, "pair loads read both columns");
        const int col = 8 * (i / 4) + 2 * (lane % 4);
        const float2 pair = LoadFloatPair<T>(base + col);
        acc[r] += pair.x;
        acc[r + 1] += pair.y;
      } else {
        const int col = 8 * (i / 4) + 2 * (lane % 4);
        if (!kChecked || (row_ok && col < columns_left)) acc[r] += LoadFloat<T>(base, col);
        if (!kChecked || (row_ok && col + 1 < columns_left)) acc[r + 1] += LoadFloat<T>(base, col + 1);
      }
    }
  }
}

template <typename T, bool kSwiGLU, int kAcc>
__device__ __forceinline__ void AddResidual(const EpilogueFields& node, int64_t row0, int64_t out_col0, int warp,
                                            int lane, float (&acc)[kAcc], int begin, int end, bool interior) {
  if (interior) {
    AddResidual<T, kSwiGLU, false>(node, row0, out_col0, warp, lane, acc, begin, end);
  } else {
    AddResidual<T, kSwiGLU, true>(node, row0, out_col0, warp, lane, acc, begin, end);
  }
}

// Asks L2 for the residual rows this lane adds (its two rows, the tile's
// output columns [out_col0, out_col0 + cols)): the four lanes of a row take
// every fourth 128-byte line. AddResidual then reads each panel's values one
// L2 round trip away instead of one HBM round trip a panel.
// NOTE: traced at 8192 tokens, the MLP's down projection (residual, four
// panels a warpgroup) spent 12.5 us of each ~180 us tile in its epilogue
// without this, 9.7 us with it (bench/NOTES.md v1.20).
template <typename T>
__device__ __forceinline__ void PrefetchResidualRows(const EpilogueFields& node, int64_t row0, int64_t out_col0,
                                                     int64_t cols, int warp, int lane) {
  constexpr int kLine = 128;
  const int64_t row_lo = row0 + warp * 16 + lane / 4;
  const int64_t end = min(out_col0 + cols, node.out_cols);
  const int64_t bytes = (end - out_col0) * static_cast<int64_t>(sizeof(T));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row_lo + 8 * half;
    if (row >= node.m) continue;
    const auto first = reinterpret_cast<uintptr_t>(static_cast<const T*>(node.residual) +
                                                   row * node.residual_stride + out_col0);
    const uintptr_t line0 = first & ~uintptr_t{kLine - 1};  // the row's first line, whole
    for (uintptr_t line = line0 + (lane % 4) * kLine; line < first + bytes; line += 4 * kLine) {
      ptx::prefetch_global_l2(reinterpret_cast<const void*>(line));
    }
  }
}

// SwiGLU: acc[2j] = silu(acc[2j]) * acc[2j + 1] (gate and up sit side by
// side), over [begin, end), a multiple of 8 registers: four outputs at a
// time sharing one reciprocal. sigmoid(g) = n / d with t = 2^(-|g| log2 e)
// in [0, 1], d = 1 + t in [1, 2] and n = 1 for g >= 0, t below 0; as no d
// can overflow or underflow, 1 / (d0 d1 d2 d3) gives all four 1 / d_j with
// a few multiplies. The SFU then does 1.25 operations an output instead of
// Silu's 2 (Silu's were ~1.1 us of the ~3.4-us epilogue of each 8192-token
// gate/up tile). Measured against Silu (bench/NOTES.md v1.51): the
// 128-token block 0.3-0.4 us faster over five rounds each; at 8192 tokens
// within the power cap's spread. d is clamped to 2 so that a NaN gate (d
// NaN) leaves its three neighbours' reciprocals alone; its own output is
// NaN through n or g. Large |g| behaves as Silu's: t flushes to 0, so silu
// is g above 0 and -0 below.
template <int kAcc>
__device__ __forceinline__ void SwiGLURange(float (&acc)[kAcc], int begin, int end) {
  constexpr float kLog2E = 1.4426950408889634f;
#pragma unroll
  for (int i = begin; i < end; i += 8) {
    float t[4], d[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      t[j] = ptx::ex2_approx_ftz(fabsf(acc[i + 2 * j]) * -kLog2E);
      d[j] = fminf(1.0f + t[j], 2.0f);
    }
    const float d01 = d[0] * d[1];
    const float d23 = d[2] * d[3];
    const float r = ptx::rcp_approx_ftz(d01 * d23);
    const float r01 = r * d23;  // 1 / (d0 d1)
    const float r23 = r * d01;  // 1 / (d2 d3)
    const float inverse[4] = {d[1] * r01, d[0] * r01, d[3] * r23, d[2] * r23};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float g = acc[i + 2 * j];
      const float n = g >= 0.0f ? 1.0f : t[j];
      acc[i + 2 * j] = g * (n * inverse[j]) * acc[i + 2 * j + 1];
    }
  }
}

// Byte offset of (row, byte) in a tile of 128-byte rows with the 128B
// swizzle (a 64 x 128 B staging panel; the narrow kernel's operand
// k-blocks): the 16-byte chunk index is XORed with row % 8.
__device__ __forceinline__ uint32_t SwizzledPanelOffset(int row, int byte) {
  return row * KernelConfig::kPanelBytes + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15));
}

template <ElementType kOut>
__device__ __forceinline__ void StoreScalar(uint8_t* address, float value) {
  if constexpr (IsHalf(kOut)) {
    *reinterpret_cast<typename HalfType<kOut>::T*>(address) = HalfType<kOut>::FromFloat(value);
  } else {
    *reinterpret_cast<float*>(address) = value;
  }
}

// Where lane `lane` of warp `warp` points ldmatrix / stmatrix .x4 in a
// 16-bit panel: at step q, matrices (rows 0-7, chunk 2q), (rows 8-15, 2q),
// (rows 0-7, 2q + 1), (rows 8-15, 2q + 1) of the warp's 16 rows, which hold
// exactly the lane's accumulator registers 8q .. 8q + 7 packed in pairs. Lane
// l addresses row l % 8 of matrix l / 8: warp row 8 * ((l / 8) % 2) + l % 8,
// chunk 2q + l / 16 of the panel, swizzled by row % 8 = l % 8.
struct FragmentMatrices {
  uint32_t row_address;
  uint32_t chunk0;
  __device__ FragmentMatrices(const uint8_t* panel, int warp, int lane)
      : row_address(static_cast<uint32_t>(__cvta_generic_to_shared(panel)) +
                    (warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * KernelConfig::kPanelBytes),
        chunk0(static_cast<uint32_t>((lane >> 4) ^ (lane & 7))) {}
  __device__ uint32_t Address(int q) const { return row_address + ((chunk0 ^ (2 * q)) << 4); }
};

// Writes this lane's outputs of one panel, held in registers [first, first +
// kChunks * 4), into `panel` (64 rows x 128 B, swizzled), for a panel wholly
// inside C's TMA columns. `first` must be a compile-time constant after
// inlining and unrolling (register arrays need constant indices).
// 16-bit outputs: one stmatrix per two 8-column chunks (FragmentMatrices).
template <ElementType kOut, bool kSwiGLU, int kAcc>
__device__ __forceinline__ void StoreFragments(uint8_t* panel, int warp, int lane, const float (&acc)[kAcc],
                                               int first) {
  using Shape = PanelShape<kOut, kSwiGLU>;
  if constexpr (IsHalf(kOut) && !kSwiGLU) {
    using Half = HalfType<kOut>;
    const FragmentMatrices matrices(panel, warp, lane);
#pragma unroll
    for (int q = 0; q < Shape::kChunks / 2; ++q) {
      const int i = first + 8 * q;
      ptx::stmatrix_x4(matrices.Address(q), Half::Pack(acc[i], acc[i + 1]), Half::Pack(acc[i + 2], acc[i + 3]),
                       Half::Pack(acc[i + 4], acc[i + 5]), Half::Pack(acc[i + 6], acc[i + 7]));
    }
  } else {
#pragma unroll
    for (int c = 0; c < Shape::kChunks; ++c) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 4 * c + 2 * half;  // this lane's register pair: (row, col) and (row, col + 1)
        const int panel_col = kSwiGLU ? AccColumn(i, lane) / 2 : AccColumn(i, lane);
        uint8_t* staged = panel + SwizzledPanelOffset(AccRow(i, warp, lane), panel_col * Shape::kOutBytes);
        if constexpr (kSwiGLU) {
          StoreScalar<kOut>(staged, acc[first + i]);
        } else if constexpr (IsHalf(kOut)) {
          *reinterpret_cast<uint32_t*>(staged) = HalfType<kOut>::Pack(acc[first + i], acc[first + i + 1]);
        } else {
          *reinterpret_cast<float2*>(staged) = make_float2(acc[first + i], acc[first + i + 1]);
        }
      }
    }
  }
}

// A warp's 16 rows of one 128-byte-wide panel of a 16-bit residual, one
// 16-byte chunk a lane and load: eight lanes read a row's whole 128-byte
// line. `rows`: the panel's first column in the warp's first row.
struct ResidualLines {
  static constexpr int kRowsPerWarp = 16;
  static constexpr int kLanesPerRow = KernelConfig::kPanelBytes / 16;
  static constexpr int kLoads = kRowsPerWarp * kLanesPerRow / 32;
  uint4 chunk[kLoads];

  // The warp row (0..15) of this lane's load j.
  __device__ static int Row(int lane, int j) { return lane / kLanesPerRow + (32 / kLanesPerRow) * j; }

  template <typename T>
  __device__ void Load(const T* rows, int64_t stride, int lane) {
    static_assert(sizeof(T) == 2, "eight elements a 16-byte chunk");
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      chunk[j] = *reinterpret_cast<const uint4*>(rows + Row(lane, j) * stride + (lane % kLanesPerRow) * 8);
    }
  }
};

// StoreFragments for a 16-bit panel (plain, inside C's TMA columns) that also
// adds a residual of the same type, through the staging buffer: the warp
// writes its residual lines into `panel`, swizzled as the output will be,
// takes its fragments back with ldmatrix (the layout stmatrix writes) and
// writes acc + residual over them (the same adds, in the same order, as
// AddResidual's). Added straight into registers, each 4-byte load of a
// fragment touches eight rows' lines: traced at 8192 tokens, the MLP
// block's down projection spent ~6.1 of its ~9.3-kcycle epilogue in those
// adds, with or without its rows in L2; this way the whole epilogue takes
// ~7.8 kcycles (bench/NOTES.md v1.65).
template <ElementType kOut, int kAcc>
__device__ __forceinline__ void StoreFragmentsAddingResidual(uint8_t* panel, const ResidualLines& lines, int warp,
                                                             int lane, const float (&acc)[kAcc], int first) {
  using Half = HalfType<kOut>;
#pragma unroll
  for (int j = 0; j < ResidualLines::kLoads; ++j) {
    const int row = warp * ResidualLines::kRowsPerWarp + ResidualLines::Row(lane, j);
    *reinterpret_cast<uint4*>(panel + SwizzledPanelOffset(row, (lane % ResidualLines::kLanesPerRow) * 16)) =
        lines.chunk[j];
  }
  __syncwarp();  // the lanes' stores, before the other lanes' ldmatrix reads
  const FragmentMatrices matrices(panel, warp, lane);
#pragma unroll
  for (int q = 0; q < PanelShape<kOut, false>::kChunks / 2; ++q) {
    // The four matrices read here are written back by the same lanes, once
    // every lane's read has returned (the stmatrix needs its results).
    const uint32_t address = matrices.Address(q);
    uint32_t r[4];
    ptx::ldmatrix_x4(address, r);
    const int i = first + 8 * q;
    // Each pair unpacked where it is added (as one float2 per pair first, ptxas
    // scheduled the kernel differently for no measured reason).
    ptx::stmatrix_x4(address, Half::Pack(acc[i] + Half::Unpack(r[0]).x, acc[i + 1] + Half::Unpack(r[0]).y),
                     Half::Pack(acc[i + 2] + Half::Unpack(r[1]).x, acc[i + 3] + Half::Unpack(r[1]).y),
                     Half::Pack(acc[i + 4] + Half::Unpack(r[2]).x, acc[i + 5] + Half::Unpack(r[2]).y),
                     Half::Pack(acc[i + 6] + Half::Unpack(r[3]).x, acc[i + 7] + Half::Unpack(r[3]).y));
  }
}

// The same for a panel of the ragged last tile column, registers [0, R):
// output columns at or past c_tma_cols (the last < 16 bytes of each row, which
// TMA cannot store exactly) go straight to global memory instead.
template <ElementType kOut, bool kSwiGLU, int kAcc>
__device__ __forceinline__ void WriteRaggedPanel(const EpilogueFields& node, uint8_t* panel, int64_t row0,
                                                 int64_t out_col_base, int warp, int lane, const float (&acc)[kAcc]) {
  using Shape = PanelShape<kOut, kSwiGLU>;
#pragma unroll
  for (int c = 0; c < Shape::kChunks; ++c) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 4 * c + 2 * half;
      const int row = AccRow(i, warp, lane);
      const int panel_col = kSwiGLU ? AccColumn(i, lane) / 2 : AccColumn(i, lane);
      uint8_t* staged = panel + SwizzledPanelOffset(row, panel_col * Shape::kOutBytes);
      const int64_t global_row = row0 + row;
#pragma unroll
      for (int e = 0; e < (kSwiGLU ? 1 : 2); ++e) {
        const int64_t col = out_col_base + panel_col + e;
        if (col < node.c_tma_cols) {
          StoreScalar<kOut>(staged + e * Shape::kOutBytes, acc[i + e]);
        } else if (global_row < node.m && col < node.out_cols) {
          StoreScalar<kOut>(static_cast<uint8_t*>(node.c) + (global_row * node.c_stride + col) * Shape::kOutBytes,
                            acc[i + e]);
        }
      }
    }
  }
}

// A tile with no fused op whose output columns are all inside C's TMA
// columns: every tile of a plain GEMM but the ragged last column, and every
// split-K partial. The panels are unrolled, so each reads its registers in
// place (the general path below rotates the array, ~100 moves a panel), and
// 16-bit outputs go through stmatrix. Measured (v1.9, bench/NOTES.md): the
// general path's epilogue took ~6 us of each ~90 us tile at 8192^3.
// residual_rows (16-bit output only; null: none): the residual, of the
// output's type, this tile adds, at its first column in this warpgroup's first
// row (StoreFragmentsAddingResidual).
template <ElementType kOut, class Config>
__device__ inline void StagePlainTile(const CtaContext<Config>& ctx, int warpgroup, RingCursor& staging,
                                      const float (&acc)[Config::kAccumulators], const void* residual_rows = nullptr,
                                      int64_t residual_stride = 0) {
  using Shape = PanelShape<kOut, false>;
  constexpr int kPanels = Config::kBlockN / Shape::kAccCols;
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  if constexpr (IsHalf(kOut)) {
    if (residual_rows != nullptr) {
      // Every panel's lines loaded first, so that they cost one round trip
      // a tile rather than one a panel.
      using T = typename HalfType<kOut>::T;
      const T* warp_rows =
          static_cast<const T*>(residual_rows) + warp * ResidualLines::kRowsPerWarp * residual_stride;
      ResidualLines lines[kPanels];
#pragma unroll
      for (int p = 0; p < kPanels; ++p) lines[p].Load(warp_rows + p * Shape::kOutCols, residual_stride, lane);
#pragma unroll
      for (int p = 0; p < kPanels; ++p) {
        WaitForStaging(ctx, warpgroup, staging);
        StoreFragmentsAddingResidual<kOut>(ctx.staging_panel(warpgroup, staging.stage), lines[p], warp, lane, acc,
                                           p * Shape::kChunks * 4);
        PublishPanel(ctx, warpgroup, staging);
      }
      return;
    }
  }
#pragma unroll
  for (int p = 0; p < kPanels; ++p) {
    WaitForStaging(ctx, warpgroup, staging);
    StoreFragments<kOut, false>(ctx.staging_panel(warpgroup, staging.stage), warp, lane, acc,
                                p * Shape::kChunks * 4);
    PublishPanel(ctx, warpgroup, staging);
  }
}

// The fused epilogue of one tile for one consumer warpgroup: per panel, the
// passes over that panel's registers, then the panel through a staging buffer.
template <ElementType kOut, bool kSwiGLU, class Config>
__device__ inline void StageTile(const CtaContext<Config>& ctx, const CtaWork& work, const EpilogueFields& node,
                                 int warpgroup, RingCursor& staging, float (&acc)[Config::kAccumulators]) {
  using Shape = PanelShape<kOut, kSwiGLU>;
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const int64_t row0 = WarpgroupRow0(work, warpgroup);
  const int64_t acc_col0 = TileCol0<Config>(work);
  const int64_t out_col0 = static_cast<int64_t>(work.n_block) * node.out_tile_n;
  const int panels = OutputPanels(node.out_cols, node.out_tile_n, Shape::kOutCols, work.n_block);
  const bool ragged = !TileInsideTmaColumns(work.n_block, node.out_tile_n, node.c_tma_cols);

  if (node.residual != nullptr) {
    const int64_t cols = int64_t{panels} * Shape::kOutCols;
    node.residual_type == Config::kHalf ? PrefetchResidualRows<HalfOf<Config>>(node, row0, out_col0, cols, warp, lane)
                                        : PrefetchResidualRows<float>(node, row0, out_col0, cols, warp, lane);
  }
  // NOTE: the panel loop is deliberately not unrolled, so one panel's code is
  // fetched once per tile and reused (unrolled, the epilogue was tens of KB of
  // straight-line code per tile, bound by instruction fetch). Register arrays
  // need compile-time indices, so the current panel always sits in
  // registers [0, kRegs): after each panel the array rotates down by kRegs.
  constexpr int kRegs = Shape::kChunks * 4;
#pragma unroll 1
  for (int p = 0; p < panels; ++p) {
    const int64_t acc_col_base = acc_col0 + p * Shape::kAccCols;
    const int64_t out_col_base = out_col0 + p * Shape::kOutCols;
    if (node.bias != nullptr) {
      const bool checked = acc_col_base + Shape::kAccCols > node.n;
      if (node.bias_type == Config::kHalf) {
        checked ? AddBias<HalfOf<Config>, true>(node, acc_col_base, lane, acc, 0, kRegs)
                : AddBias<HalfOf<Config>, false>(node, acc_col_base, lane, acc, 0, kRegs);
      } else {
        checked ? AddBias<float, true>(node, acc_col_base, lane, acc, 0, kRegs)
                : AddBias<float, false>(node, acc_col_base, lane, acc, 0, kRegs);
      }
    }
    if constexpr (kSwiGLU) {
      SwiGLURange(acc, 0, kRegs);
    } else {
      switch (node.activation) {
        case EpilogueActivation::kReLU:
          ActivateRange<EpilogueActivation::kReLU>(acc, 0, kRegs);
          break;
        case EpilogueActivation::kGELU:
          ActivateRange<EpilogueActivation::kGELU>(acc, 0, kRegs);
          break;
        case EpilogueActivation::kSiLU:
          ActivateRange<EpilogueActivation::kSiLU>(acc, 0, kRegs);
          break;
        default:
          break;
      }
    }
    if (node.residual != nullptr) {
      const bool interior =
          row0 + KernelConfig::kRowsPerConsumer <= node.m && out_col_base + Shape::kOutCols <= node.out_cols;
      if (node.residual_type == Config::kHalf) {
        AddResidual<HalfOf<Config>, kSwiGLU>(node, row0, out_col_base, warp, lane, acc, 0, kRegs, interior);
      } else {
        AddResidual<float, kSwiGLU>(node, row0, out_col_base, warp, lane, acc, 0, kRegs, interior);
      }
    }
    WaitForStaging(ctx, warpgroup, staging);
    uint8_t* panel = ctx.staging_panel(warpgroup, staging.stage);
    if (ragged) {
      WriteRaggedPanel<kOut, kSwiGLU>(node, panel, row0, out_col_base, warp, lane, acc);
    } else {
      StoreFragments<kOut, kSwiGLU>(panel, warp, lane, acc, 0);
    }
    PublishPanel(ctx, warpgroup, staging);
    if (p + 1 < panels) {
#pragma unroll
      for (int i = 0; i + kRegs < Config::kAccumulators; ++i) acc[i] = acc[i + kRegs];
    }
  }
}

// Whether AddBiasAndResidual can take this warpgroup's part of the tile: no
// activation (so an output column is an accumulator column), and every row
// and column it adds inside the bias and the residual (no checks).
template <class Config>
__device__ __forceinline__ bool AddsWholeTile(const EpilogueFields& node, const CtaWork& work, int warpgroup) {
  const int64_t col_end = TileCol0<Config>(work) + Config::kBlockN;
  return node.activation == EpilogueActivation::kNone && (node.bias == nullptr || col_end <= node.n) &&
         (node.residual == nullptr ||
          (WarpgroupRow0(work, warpgroup) + KernelConfig::kRowsPerConsumer <= node.m && col_end <= node.out_cols));
}

// acc += bias, then += residual, over the warpgroup's whole part of the tile
// at once (AddsWholeTile). All of the residual's loads can then be in flight
// together, one round trip a tile: StageTile, a panel at a time, paid one a
// panel (traced at 8192 tokens, the MLP block's down projection spent
// 12.1-12.3 us of each tile's epilogue, 6.9-7.1 this way; bench/NOTES.md
// v1.49). residual_staged: the residual (16-bit, of a 16-bit output) is left to
// StagePlainTile, which reads it in whole lines through the staging buffers.
template <class Config>
__device__ inline void AddBiasAndResidual(const EpilogueFields& node, const CtaWork& work, int warpgroup,
                                          float (&acc)[Config::kAccumulators], bool residual_staged) {
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const int64_t row0 = WarpgroupRow0(work, warpgroup);
  const int64_t col0 = TileCol0<Config>(work);
  if (node.residual != nullptr && !residual_staged) {
    node.residual_type == Config::kHalf
        ? PrefetchResidualRows<HalfOf<Config>>(node, row0, col0, Config::kBlockN, warp, lane)
        : PrefetchResidualRows<float>(node, row0, col0, Config::kBlockN, warp, lane);
  }
  if (node.bias != nullptr) {
    constexpr int kAcc = Config::kAccumulators;
    node.bias_type == Config::kHalf ? AddBias<HalfOf<Config>, false>(node, col0, lane, acc, 0, kAcc)
                                    : AddBias<float, false>(node, col0, lane, acc, 0, kAcc);
  }
  if (node.residual != nullptr && !residual_staged) {
    node.residual_type == Config::kHalf
        ? AddResidual<HalfOf<Config>, false, false, true>(node, row0, col0, warp, lane, acc, 0, Config::kAccumulators)
        : AddResidual<float, false, false, true>(node, row0, col0, warp, lane, acc, 0, Config::kAccumulators);
  }
}

// The fused epilogue into C, in the instantiation for this node's output.
// A tile whose panels TMA stores whole goes out as a plain tile
// (StagePlainTile) when it has no fused op or, with kWholeTileAdds, when its
// bias and residual can be added to the registers first (AddsWholeTile).
// The split-K kernel leaves the whole-tile adds out: beside its reduce path a
// first version of them made it spill 592 / 1784 bytes against 508 / 1524,
// and the 128-token MLP block ran 5 us slower (bench/NOTES.md v1.49).
template <bool kWholeTileAdds, class Config>
__device__ inline void StageOutput(const CtaContext<Config>& ctx, const CtaWork& work, const KernelNode& node,
                                   int warpgroup, RingCursor& staging, float (&acc)[Config::kAccumulators]) {
  const EpilogueFields fields(node);
  const bool swiglu = node.activation == EpilogueActivation::kSwiGLU;
  const bool adds = fields.bias != nullptr || fields.residual != nullptr;
  bool plain;
  if constexpr (kWholeTileAdds) {
    plain = TileInsideTmaColumns(work.n_block, fields.out_tile_n, fields.c_tma_cols) &&
            (adds ? AddsWholeTile<Config>(fields, work, warpgroup) : fields.activation == EpilogueActivation::kNone);
  } else {
    // Spelled as before the whole-tile adds: an equivalent expression
    // changed the split-K kernel's code and spills.
    plain = !adds && fields.activation == EpilogueActivation::kNone &&
            TileInsideTmaColumns(work.n_block, fields.out_tile_n, fields.c_tma_cols);
  }
  if (plain) {
    // A 16-bit residual of a 16-bit output goes through the staging buffers
    // (StoreFragmentsAddingResidual); any other, into the registers first.
    const bool residual_staged = kWholeTileAdds && fields.residual != nullptr &&
                                 fields.residual_type == Config::kHalf && node.out_type == Config::kHalf;
    if (kWholeTileAdds && adds) AddBiasAndResidual<Config>(fields, work, warpgroup, acc, residual_staged);
    if (node.out_type == Config::kHalf) {
      const HalfOf<Config>* residual_rows =
          residual_staged ? static_cast<const HalfOf<Config>*>(fields.residual) +
                                WarpgroupRow0(work, warpgroup) * fields.residual_stride + TileCol0<Config>(work)
                          : nullptr;
      StagePlainTile<Config::kHalf>(ctx, warpgroup, staging, acc, residual_rows, fields.residual_stride);
    } else {
      StagePlainTile<ElementType::kFP32>(ctx, warpgroup, staging, acc);
    }
  } else if (node.out_type == Config::kHalf) {
    if (swiglu) {
      StageTile<Config::kHalf, true>(ctx, work, fields, warpgroup, staging, acc);
    } else {
      StageTile<Config::kHalf, false>(ctx, work, fields, warpgroup, staging, acc);
    }
  } else if (swiglu) {
    StageTile<ElementType::kFP32, true>(ctx, work, fields, warpgroup, staging, acc);
  } else {
    StageTile<ElementType::kFP32, false>(ctx, work, fields, warpgroup, staging, acc);
  }
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_EPILOGUE_ROLE_CUH_
