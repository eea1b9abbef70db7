// wgmma.cuh: the warpgroup matrix-multiply instruction loom's MMA role issues.
#ifndef LOOM_OPS_KERNEL_WGMMA_CUH_
#define LOOM_OPS_KERNEL_WGMMA_CUH_

#include <cstdint>

#include "wgmma_descriptor.h"

namespace loom::kernel {

// wgmma.mma_async m64n256k16, BF16 x BF16 -> FP32, both operands from shared
// memory (K-major, through descriptors). d[128] is this thread's share of the
// warpgroup's 64 x 256 accumulator tile:
//   d[i] holds row  16 * warp + lane / 4 + 8 * ((i / 2) % 2)
//             col   8 * (i / 4) + 2 * (lane % 4) + i % 2
// accumulate == false overwrites d (D = A*B) instead of adding (D = A*B + D).
// Asynchronous: d is undefined until wgmma_wait_group says the group is done.
__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[128], uint64_t desc_a,
                                                      uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 \n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,\n"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,\n"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,\n"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,\n"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},\n"
      " %128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int32_t>(accumulate)));
}

// wgmma.mma_async m64n128k16: as m64n256k16, the first 64 registers' layout.
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a,
                                                      uint64_t desc_b, bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 \n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},\n"
      " %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int32_t>(accumulate)));
}

// wgmma.mma_async m64n32k16, BF16 x BF16 -> FP32, both operands from shared
// memory (K-major, 128B-swizzled tiles, through descriptors given by their low
// words: Swizzle128DescriptorLow; the high word is the constant
// kSwizzle128DescriptorHigh): the narrow decode kernel's 64 x 32 tile
// (narrow_gemm.cu, RunWgmmaJob). d[16] holds the same rows and columns as the
// first 16 registers of the m64n256k16 layout above (columns 0..31). Always
// accumulates (D = A*B + D). Asynchronous, as above.
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
__device__ __forceinline__ void wgmma_m64n32k16_bf16_ss(float (&d)[16], uint32_t desc_a_low, uint32_t desc_b_low) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      ".reg .b32 high;\n"
      ".reg .b64 da, db;\n"
      "mov.b32 high, %18;\n"
      "mov.b64 da, {%16, high};\n"
      "mov.b64 db, {%17, high};\n"
      "setp.ne.b32 p, 1, 0;\n"  // accumulate: D = A*B + D
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 \n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},\n"
      " da, db, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(desc_a_low), "r"(desc_b_low), "n"(kSwizzle128DescriptorHigh));
}

// The same, m64n64k16: the 17-32-row jobs' paired k-blocks (narrow_gemm.cu,
// RunPairedWgmmaJob). d[32] holds the first 32 registers of the m64n256k16
// layout (columns 0..63).
__device__ __forceinline__ void wgmma_m64n64k16_bf16_ss(float (&d)[32], uint32_t desc_a_low, uint32_t desc_b_low) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      ".reg .b32 high;\n"
      ".reg .b64 da, db;\n"
      "mov.b32 high, %34;\n"
      "mov.b64 da, {%32, high};\n"
      "mov.b64 db, {%33, high};\n"
      "setp.ne.b32 p, 1, 0;\n"  // accumulate: D = A*B + D
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 \n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
      " da, db, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(desc_a_low), "r"(desc_b_low), "n"(kSwizzle128DescriptorHigh));
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_WGMMA_CUH_
