// pack_weights.cu: B [N, K] into a kernel's stage order (packed_layout.h),
// one thread per 16-byte chunk.
#include "pack_weights.h"

#include <cstdint>

namespace loom::kernel {
namespace {

constexpr int64_t kChunkBytes = 16;
constexpr int64_t kChunkElements = kChunkBytes / 2;
constexpr int64_t kChunksPerRow = PackedLayout::kRowBytes / kChunkBytes;  // 8

struct PackArgs {
  const uint16_t* b;
  int64_t n, k, row_stride;
  int64_t tile_rows;
  int64_t chunks_per_k_block;  // one k-block of a tile: tile_rows rows
  int64_t chunks_per_stage;
  int64_t k_blocks_per_stage;
  int64_t stages_per_tile;
  int64_t chunks;
  uint4* packed;
};

// Chunk q of the packed matrix: stage block q / chunks_per_stage (tile by
// tile, stage by stage), then k-block, row and the chunk's place in its
// 128-byte row. TMA's 128B swizzle puts logical chunk c of row r at place
// c ^ (r % 8) (each k-block of a stage starts 1 KiB aligned), so the chunk at
// place p holds logical chunk p ^ (r % 8).
__global__ void PackKernel(const PackArgs args) {
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; q < args.chunks;
       q += int64_t{gridDim.x} * blockDim.x) {
    const int64_t block = q / args.chunks_per_stage;
    const int64_t in_stage = q % args.chunks_per_stage;
    const int64_t tile = block / args.stages_per_tile;
    const int64_t stage = block % args.stages_per_tile;
    const int64_t k_block = stage * args.k_blocks_per_stage + in_stage / args.chunks_per_k_block;
    const int64_t row = in_stage % args.chunks_per_k_block / kChunksPerRow;
    const int64_t place = in_stage % kChunksPerRow;
    const int64_t logical = place ^ (row % 8);
    const int64_t n = tile * args.tile_rows + row;
    const int64_t k0 = k_block * PackedLayout::kKBlockElements + logical * kChunkElements;
    uint4 chunk = make_uint4(0, 0, 0, 0);
    if (n < args.n && k0 < args.k) {
      const uint16_t* src = args.b + n * args.row_stride + k0;
      if (k0 + kChunkElements <= args.k) {
        chunk = *reinterpret_cast<const uint4*>(src);  // 16-byte aligned: the row stride and k0 are
      } else {
        uint32_t words[kChunkElements / 2] = {};
#pragma unroll
        for (int e = 0; e < kChunkElements; ++e) {
          if (k0 + e < args.k) words[e / 2] |= uint32_t{src[e]} << (16 * (e % 2));
        }
        chunk = make_uint4(words[0], words[1], words[2], words[3]);
      }
    }
    args.packed[q] = chunk;
  }
}

// Does nothing: OrderAfterPacking's stand-in for the pack kernels before it.
__global__ void PackingDoneKernel() {}

}  // namespace

cudaError_t PackWeights(const void* b, int64_t n, int64_t k, int64_t row_stride, PackedLayout layout, void* packed,
                        cudaStream_t stream) {
  PackArgs args;
  args.b = static_cast<const uint16_t*>(b);
  args.n = n;
  args.k = k;
  args.row_stride = row_stride;
  args.tile_rows = layout.tile_rows;
  args.chunks_per_k_block = layout.KBlockBytes() / kChunkBytes;
  args.chunks_per_stage = layout.StageBytes() / kChunkBytes;
  args.k_blocks_per_stage = layout.k_blocks_per_stage;
  args.stages_per_tile = layout.StagesPerTile(k);
  args.chunks = layout.Bytes(n, k) / kChunkBytes;
  args.packed = static_cast<uint4*>(packed);
  if (args.chunks == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (args.chunks + kThreads - 1) / kThreads;
  // Launched through cudaLaunchKernelEx, whose result is this launch's own:
  // cudaGetLastError after <<<>>> would also report (and clear) an earlier
  // error of the caller's.
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks < 65536 ? blocks : 65536));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  return cudaLaunchKernelEx(&config, PackKernel, args);
}

cudaError_t OrderAfterPacking(cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  config.stream = stream;
  return cudaLaunchKernelEx(&config, PackingDoneKernel);
}

}  // namespace loom::kernel
