// epilogue_role.cuh: from accumulators to global memory.
//
// Consumer side (each consumer warpgroup, after its main loop): applies the
// fused epilogue in FP32, out = activation(acc + bias) + residual, or for
// SwiGLU out[j] = silu(acc[2j] + bias[2j]) * (acc[2j+1] + bias[2j+1]) +
// residual, converts to the output type and writes 64-row x 128-byte panels
// into its staging buffers (128B swizzled, the layout the TMA store reads).
// Store side (one thread of the producer warpgroup): issues a TMA store per
// staged panel (clipped to the tensor by the hardware), and once the tile's
// stores are complete marks the tile's flag with the launch epoch.
// Protocol and fences: cta_context.cuh.
#ifndef LOOM_OPS_KERNEL_EPILOGUE_ROLE_CUH_
#define LOOM_OPS_KERNEL_EPILOGUE_ROLE_CUH_

#include <cuda_bf16.h>

#include "cta_context.cuh"
#include "mma_role.cuh"

namespace loom::kernel {

// How a tile's output splits into 128-byte-wide panels.
template <ElementType kOut, bool kSwiGLU>
struct PanelShape {
  static constexpr int kOutBytes = kOut == ElementType::kBF16 ? 2 : 4;
  static constexpr int kOutCols = KernelConfig::kPanelBytes / kOutBytes;  // output columns per panel
  static constexpr int kAccCols = kOutCols * (kSwiGLU ? 2 : 1);          // accumulator columns per panel
  static constexpr int kChunks = kAccCols / 8;  // 8-column accumulator chunks (4 registers each)
  static constexpr int kPanels = KernelConfig::kBlockN / kAccCols;
};

// Panels of this tile that hold at least one output column (the rest are
// past the tensor's last column and are neither staged nor stored).
__device__ inline int OutputPanels(const KernelNode& node, int32_t n_block) {
  const int out_bytes = node.out_type == ElementType::kBF16 ? 2 : 4;
  const int cols_per_panel = KernelConfig::kPanelBytes / out_bytes;
  const int64_t out_col0 = static_cast<int64_t>(n_block) * node.schedule.out_tile_n;
  const int64_t remaining = node.schedule.out_cols - out_col0;
  const int64_t panels = (remaining + cols_per_panel - 1) / cols_per_panel;
  const int tile_panels = node.schedule.out_tile_n / cols_per_panel;
  return panels < tile_panels ? static_cast<int>(panels) : tile_panels;
}

__device__ inline float Activate(EpilogueActivation activation, float v) {
  switch (activation) {
    case EpilogueActivation::kReLU:
      return fmaxf(v, 0.0f);
    case EpilogueActivation::kGELU:
      return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    case EpilogueActivation::kSiLU:
      return v / (1.0f + __expf(-v));
    default:
      return v;
  }
}

__device__ inline float LoadAsFloat(const void* base, ElementType type, int64_t index) {
  if (type == ElementType::kBF16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
  }
  return static_cast<const float*>(base)[index];
}

// Byte offset of (row, byte) in a 64 x 128 B panel with the 128B swizzle:
// the 16-byte chunk index is XORed with row % 8.
__device__ inline uint32_t SwizzledPanelOffset(int row, int byte) {
  return row * KernelConfig::kPanelBytes + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15));
}

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

// One output element: into the staging panel when its column is in the
// TMA-stored prefix, else straight to global memory (inside the tensor only).
template <ElementType kOut>
__device__ inline void StoreOutput(const EpilogueFields& node, uint8_t* staged, int64_t row, int64_t col,
                                   float value) {
  if (col < node.c_tma_cols) {
    if constexpr (kOut == ElementType::kBF16) {
      *reinterpret_cast<__nv_bfloat16*>(staged) = __float2bfloat16_rn(value);
    } else {
      *reinterpret_cast<float*>(staged) = value;
    }
  } else if (row < node.m && col < node.out_cols) {
    if constexpr (kOut == ElementType::kBF16) {
      static_cast<__nv_bfloat16*>(node.c)[row * node.c_stride + col] = __float2bfloat16_rn(value);
    } else {
      static_cast<float*>(node.c)[row * node.c_stride + col] = value;
    }
  }
}

template <ElementType kOut, bool kSwiGLU>
__device__ inline bool StageTile(const CtaContext& ctx, const CtaWork& work, int warpgroup,
                                 RingCursor& staging, const float (&acc)[128], int job_index) {
  using Shape = PanelShape<kOut, kSwiGLU>;
  const EpilogueFields node(*work.node);
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const int64_t row0 = static_cast<int64_t>(work.m_block) * KernelConfig::kBlockM +
                       warpgroup * KernelConfig::kRowsPerConsumer;
  const int64_t acc_col0 = static_cast<int64_t>(work.n_block) * KernelConfig::kBlockN;
  const int64_t out_col0 = static_cast<int64_t>(work.n_block) * node.out_tile_n;
  const int panels = OutputPanels(*work.node, work.n_block);

#pragma unroll
  for (int p = 0; p < Shape::kPanels; ++p) {
    if (p >= panels) break;
    uint64_t* empty = &ctx.barriers->staging_empty[warpgroup][staging.stage];
    if (!ctx.watchdog.WaitBarrier(empty, staging.phase ^ 1, WaitKind::kStaging, job_index)) return false;
    uint8_t* panel = ctx.staging_panel(warpgroup, staging.stage);
#pragma unroll
    for (int c = p * Shape::kChunks; c < (p + 1) * Shape::kChunks; ++c) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp * 16 + lane / 4 + 8 * half;  // in this warpgroup's 64 rows
        const int acc_col = 8 * c + 2 * (lane % 4);       // even accumulator column in the tile
        float v0 = acc[4 * c + 2 * half];
        float v1 = acc[4 * c + 2 * half + 1];
        if (node.bias != nullptr) {
          const int64_t col = acc_col0 + acc_col;
          if (col < node.n) v0 += LoadAsFloat(node.bias, node.bias_type, col);
          if (col + 1 < node.n) v1 += LoadAsFloat(node.bias, node.bias_type, col + 1);
        }
        const int64_t global_row = row0 + row;
        if constexpr (kSwiGLU) {
          const int out_col = acc_col / 2;  // in the tile
          float out = v0 / (1.0f + __expf(-v0)) * v1;
          if (node.residual != nullptr && global_row < node.m && out_col0 + out_col < node.out_cols) {
            out += LoadAsFloat(node.residual, node.residual_type,
                               global_row * node.residual_stride + out_col0 + out_col);
          }
          const int byte = (out_col - p * Shape::kOutCols) * Shape::kOutBytes;
          StoreOutput<kOut>(node, panel + SwizzledPanelOffset(row, byte), global_row, out_col0 + out_col, out);
        } else {
          v0 = Activate(node.activation, v0);
          v1 = Activate(node.activation, v1);
          if (node.residual != nullptr && global_row < node.m) {
            const int64_t col = out_col0 + acc_col;
            const int64_t base = global_row * node.residual_stride;
            if (col < node.out_cols) v0 += LoadAsFloat(node.residual, node.residual_type, base + col);
            if (col + 1 < node.out_cols) {
              v1 += LoadAsFloat(node.residual, node.residual_type, base + col + 1);
            }
          }
          const int byte = (acc_col - p * Shape::kOutCols) * Shape::kOutBytes;
          const int64_t col = out_col0 + acc_col;
          if (col + 1 < node.c_tma_cols) {  // both in the TMA-stored part: one paired staging store
            if constexpr (kOut == ElementType::kBF16) {
              *reinterpret_cast<__nv_bfloat162*>(panel + SwizzledPanelOffset(row, byte)) =
                  __floats2bfloat162_rn(v0, v1);
            } else {
              *reinterpret_cast<float2*>(panel + SwizzledPanelOffset(row, byte)) = make_float2(v0, v1);
            }
          } else {
            StoreOutput<kOut>(node, panel + SwizzledPanelOffset(row, byte), global_row, col, v0);
            StoreOutput<kOut>(node, panel + SwizzledPanelOffset(row, byte + Shape::kOutBytes), global_row, col + 1,
                              v1);
          }
        }
      }
    }
    // Generic-proxy writes that the TMA store (async proxy) will read.
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
    cuda::ptx::mbarrier_arrive(&ctx.barriers->staging_full[warpgroup][staging.stage]);
    staging.Advance(KernelConfig::kStagingBuffers);
  }
  return true;
}

// The consumer warpgroup: main loop, then the fused epilogue, job after job.
__device__ inline void RunConsumer(const CtaContext& ctx, int warpgroup) {
  const bool lane0 = (threadIdx.x % 32) == 0;
  JobStream jobs;
  RingCursor a_ring, b_ring, staging;
  float accumulators[128];
  for (;;) {
    const int index = jobs.Next(ctx, /*releasing=*/lane0);
    if (index < 0) return;
    const CtaWork work = ResolveJob(ctx, index);
    if (work.job->kind != static_cast<uint8_t>(sched::JobKind::kGemm)) continue;
    if (!RunMainLoop(ctx, work, index, warpgroup, a_ring, b_ring, accumulators)) return;
    const KernelNode& node = *work.node;
    const int64_t row0 = static_cast<int64_t>(work.m_block) * KernelConfig::kBlockM +
                         warpgroup * KernelConfig::kRowsPerConsumer;
    if (!work.in_range || row0 >= node.schedule.m) continue;  // the store thread skips it too
    const bool swiglu = node.activation == EpilogueActivation::kSwiGLU;
    bool ok;
    if (node.out_type == ElementType::kBF16) {
      ok = swiglu ? StageTile<ElementType::kBF16, true>(ctx, work, warpgroup, staging, accumulators, index)
                  : StageTile<ElementType::kBF16, false>(ctx, work, warpgroup, staging, accumulators, index);
    } else {
      ok = swiglu ? StageTile<ElementType::kFP32, true>(ctx, work, warpgroup, staging, accumulators, index)
                  : StageTile<ElementType::kFP32, false>(ctx, work, warpgroup, staging, accumulators, index);
    }
    if (!ok) return;
  }
}

// The store thread.
__device__ inline void RunStore(const CtaContext& ctx) {
  JobStream jobs;
  RingCursor staging[KernelConfig::kConsumerWarpgroups];
  for (;;) {
    const int index = jobs.Next(ctx, /*releasing=*/true);
    if (index < 0) break;
    const CtaWork work = ResolveJob(ctx, index);
    if (work.job->kind != static_cast<uint8_t>(sched::JobKind::kGemm) || !work.in_range) continue;
    const KernelNode& node = *work.node;
    const int panels = OutputPanels(node, work.n_block);
    const int cols_per_panel = KernelConfig::kPanelBytes / (node.out_type == ElementType::kBF16 ? 2 : 4);
    const int64_t row0 = static_cast<int64_t>(work.m_block) * KernelConfig::kBlockM;
    const int64_t out_col0 = static_cast<int64_t>(work.n_block) * node.schedule.out_tile_n;
    // One store stays in flight: a panel's buffer is handed back once the
    // next store is issued and wait_group.read<1> says the older one was read.
    uint64_t* pending_empty = nullptr;
    for (int p = 0; p < panels; ++p) {
      for (int w = 0; w < KernelConfig::kConsumerWarpgroups; ++w) {
        const int64_t rows = row0 + w * KernelConfig::kRowsPerConsumer;
        if (rows >= node.schedule.m) continue;
        RingCursor& cursor = staging[w];
        if (!ctx.watchdog.WaitBarrier(&ctx.barriers->staging_full[w][cursor.stage], cursor.phase,
                                      WaitKind::kStaging, index)) {
          cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
          return;
        }
        const int64_t panel_col0 = out_col0 + p * cols_per_panel;
        if (panel_col0 < node.c_tma_cols) {  // else the consumers stored this panel directly
          const int32_t coords[2] = {static_cast<int32_t>(panel_col0), static_cast<int32_t>(rows)};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, &node.c_map,
                                          coords, ctx.staging_panel(w, cursor.stage));
        }
        cuda::ptx::cp_async_bulk_commit_group();  // possibly empty: keeps the group count uniform
        if (pending_empty != nullptr) {
          cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{});
          cuda::ptx::mbarrier_arrive(pending_empty);
        }
        pending_empty = &ctx.barriers->staging_empty[w][cursor.stage];
        cursor.Advance(KernelConfig::kStagingBuffers);
      }
    }
    if (pending_empty != nullptr) {
      cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
      cuda::ptx::mbarrier_arrive(pending_empty);
    }
    if (node.has_dependents) {
      // Completed (not just read), then visible to generic-proxy acquirers,
      // then published.
      cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
      cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
      ptx::st_release_gpu(&ctx.params.flags[sched::OutputFlagIndex(node.schedule, work.m_block, work.n_block)],
                          ctx.epoch);
    }
  }
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_EPILOGUE_ROLE_CUH_
