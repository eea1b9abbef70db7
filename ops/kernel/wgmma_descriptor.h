// wgmma_descriptor.h: the 64-bit shared-memory matrix descriptor that wgmma
// reads its operands through. Host and device code: the CPU tests check it
// against hand-computed values (tests/wgmma_descriptor_test.cc).
//
// Layout of the descriptor (PTX ISA, "Matrix Descriptor Format"):
//   bits  0..13  start address        >> 4
//   bits 16..29  leading byte offset  >> 4  (unused for swizzled K-major tiles)
//   bits 32..45  stride byte offset   >> 4  (distance between 8-row groups)
//   bits 49..51  base offset                (0: tiles start 1024-byte aligned)
//   bits 62..63  swizzle mode               (1 = 128B, 2 = 64B, 3 = 32B)
#ifndef LOOM_OPS_KERNEL_WGMMA_DESCRIPTOR_H_
#define LOOM_OPS_KERNEL_WGMMA_DESCRIPTOR_H_

#include <cstdint>

#include "loom/scheduler/schedule.h"  // LOOM_HOST_DEVICE

namespace loom::kernel {

// A K-major operand tile of 128-byte rows (64 bf16) stored with the 128B
// swizzle, as TMA writes it: 8-row groups are 1024 bytes apart. The high
// word (stride and swizzle mode) is the same for every such tile; the low
// word holds the start address (and the ignored leading byte offset, 1).
// High word: the stride, 8 rows x 128 bytes >> 4, in bits 32..45; the 128B
// swizzle mode, 1, in bits 62..63.
inline constexpr uint32_t kSwizzle128DescriptorHigh = (1024 >> 4) | (1u << (62 - 32));
LOOM_HOST_DEVICE constexpr uint32_t Swizzle128DescriptorLow(uint32_t smem_address) {
  constexpr uint32_t kLeadingBytes = 16;  // ignored by the hardware here; 1 after the shift
  return ((smem_address & 0x3FFFF) >> 4) | ((kLeadingBytes >> 4) << 16);
}
LOOM_HOST_DEVICE constexpr uint64_t MakeSwizzle128Descriptor(uint32_t smem_address) {
  return (static_cast<uint64_t>(kSwizzle128DescriptorHigh) << 32) | Swizzle128DescriptorLow(smem_address);
}

// Moving along K inside the 128-byte swizzle row: k16 steps of 16 bf16 = 32 B
// add 2 to the (>> 4) start-address field. The hardware applies the swizzle to
// the full address, so the row-relative advance is valid for a 1024-aligned tile.
// (Shared memory ends below 256 KiB, so the field never carries out.)
LOOM_HOST_DEVICE constexpr uint64_t AdvanceDescriptorK16(uint64_t descriptor, int k16) {
  return descriptor + static_cast<uint64_t>(k16) * (32 >> 4);
}
LOOM_HOST_DEVICE constexpr uint32_t AdvanceDescriptorLowK16(uint32_t low, int k16) {
  return low + static_cast<uint32_t>(k16) * (32 >> 4);
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_WGMMA_DESCRIPTOR_H_
