// The wgmma shared-memory descriptor builder against hand-computed values.
#include "wgmma_descriptor.h"

#include "gtest/gtest.h"
#include "kernel_config.h"

namespace loom::kernel {
namespace {

TEST(WgmmaDescriptorTest, FieldsOfA1024AlignedTile) {
  // Start 0x1400 (5120): 5120 >> 4 = 320 in bits 0..13; leading offset 16 B >> 4 = 1
  // in bits 16..29; stride 1024 B >> 4 = 64 in bits 32..45; swizzle 128B = 1 in bits 62..63.
  const uint64_t descriptor = MakeSwizzle128Descriptor(0x1400);
  EXPECT_EQ(descriptor & 0x3FFF, 320u);
  EXPECT_EQ((descriptor >> 16) & 0x3FFF, 1u);
  EXPECT_EQ((descriptor >> 32) & 0x3FFF, 64u);
  EXPECT_EQ((descriptor >> 49) & 0x7, 0u);
  EXPECT_EQ(descriptor >> 62, 1u);
  EXPECT_EQ(descriptor, (uint64_t{1} << 62) | (uint64_t{64} << 32) | (uint64_t{1} << 16) | 320u);
}

TEST(WgmmaDescriptorTest, KStepsAdvanceTheStartAddressBy32Bytes) {
  const uint64_t base = MakeSwizzle128Descriptor(0x8000);
  for (int k16 = 0; k16 < 4; ++k16) {
    EXPECT_EQ(AdvanceDescriptorK16(base, k16), MakeSwizzle128Descriptor(0x8000 + 32 * k16)) << k16;
  }
}

TEST(WgmmaDescriptorTest, TheLowWordAndTheConstantHighWordMakeTheDescriptor) {
  // The narrow kernel's wgmmas take the low word and build the descriptor with
  // kSwizzle128DescriptorHigh (wgmma.cuh): the same 64 bits, k16 steps too,
  // up to the last 1 KiB-aligned tile of the H200's 227 KiB.
  EXPECT_EQ(kSwizzle128DescriptorHigh, 0x40000040u);
  for (uint32_t address : {0x0u, 0x1400u, 0x8000u, 0x38C00u}) {
    const uint32_t low = Swizzle128DescriptorLow(address);
    EXPECT_EQ((uint64_t{kSwizzle128DescriptorHigh} << 32) | low, MakeSwizzle128Descriptor(address)) << address;
    for (int k16 = 0; k16 < 4; ++k16) {
      EXPECT_EQ((uint64_t{kSwizzle128DescriptorHigh} << 32) | AdvanceDescriptorLowK16(low, k16),
                AdvanceDescriptorK16(MakeSwizzle128Descriptor(address), k16))
          << address << " k16 " << k16;
    }
  }
}

TEST(WgmmaDescriptorTest, AddressIsTakenModulo256KiB) {
  // Only 14 bits of (address >> 4) exist: shared memory windows are < 256 KiB.
  EXPECT_EQ(MakeSwizzle128Descriptor(0x40000 + 0x400) & 0x3FFF, 0x400u >> 4);
}

TEST(SmemLayoutTest, DefaultRingsFitTheH200AndTilesAre1024Aligned) {
  const SmemLayout layout = ComputeSmemLayout<KernelConfig>(4, 4);
  EXPECT_LE(layout.total, 232448u);
  EXPECT_EQ(layout.a_ring % 1024, 0u);
  EXPECT_EQ(layout.b_ring % 1024, 0u);
  EXPECT_EQ(layout.staging % 1024, 0u);
  EXPECT_GT(ComputeSmemLayout<KernelConfig>(8, 8).total, 232448u);
  // 128-wide tiles: B stages of half the bytes, so twice the B stages fit.
  const SmemLayout narrow_tiles = ComputeSmemLayout<KernelConfigN128>(4, 8);
  EXPECT_EQ(narrow_tiles.total, layout.total);
  EXPECT_EQ(narrow_tiles.staging % 1024, 0u);
}

}  // namespace
}  // namespace loom::kernel
