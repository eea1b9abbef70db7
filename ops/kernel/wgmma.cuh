// wgmma.cuh: the warpgroup matrix-multiply instruction loom's MMA role issues.
#ifndef LOOM_OPS_KERNEL_WGMMA_CUH_
#define LOOM_OPS_KERNEL_WGMMA_CUH_

#include <cstdint>

#include "kernel_params.h"
#include "wgmma_descriptor.h"

namespace loom::kernel {

// The accumulator operands of the m64nNk16 forms below: "+f" for each of a
// thread's d[0..N/2), and their %0..%(N/2 - 1) list in the instruction.
#define LOOM_WGMMA_D8(d, i)                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define LOOM_WGMMA_D64(d)                                                                                  \
  LOOM_WGMMA_D8(d, 0), LOOM_WGMMA_D8(d, 8), LOOM_WGMMA_D8(d, 16), LOOM_WGMMA_D8(d, 24), LOOM_WGMMA_D8(d, 32), \
      LOOM_WGMMA_D8(d, 40), LOOM_WGMMA_D8(d, 48), LOOM_WGMMA_D8(d, 56)
#define LOOM_WGMMA_D128(d)                                                                                      \
  LOOM_WGMMA_D64(d), LOOM_WGMMA_D8(d, 64), LOOM_WGMMA_D8(d, 72), LOOM_WGMMA_D8(d, 80), LOOM_WGMMA_D8(d, 88), \
      LOOM_WGMMA_D8(d, 96), LOOM_WGMMA_D8(d, 104), LOOM_WGMMA_D8(d, 112), LOOM_WGMMA_D8(d, 120)
#define LOOM_WGMMA_REGS64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define LOOM_WGMMA_REGS128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// One wgmma.mma_async of shape `shape` ("m64n256k16"), operand types `types`
// ("bf16.bf16" or "f16.f16"), accumulators `regs` / `operands` (above), both
// operands from shared memory through the 64-bit descriptors desc_a, desc_b
// (asm operands `da`, `db`: the two numbers after the accumulators); scale-d
// is the predicate `accumulate` (operand `scale`); A and B not negated, not
// transposed.
#define LOOM_WGMMA_SS(shape, types, regs, operands, da, db, scale)                          \
  asm volatile("{\n"                                                                        \
               ".reg .pred p;\n"                                                            \
               "setp.ne.b32 p, " scale ", 0;\n"                                             \
               "wgmma.mma_async.sync.aligned." shape ".f32." types " " regs ", " da ", " db \
               ", p, 1, 1, 0, 0;\n"                                                         \
               "}\n"                                                                        \
               : operands                                                                   \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int32_t>(accumulate)))

// One of the forms above or below (`form`: LOOM_WGMMA_SS or
// LOOM_WGMMA_SS_LOW) in the enclosing template's 16-bit type kHalf, fp16 or
// bf16 (the type is part of the instruction's text, so each is its own asm
// statement). `operands` is the accumulator list's macro and `d` its array,
// apart: an expanded list would reach `form` as many arguments.
#define LOOM_WGMMA_IN_HALF_TYPE(form, shape, regs, operands, d, x, y, z) \
  if constexpr (kHalf == ElementType::kFP16) {                          \
    form(shape, "f16.f16", regs, operands(d), x, y, z);                 \
  } else {                                                              \
    form(shape, "bf16.bf16", regs, operands(d), x, y, z);               \
  }

// wgmma.mma_async m64n256k16, BF16 x BF16 (kHalf) or FP16 x FP16 -> FP32,
// both operands from shared memory (K-major, through descriptors). d[128] is
// this thread's share of the warpgroup's 64 x 256 accumulator tile:
//   d[i] holds row  16 * warp + lane / 4 + 8 * ((i / 2) % 2)
//             col   8 * (i / 4) + 2 * (lane % 4) + i % 2
// accumulate == false overwrites d (D = A*B) instead of adding (D = A*B + D).
// Asynchronous: d is undefined until wgmma_wait_group says the group is done.
template <ElementType kHalf>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                 bool accumulate) {
  LOOM_WGMMA_IN_HALF_TYPE(LOOM_WGMMA_SS, "m64n256k16", LOOM_WGMMA_REGS128, LOOM_WGMMA_D128, d, "%128", "%129", "%130")
}

// wgmma.mma_async m64n128k16: as m64n256k16, the first 64 registers' layout.
template <ElementType kHalf>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 bool accumulate) {
  LOOM_WGMMA_IN_HALF_TYPE(LOOM_WGMMA_SS, "m64n128k16", LOOM_WGMMA_REGS64, LOOM_WGMMA_D64, d, "%64", "%65", "%66")
}


// The accumulator lists of the two forms below.
#define LOOM_WGMMA_D16(d) LOOM_WGMMA_D8(d, 0), LOOM_WGMMA_D8(d, 8)
#define LOOM_WGMMA_D32(d) LOOM_WGMMA_D16(d), LOOM_WGMMA_D8(d, 16), LOOM_WGMMA_D8(d, 24)
#define LOOM_WGMMA_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define LOOM_WGMMA_REGS32                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

// As LOOM_WGMMA_SS, but from the descriptors' low words desc_a_low,
// desc_b_low (asm operands `a_low`, `b_low`) and the constant high word
// (operand `high`), always accumulating.
#define LOOM_WGMMA_SS_LOW(shape, types, regs, operands, a_low, b_low, high)                      \
  asm volatile("{\n"                                                                             \
               ".reg .pred p;\n"                                                                 \
               ".reg .b32 high;\n"                                                               \
               ".reg .b64 da, db;\n"                                                             \
               "mov.b32 high, " high ";\n"                                                       \
               "mov.b64 da, {" a_low ", high};\n"                                                \
               "mov.b64 db, {" b_low ", high};\n"                                                \
               "setp.ne.b32 p, 1, 0;\n" /* accumulate: D = A*B + D */                            \
               "wgmma.mma_async.sync.aligned." shape ".f32." types " " regs ", da, db, p, 1, 1, 0, 0;\n" \
               "}\n"                                                                             \
               : operands                                                                        \
               : "r"(desc_a_low), "r"(desc_b_low), "n"(kSwizzle128DescriptorHigh))

// wgmma.mma_async m64n32k16, BF16 x BF16 (kHalf) or FP16 x FP16 -> FP32,
// both operands from shared memory (K-major, 128B-swizzled tiles, through
// descriptors given by their low words: Swizzle128DescriptorLow; the high
// word is the constant kSwizzle128DescriptorHigh): the narrow decode
// kernel's 64 x 32 tile (narrow_consumer_role.cuh, RunWgmmaJob). d[16] holds the same
// rows and columns as the first 16 registers of the m64n256k16 layout above
// (columns 0..31). Always accumulates (D = A*B + D). Asynchronous, as above.
// NOTE: the low words only, the high word a constant inside the asm: given
// whole 64-bit descriptors, ptxas built each of a stage's 32 with a 64-bit
// add with carry (IADD3 + IMAD.X) before moving both halves to uniform
// registers: 244 instructions a stage in RunWgmmaJob's loop against 190 now
// (cuobjdump on the H200), and the MLP block at 48 / 64 tokens took
// 103.9-104.2 / 104.7-105.0 us against 99.4-99.6 / 101.7-101.9
// (bench/NOTES.md v1.31). (m64n256k16 and m64n128k16 above keep 64-bit
// descriptors: four a k-block, each 128 or 64 cycles of tensor work, hide
// their arithmetic; low words there, with the next slots tested early, took
// a 128-wide k-block from ~727 to ~714 cycles and the timed runs nowhere,
// v1.64.)
template <ElementType kHalf>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint32_t desc_a_low, uint32_t desc_b_low) {
  LOOM_WGMMA_IN_HALF_TYPE(LOOM_WGMMA_SS_LOW, "m64n32k16", LOOM_WGMMA_REGS16, LOOM_WGMMA_D16, d, "%16", "%17", "%18")
}

// The same, m64n64k16: the 17-32-row jobs' paired k-blocks (narrow_consumer_role.cuh,
// RunPairedWgmmaJob). d[32] holds the first 32 registers of the m64n256k16
// layout (columns 0..63).
template <ElementType kHalf>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint32_t desc_a_low, uint32_t desc_b_low) {
  LOOM_WGMMA_IN_HALF_TYPE(LOOM_WGMMA_SS_LOW, "m64n64k16", LOOM_WGMMA_REGS32, LOOM_WGMMA_D32, d, "%32", "%33", "%34")
}

#undef LOOM_WGMMA_IN_HALF_TYPE
#undef LOOM_WGMMA_SS_LOW
#undef LOOM_WGMMA_SS
#undef LOOM_WGMMA_REGS128
#undef LOOM_WGMMA_REGS64
#undef LOOM_WGMMA_REGS32
#undef LOOM_WGMMA_REGS16
#undef LOOM_WGMMA_D128
#undef LOOM_WGMMA_D64
#undef LOOM_WGMMA_D32
#undef LOOM_WGMMA_D16
#undef LOOM_WGMMA_D8

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_WGMMA_CUH_
