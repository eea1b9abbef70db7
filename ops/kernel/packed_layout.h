// packed_layout.h: where each B stage lives in a plan's packed copy of the
// weights (CompileOptions::pack_weights), for either kernel. B [N, K] is cut
// into tiles of `tile_rows` rows (the kernel's tile width) and each tile into
// stages of `k_blocks_per_stage` k-blocks of 64 columns. A stage is stored as
// exactly the bytes the tensor loads of that stage write to shared memory:
// k-block by k-block, `tile_rows` rows of 128 bytes each, the 16-byte chunks
// of a row 128B-swizzled, zeros past N and K. Stages of a tile follow each
// other, and tiles each other. One 1-D bulk copy then fills a ring stage:
// ~7% more stream than tensor loads of the same bytes (bench/stream_probe.cu,
// bench/NOTES.md v1.20), whose rows are K apart in memory.
// Host and device code both include it; the packing itself is
// pack_weights.cu.
#ifndef LOOM_OPS_KERNEL_PACKED_LAYOUT_H_
#define LOOM_OPS_KERNEL_PACKED_LAYOUT_H_

#include <cstdint>

#include "loom/scheduler/schedule.h"

namespace loom::kernel {

struct PackedLayout {
  static constexpr int kKBlockElements = 64;  // bf16: one 128-byte swizzle row
  static constexpr int kRowBytes = 128;

  int32_t tile_rows = 0;
  int32_t k_blocks_per_stage = 0;

  LOOM_HOST_DEVICE constexpr int64_t KBlockBytes() const { return int64_t{tile_rows} * kRowBytes; }
  LOOM_HOST_DEVICE constexpr int64_t StageBytes() const { return k_blocks_per_stage * KBlockBytes(); }
  // The stages of one tile for a K of `k` (the last one in part).
  LOOM_HOST_DEVICE constexpr int64_t StagesPerTile(int64_t k) const {
    const int64_t k_blocks = (k + kKBlockElements - 1) / kKBlockElements;
    return (k_blocks + k_blocks_per_stage - 1) / k_blocks_per_stage;
  }
  // Bytes of the packed copy of a B of n rows and k columns.
  LOOM_HOST_DEVICE constexpr int64_t Bytes(int64_t n, int64_t k) const {
    return (n + tile_rows - 1) / tile_rows * StagesPerTile(k) * StageBytes();
  }
  // Byte offset of the stage that starts at k-block kb0 (a multiple of
  // k_blocks_per_stage) of tile n_block, for a B of `stages_per_tile`.
  LOOM_HOST_DEVICE constexpr int64_t StageOffset(int64_t n_block, int64_t kb0, int64_t stages_per_tile) const {
    return (n_block * stages_per_tile + kb0 / k_blocks_per_stage) * StageBytes();
  }
};

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_PACKED_LAYOUT_H_
