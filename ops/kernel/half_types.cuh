// half_types.cuh: the 16-bit element types a tiled plan runs in. A plan's
// 16-bit tensors (A, B, and C, bias and residual where they are not fp32)
// are all bf16 or all fp16 (graph validation and Compile); the tiled kernel
// is instantiated for each (TiledConfig::kHalf), and HalfType<kHalf> holds
// the conversions its epilogue, split-K sums and wgmma need. The bf16 ones
// are the instructions the kernel used before fp16 existed, so the bf16
// instantiations compile to the code they had.
#ifndef LOOM_OPS_KERNEL_HALF_TYPES_CUH_
#define LOOM_OPS_KERNEL_HALF_TYPES_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernel_params.h"

namespace loom::kernel {

template <ElementType kHalf>
struct HalfType;

template <>
struct HalfType<ElementType::kBF16> {
  using T = __nv_bfloat16;
  using T2 = __nv_bfloat162;
  __device__ static float ToFloat(T value) { return __bfloat162float(value); }
  __device__ static float2 ToFloat2(T2 pair) { return __bfloat1622float2(pair); }
  __device__ static T FromFloat(float value) { return __float2bfloat16_rn(value); }
  __device__ static T2 FromFloat2(float2 pair) { return __float22bfloat162_rn(pair); }
  __device__ static uint32_t Pack(float lo, float hi) {
    const T2 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  }
  // The inverse: the two floats of a packed pair (exact: a bf16 is the high
  // half of its float).
  __device__ static float2 Unpack(uint32_t packed) {
    return make_float2(__uint_as_float(packed << 16), __uint_as_float(packed & 0xffff0000u));
  }
};

template <>
struct HalfType<ElementType::kFP16> {
  using T = __half;
  using T2 = __half2;
  __device__ static float ToFloat(T value) { return __half2float(value); }
  __device__ static float2 ToFloat2(T2 pair) { return __half22float2(pair); }
  __device__ static T FromFloat(float value) { return __float2half_rn(value); }
  __device__ static T2 FromFloat2(float2 pair) { return __float22half2_rn(pair); }
  __device__ static uint32_t Pack(float lo, float hi) {
    const T2 pair = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  }
  __device__ static float2 Unpack(uint32_t packed) { return __half22float2(*reinterpret_cast<const T2*>(&packed)); }
};

// The ElementType of a 16-bit C++ type (HalfType<kElementTypeOf<T>>::T is T).
template <typename T>
constexpr ElementType ElementTypeOfHalf() {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "a 16-bit type");
  return std::is_same_v<T, __half> ? ElementType::kFP16 : ElementType::kBF16;
}
template <typename T>
inline constexpr ElementType kElementTypeOf = ElementTypeOfHalf<T>();

// Whether an element type is one of the 16-bit ones (else fp32).
constexpr bool IsHalf(ElementType type) { return type != ElementType::kFP32; }

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_HALF_TYPES_CUH_
