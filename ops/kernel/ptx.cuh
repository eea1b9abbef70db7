// ptx.cuh: the few PTX instructions that CUDA 13.0's cuda::ptx does not wrap.
// One small function per instruction, each saying what it guarantees. Every
// other TMA / mbarrier / fence operation in the kernel goes through cuda::ptx;
// the one pair of them used together everywhere (the whole-cluster barrier,
// which the kernels and the probes under bench/ share) is named here too.
#ifndef LOOM_OPS_KERNEL_PTX_CUH_
#define LOOM_OPS_KERNEL_PTX_CUH_

#include <cuda.h>

#include <cuda/ptx>
#include <cstdint>

#include "kernel_params.h"

namespace loom::kernel::ptx {

// wgmma.fence: orders this warpgroup's earlier register writes (accumulators
// touched by other instructions) before the wgmma operations that follow.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// wgmma.commit_group: closes the group of wgmma operations issued so far.
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// wgmma.wait_group N: returns once at most N committed groups are still in
// flight; their accumulators are then readable and their shared memory reads done.
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// setmaxnreg: moves this warpgroup's per-thread register budget up or down.
// Every warp of the warpgroup must execute it.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Every thread of the cluster arrives, then waits for all: what each thread
// did before its arrival is visible to every thread of the cluster after its
// wait (release / acquire at cluster scope).
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}

// mapa: the shared::cluster address of the same shared-memory offset in
// cluster CTA `rank`.
__device__ __forceinline__ uint32_t mapa_shared_cluster(uint32_t smem_address, uint32_t rank) {
  uint32_t result;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(result) : "r"(smem_address), "r"(rank));
  return result;
}

// mbarrier.arrive with release semantics at cluster scope, on a barrier named
// by its shared::cluster address (local or in the peer CTA): the caller's
// earlier memory operations are visible to whoever acquires that phase.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t cluster_address) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_address)
               : "memory");
}

// mbarrier.arrive with the default semantics (release at CTA scope) on a
// barrier named by its shared::cluster address. For ring slots: the reads that
// the arrival releases were made by wgmma and completed by wgmma.wait_group,
// so no generic-proxy ordering at cluster scope is needed (and the cluster-
// scope release costs a fence on every k-block). For job slots: the read it
// releases has returned its value (JobStream::Next).
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t cluster_address) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_address) : "memory");
}

// st.shared::cluster: a 32-bit store into a cluster CTA's shared memory.
__device__ __forceinline__ void st_shared_cluster(uint32_t cluster_address, int32_t value) {
  asm volatile("st.shared::cluster.s32 [%0], %1;\n" ::"r"(cluster_address), "r"(value) : "memory");
}

// st.shared: a 32-bit store into this CTA's shared memory at a 32-bit
// shared-window address (what __cvta_generic_to_shared returns).
__device__ __forceinline__ void st_shared(uint32_t smem_address, uint32_t value) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_address), "r"(value) : "memory");
}

// stmatrix .x4: the warp stores four 8 x 8 matrices of 16-bit elements.
// Register j of lane t holds row t / 4, columns 2 * (t % 4) and + 1, of matrix
// j (the mma/wgmma accumulator fragment layout); lanes 8j..8j+7 give the
// shared addresses of matrix j's eight 16-byte rows.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_address, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ldmatrix.x4: the inverse of stmatrix_x4. Register j of lane t receives row
// t / 4, columns 2 * (t % 4) and + 1, of matrix j; lanes 8j..8j+7 give the
// shared addresses of matrix j's eight 16-byte rows.
__device__ __forceinline__ void ldmatrix_x4(uint32_t smem_address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address)
               : "memory");
}

// mma.sync m16n8k16, BF16 x BF16 (kHalf) or FP16 x FP16 -> FP32, one warp:
// d += a b. a: 16 x 16
// (row-major; the ldmatrix_x4 quarters rows 0-7 / 8-15 x k 0-7, then k 8-15),
// b: 16 x 8 (k-major per column: two 8 x 8 matrices, k 0-7 and 8-15, rows =
// columns of b). d[0..3]: rows t / 4 and + 8, columns 2 * (t % 4) and + 1 of
// lane t (d[0] (r, c), d[1] (r, c + 1), d[2] (r + 8, c), d[3] (r + 8, c + 1)).
#define LOOM_MMA_M16N8K16(types)                                                                        \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." types ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, " \
               "{%8, %9}, {%0, %1, %2, %3};\n"                                                            \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                           \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <ElementType kHalf>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kHalf == ElementType::kFP16) {
    LOOM_MMA_M16N8K16("f16.f16");
  } else {
    LOOM_MMA_M16N8K16("bf16.bf16");
  }
}
#undef LOOM_MMA_M16N8K16

// ld.relaxed.gpu: sees other SMs' stores without ordering anything after it
// (and, unlike ld.acquire, without invalidating this SM's L1). After it saw
// a st.release.gpu, fence.acquire.gpu makes the pair an acquire.
__device__ __forceinline__ uint32_t ld_relaxed_gpu(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// The same for a 64-bit word, and its store: a relaxed access of an aligned
// 64-bit word is single-copy atomic, so a reader sees both halves of one
// store or of another, never a mix (the narrow kernel's tagged handoff puts
// data and its epoch in one word for that).
__device__ __forceinline__ uint64_t ld_relaxed_gpu_b64(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(value) : "l"(address) : "memory");
  return value;
}
__device__ __forceinline__ void st_relaxed_gpu_b64(uint64_t* address, uint64_t value) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(address), "l"(value) : "memory");
}

// The SFU's approximations, denormals flushed: 2^x, and 1 / x (2^-126 and
// less flush to zero, so 1 / inf and 1 / (>= 2^126) are 0).
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float value;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(value) : "f"(x));
  return value;
}
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float value;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(value) : "f"(x));
  return value;
}

// prefetch.global.L2: asks L2 for the 128-byte line holding `address`; no
// wait, no result, no ordering.
__device__ __forceinline__ void prefetch_global_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(address));
}

// discard.global.L2: drops the 128-byte line at `line` (128-byte aligned)
// from L2 without writing it back; its contents are undefined until written
// again. A weak write: the caller orders it after every read of the line.
__device__ __forceinline__ void discard_global_l2(const void* line) {
  asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(line) : "memory");
}

// prefetch.tensormap: brings the TMA descriptor at `map` (global memory) into
// the cache TMA reads descriptors through; no wait.
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// Four consecutive words, relaxed, in one load; `address` 16-byte aligned.
__device__ __forceinline__ uint4 ld_relaxed_gpu_v4(const uint32_t* address) {
  uint4 value;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(value.x), "=r"(value.y), "=r"(value.z), "=r"(value.w)
               : "l"(address)
               : "memory");
  return value;
}

// st.release.gpu: a store that this thread's earlier memory operations are
// ordered before, for any thread that acquires the value.
__device__ __forceinline__ void st_release_gpu(uint32_t* address, uint32_t value) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(address), "r"(value) : "memory");
}

// atom.acq_rel.gpu.cas: writes `desired` where `*address` holds `expected`,
// returning what it held. An acquire of the value it read and a release of
// the one it wrote.
__device__ __forceinline__ uint32_t atom_cas_acq_rel_gpu(uint32_t* address, uint32_t expected, uint32_t desired) {
  uint32_t prior;
  asm volatile("atom.acq_rel.gpu.global.cas.b32 %0, [%1], %2, %3;\n"
               : "=r"(prior)
               : "l"(address), "r"(expected), "r"(desired)
               : "memory");
  return prior;
}

// ld.volatile: a load that is never cached in registers across iterations.
__device__ __forceinline__ uint32_t ld_volatile(const uint32_t* address) {
  return *reinterpret_cast<const volatile uint32_t*>(address);
}

// Named barrier `id` (0 is __syncthreads') over kThreads threads: true for
// every thread when `predicate` holds for all of them. Orders memory like
// bar.sync. The id may be known only at run time (a consumer warpgroup's
// own, of two running the same code).
template <int kThreads>
__device__ __forceinline__ bool barrier_and_at(uint32_t id, bool predicate) {
  uint32_t all;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 q, %1, 0;\n bar.red.and.pred p, %2, %3, q;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(all)
      : "r"(static_cast<uint32_t>(predicate)), "r"(id), "n"(kThreads)
      : "memory");
  return all != 0;
}

// Named barrier `id` over kThreads threads (bar.sync), the id known only at
// run time as above.
template <int kThreads>
__device__ __forceinline__ void barrier_at(uint32_t id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(kThreads) : "memory");
}

// The same as barrier_and_at for a barrier id known at compile time.
template <int kId, int kThreads>
__device__ __forceinline__ bool barrier_and(bool predicate) {
  return barrier_and_at<kThreads>(kId, predicate);
}

// createpolicy.fractional.L2::evict_first: a cache policy under which the
// lines a load brings into L2 are the first to be evicted. For weights read
// once per launch, so that they do not push out what is read again (the
// activations, tile flags and outputs the next layer waits for).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// cp.async.bulk (global -> this CTA's shared memory) with an L2 cache policy
// (l2_evict_first_policy): `bytes` (a multiple of 16, both addresses 16-byte
// aligned) complete_tx on `bar`, as cuda::ptx::cp_async_bulk.
__device__ __forceinline__ void cp_async_bulk_l2_hint(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                                      uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
      ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))), "l"(src), "r"(bytes),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "l"(policy)
      : "memory");
}

// cp.async.bulk.tensor of a 2-D / 3-D box with an L2 cache policy, as
// cuda::ptx::cp_async_bulk_tensor (tile mode, complete_tx on `bar`).
__device__ __forceinline__ void cp_async_bulk_tensor_2d_l2_hint(void* dst, const CUtensorMap* map, int32_t c0,
                                                                int32_t c1, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))), "l"(map), "r"(c0), "r"(c1),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void cp_async_bulk_tensor_3d_l2_hint(void* dst, const CUtensorMap* map, int32_t c0,
                                                                int32_t c1, int32_t c2, uint64_t* bar,
                                                                uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n"
      ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))), "l"(map), "r"(c0), "r"(c1), "r"(c2),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "l"(policy)
      : "memory");
}

__device__ __forceinline__ uint32_t smid() {
  uint32_t value;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(value));
  return value;
}

// %globaltimer: nanoseconds, coarse (about 1 us ticks); good for time-outs.
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t value;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(value));
  return value;
}

}  // namespace loom::kernel::ptx

#endif  // LOOM_OPS_KERNEL_PTX_CUH_
