// narrow_epilogue.cuh: the narrow kernel's fused epilogue, straight from the
// consumer's registers into C (and, for the tagged handoff, C's tagged
// words), and the publisher that releases each finished tile's flag
// (protocol: narrow_context.cuh).
#ifndef LOOM_OPS_KERNEL_NARROW_EPILOGUE_CUH_
#define LOOM_OPS_KERNEL_NARROW_EPILOGUE_CUH_

#include <cuda/ptx>
#include <cuda_bf16.h>

#include "epilogue_role.cuh"
#include "narrow_context.cuh"

namespace loom::kernel {

// The publisher: per job, the consumer warps' handoff of the finished tile,
// then the release of its flag (protocol: narrow_context.cuh).
// kPairSplit: a pair split's first half hands over its partial sums
// instead (RunPairSplitJob), whose flag it releases.
template <bool kPairSplit>
__device__ void RunNarrowPublisher(const NarrowContext& ctx) {
  JobStream jobs;
  RingCursor handoff;
  for (;;) {
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    const CtaWork work = ResolveJob(ctx, index);
    WaitPhase(&ctx.barriers->publish_full[handoff.stage], handoff.phase);
    if (kPairSplit && !sched::JobRunsEpilogue(work.node->schedule, *work.job)) {
      const sched::NodeSchedule& schedule = work.node->schedule;
      ptx::st_release_gpu(
          &ctx.params.flags[sched::PartialFlagIndex(schedule, work.m_block, work.n_block, work.job->split)],
          ctx.epoch);
    } else if (work.node->has_dependents) {
      const sched::NodeSchedule& schedule = work.node->schedule;
      ptx::st_release_gpu(&ctx.params.flags[sched::OutputFlagIndex(schedule, work.m_block, work.n_block)],
                          ctx.epoch);
    }
    RecordTrace(ctx, index, true, &DeviceJobTrace::published);
    cuda::ptx::mbarrier_arrive(&ctx.barriers->publish_empty[handoff.stage]);
    handoff.Advance(NarrowConfig::kJobSlots);
  }
}

// C[row][col] = value, in C's element type: the plan's 16-bit type kHalf or
// fp32.
template <ElementType kHalf>
__device__ __forceinline__ void StoreOutput(const EpilogueFields& node, ElementType out_type, int64_t row, int64_t col,
                                            float value) {
  uint8_t* c = static_cast<uint8_t*>(node.c);
  if (out_type == kHalf) {
    StoreScalar<kHalf>(c + (row * node.c_stride + col) * 2, value);
  } else {
    StoreScalar<ElementType::kFP32>(c + (row * node.c_stride + col) * 4, value);
  }
}

// The fused epilogue of one 64 x 32 tile, from this thread's 16 accumulators
// straight into C: out = activation(acc + bias) + residual, or for SwiGLU
// silu(gate + bias) * (up + bias) + residual (gate and up in adjacent
// accumulator columns), in that order, as in epilogue_role.cuh. Register
// 4c + 2h + e holds row 16 * warp + lane / 4 + 8h, column 8c + 2 * (lane % 4)
// + e (wgmma.cuh). Only rows inside M and the job's row block and columns
// inside the output are stored.
// It is built when the job starts and reads its bias and residual values as
// soon as they may be read (Prefetch: after the job's first A stage is full,
// so after the A loader waited for their producers), all while the main loop
// runs: read after it, the node's fields and then those values were two
// round trips to L2 (~2 us traced) between a tile's last wgmma and its flag.
// kHalf: the plan's 16-bit type (a bias, residual or C not of it is fp32).
template <ElementType kHalf>
class NarrowEpilogue {
 public:
  // block_m: the rows of the plan's row blocks (NarrowContext::tile).
  // tile_n, part: a pair split's 64-column tile (NarrowConfig::
  // kPairSplitBlockN) is two epilogues, its columns 32 * part onwards.
  __device__ NarrowEpilogue(const CtaWork& work, int32_t block_m, int warp, int lane,
                            int32_t tile_n = NarrowConfig::kBlockN, int part = 0)
      : node_(*work.node),
        out_type_(work.node->out_type),
        row0_(int64_t{work.m_block} * block_m + warp * 16 + lane / 4),
        col0_(int64_t{work.n_block} * tile_n + NarrowConfig::kBlockN * part + 2 * (lane % 4)) {
    // A row block shorter than the wgmma's 64 rows stores only its own: the
    // rows past it are the next tile's rows of A, not the next block's
    // (node_.m clamped, rather than a register of its own across the main
    // loop). A constant kBlockM folds this away.
    if (block_m < NarrowConfig::kBlockM) node_.m = min(node_.m, (int64_t{work.m_block} + 1) * block_m);
  }

  __device__ void Prefetch() {
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t col = col0_ + 8 * c + e;
        bias_[c][e] =
            node_.bias != nullptr && col < node_.n ? LoadAsFloat<kHalf>(node_.bias_type, node_.bias, col) : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = row0_ + 8 * h;
          const int64_t out_col = swiglu ? (col0_ + 8 * c) / 2 : col;
          const bool used =
              node_.residual != nullptr && row < node_.m && out_col < node_.out_cols && (!swiglu || e == 0);
          residual_[h][c][e] =
              used ? LoadAsFloat<kHalf>(node_.residual_type, node_.residual, row * node_.residual_stride + out_col)
                   : 0.0f;
        }
      }
    }
  }

  // C of the plan's 16-bit type: each row's outputs gathered across the
  // lane quad (GatherQuadWords) so that a lane stores whole 16-byte (8-byte
  // under SwiGLU) runs, full 32-byte sectors a warp; fp32 C, one store an
  // element (StoreEach).
  // NOTE: with a store an element (2 bytes, 8 bytes a sector across the
  // quad), the tile's stores took ~1.5 us a 32-column tile, ~3.3 us a pair
  // split's 64-column one, where its partial sums' coalesced float4 stores
  // took ~0.1 (H200 traces, bench/NOTES.md v2.08): the last job's stores
  // were the end of each launch. Gathered, on an H100 (v2.09): the 64-token
  // MLP block 0.3-0.5 us faster, the 64-token chain ~1.3, the 128-token
  // tall pair split ~2.
  __device__ void Store(const float (&acc)[16]) const {
    if (out_type_ != kHalf) {
      StoreEach(acc);
      return;
    }
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
    const int quad_lane = static_cast<int>(col0_ % 8) / 2;  // col0_: the tile's column + 2 * (lane % 4)
    const int64_t tile_col = col0_ - 2 * quad_lane;
    if (swiglu) {
      // Output column tile_col / 2 + 4c + quad_lane of rows h = 0, 1 in one
      // word (row 0 low); after the gather, lane q holds columns
      // tile_col / 2 + 4q + s, s = 0..3, of both rows.
      uint32_t words[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float out[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float gate = acc[4 * c + 2 * h] + bias_[c][0], up = acc[4 * c + 2 * h + 1] + bias_[c][1];
          out[h] = Silu(gate) * up + residual_[h][c][0];
        }
        words[c] = HalfType<kHalf>::Pack(out[0], out[1]);
      }
      uint32_t run[4];
      GatherQuadWords(words, quad_lane, run);
      const int64_t col = tile_col / 2 + 4 * quad_lane;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Row h's halves of the four words: bytes 0-1 (row 0) or 2-3 (row 1).
        const uint32_t selector = h == 0 ? 0x5410u : 0x7632u;
        const uint32_t lo = __byte_perm(run[0], run[1], selector), hi = __byte_perm(run[2], run[3], selector);
        StoreRun(row0_ + 8 * h, col, 4, make_uint4(lo, hi, 0, 0));
      }
      return;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Columns tile_col + 8c + 2 * quad_lane, + 1 of row h a word; after
      // the gather, lane q holds columns tile_col + 8q + 2s, + 1, s = 0..3.
      uint32_t words[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          v[e] = Activate(node_.activation, acc[4 * c + 2 * h + e] + bias_[c][e]) + residual_[h][c][e];
        }
        words[c] = HalfType<kHalf>::Pack(v[0], v[1]);
      }
      uint32_t run[4];
      GatherQuadWords(words, quad_lane, run);
      StoreRun(row0_ + 8 * h, tile_col + 8 * quad_lane, 8, make_uint4(run[0], run[1], run[2], run[3]));
    }
  }

 private:
  // The quad's 4 x 4 word transpose: lane q of each four holds words[c] for
  // column group c; afterwards run[s] is lane s's words[q]. Two exchanges of
  // two words (across lanes q ^ 2, then q ^ 1), so that few words are live
  // at once. Every lane takes part (rows past M included).
  __device__ static void GatherQuadWords(const uint32_t (&words)[4], int quad_lane, uint32_t (&run)[4]) {
    // Groups 2b, 2b + 1 (b = bit 1 of the lane) stay, the other two go to
    // lane q ^ 2, which sends its groups 2b, 2b + 1.
    const bool high = (quad_lane & 2) != 0;
    const uint32_t own0 = high ? words[2] : words[0], own1 = high ? words[3] : words[1];
    const uint32_t got0 = __shfl_xor_sync(0xffffffffu, high ? words[0] : words[2], 2);
    const uint32_t got1 = __shfl_xor_sync(0xffffffffu, high ? words[1] : words[3], 2);
    // Group q stays (this lane's and lane q ^ 2's word), group q ^ 1 goes to
    // lane q ^ 1, which sends group q (its word and lane q ^ 3's).
    const bool odd = (quad_lane & 1) != 0;
    const uint32_t mine = odd ? own1 : own0, across = odd ? got1 : got0;  // from lanes q, q ^ 2
    const uint32_t next = __shfl_xor_sync(0xffffffffu, odd ? own0 : own1, 1);  // from lane q ^ 1
    const uint32_t far = __shfl_xor_sync(0xffffffffu, odd ? got0 : got1, 1);   // from lane q ^ 3
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int from = s ^ quad_lane;  // run[s] came from lane q ^ from
      run[s] = from == 0 ? mine : from == 1 ? next : from == 2 ? across : far;
    }
  }

  // `count` (4 or 8) outputs of row `row` from column `col` on, packed in
  // `run` (16 bits each, in column order): one 8- or 16-byte store where the
  // run lies inside C and on its alignment, else one store an element
  // inside C.
  __device__ void StoreRun(int64_t row, int64_t col, int count, uint4 run) const {
    if (row >= node_.m) return;
    uint8_t* const address = static_cast<uint8_t*>(node_.c) + (row * node_.c_stride + col) * 2;
    const uintptr_t bytes = static_cast<uintptr_t>(2 * count);
    if (col + count <= node_.out_cols && reinterpret_cast<uintptr_t>(address) % bytes == 0) {
      if (count == 8) {
        *reinterpret_cast<uint4*>(address) = run;
      } else {
        *reinterpret_cast<uint2*>(address) = make_uint2(run.x, run.y);
      }
      return;
    }
    const uint32_t words[4] = {run.x, run.y, run.z, run.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (i >= count || col + i >= node_.out_cols) break;
      const uint16_t bits = static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)));
      *reinterpret_cast<uint16_t*>(address + 2 * i) = bits;
    }
  }

  // One store an element (fp32 C).
  __device__ void StoreEach(const float (&acc)[16]) const {
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0_ + 8 * h;
      if (row >= node_.m) continue;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t col = col0_ + 8 * c;  // accumulator column of register 4c + 2h; 4c + 2h + 1 holds col + 1
        float v[2] = {acc[4 * c + 2 * h] + bias_[c][0], acc[4 * c + 2 * h + 1] + bias_[c][1]};
        if (swiglu) {
          v[0] = Silu(v[0]) * v[1];
        } else {
          v[0] = Activate(node_.activation, v[0]);
          v[1] = Activate(node_.activation, v[1]);
        }
        const int64_t out_col = swiglu ? col / 2 : col;
        const int outputs = swiglu ? 1 : 2;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (e >= outputs || out_col + e >= node_.out_cols) break;
          StoreOutput<kHalf>(node_, out_type_, row, out_col + e, v[e] + residual_[h][c][e]);
        }
      }
    }
  }

  EpilogueFields node_;  // m: the end of the job's rows (M, or its row block's end)
  ElementType out_type_;
  int64_t row0_;  // this thread's first row (16 * warp + lane / 4 of the tile)
  int64_t col0_;  // this thread's first accumulator column (2 * (lane % 4) of the tile)
  float bias_[4][2];         // [c][e], 0 without a bias or past N
  float residual_[2][4][2];  // [h][c][e], 0 without a residual or outside the output
};

// The epilogue of RunMmaSyncJob's swapped tiles: lane t of the warp for
// weight block wb and token block tb holds, in acc[i], token 8 * tb + 2 * (t %
// 4) + i % 2 (a row of C) and weight row 16 * wb + t / 4 + 8 * (i / 2) of the
// tile (an accumulator column). The fused ops as in NarrowEpilogue; for
// SwiGLU, gate and up are adjacent weight rows, so the lanes t and t + 4 hold
// them and the gate's lane computes the output.
// Where SwappedEpilogue writes its tagged copy (KernelNode::tagged_c): only
// in the tagged handoff's instantiation (NarrowConfig::Instantiation::
// kTaggedHandoff); elsewhere nothing, so that the other kernels' code stays
// as it was (reading tagged_c cost the two-consumer kernel 8 bytes of spill).
template <bool kTagged>
struct TaggedTarget {
  __device__ explicit TaggedTarget(const KernelNode&) {}
};
template <>
struct TaggedTarget<true> {
  __device__ explicit TaggedTarget(const KernelNode& node)
      : tagged_c(node.tagged_c), tagged_c_pitch(node.tagged_c_pitch) {}
  uint64_t* tagged_c;
  int32_t tagged_c_pitch;
};

template <bool kTagged, ElementType kHalf>
class SwappedEpilogue : private TaggedTarget<kTagged> {
 public:
  __device__ SwappedEpilogue(const CtaWork& work, int32_t block_m, int weight_block, int token_block, bool active,
                            int lane)
      : TaggedTarget<kTagged>(*work.node),
        node_(*work.node),
        out_type_(work.node->out_type),
        active_(active),
        gate_lane_((lane / 4) % 2 == 0),
        row0_(int64_t{work.m_block} * block_m + 8 * token_block + 2 * (lane % 4)),
        col0_(int64_t{work.n_block} * NarrowConfig::kBlockN + 16 * weight_block + lane / 4) {}

  __device__ void Prefetch() {
    if (!active_) return;
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = col0_ + 8 * h;
      bias_[h] = node_.bias != nullptr && col < node_.n ? LoadAsFloat<kHalf>(node_.bias_type, node_.bias, col) : 0.0f;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t row = row0_ + e;
        const int64_t out_col = swiglu ? col / 2 : col;
        const bool used = node_.residual != nullptr && row < node_.m && out_col < node_.out_cols &&
                          (!swiglu || gate_lane_);
        residual_[h][e] =
            used ? LoadAsFloat<kHalf>(node_.residual_type, node_.residual, row * node_.residual_stride + out_col) : 0.0f;
      }
    }
  }

  // `epoch`: the launch's, for the tagged copy, which goes out first: the
  // next layer waits for it.
  __device__ void Store(const float (&acc)[4], uint32_t epoch) const {
    if constexpr (kTagged) {
      if (this->tagged_c != nullptr) StoreTagged(acc, epoch);
    }
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i / 2, e = i % 2;
      const float v = acc[i] + bias_[h];
      // Every lane takes part in the exchange, stored or not.
      const float up = __shfl_xor_sync(0xffffffffu, v, 4);
      const int64_t row = row0_ + e, col = col0_ + 8 * h;
      if (!active_ || row >= node_.m) continue;
      float value;
      int64_t out_col;
      if (swiglu) {
        if (!gate_lane_) continue;
        value = Silu(v) * up;
        out_col = col / 2;
      } else {
        value = Activate(node_.activation, v);
        out_col = col;
      }
      if (out_col >= node_.out_cols) continue;
      StoreOutput<kHalf>(node_, out_type_, row, out_col, value + residual_[h][e]);
    }
  }

 private:
  // The tagged copy of what Store writes (KernelNode::tagged_c; C of the
  // plan's 16-bit type, bf16 or fp16, rounded as StoreOutput rounds it),
  // the values worked out again in every lane (NOTE: not shared with Store
  // through a helper: that changed the code of the kernels without the
  // tagged copy, which must stay as measured): a word of two adjacent output
  // columns, written by the lane that holds the even one, which takes the
  // odd one from the lane 4 over (8 under SwiGLU, where every other lane's
  // weight rows are gates and hold an output).
  __device__ void StoreTagged(const float (&acc)[4], uint32_t epoch) const {
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
    const bool tag_lane = (threadIdx.x & (swiglu ? 12 : 4)) == 0;  // its output column is even
    const int64_t pitch = this->tagged_c_pitch;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i / 2, e = i % 2;
      const float v = acc[i] + bias_[h];
      const float up = __shfl_xor_sync(0xffffffffu, v, 4);
      const float out = (swiglu ? Silu(v) * up : Activate(node_.activation, v)) + residual_[h][e];
      const float odd = __shfl_xor_sync(0xffffffffu, out, swiglu ? 8 : 4);
      const int64_t row = row0_ + e, col = col0_ + 8 * h;
      const int64_t out_col = swiglu ? col / 2 : col;
      if (!tag_lane || !active_ || row >= node_.m || out_col >= node_.out_cols) continue;
      const uint32_t pair = HalfType<kHalf>::Pack(out, out_col + 1 < node_.out_cols ? odd : 0.0f);
      ptx::st_relaxed_gpu_b64(this->tagged_c + row * pitch + out_col / 2, uint64_t{epoch} << 32 | pair);
    }
  }

  EpilogueFields node_;
  ElementType out_type_;
  bool active_;     // this warp has a token block
  bool gate_lane_;  // this lane's weight rows are even: gates, under SwiGLU
  int64_t row0_;    // this lane's first token (row of C)
  int64_t col0_;    // this lane's first accumulator column
  float bias_[2] = {0.0f, 0.0f};          // [h]
  float residual_[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [h][e]
};

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_NARROW_EPILOGUE_CUH_
