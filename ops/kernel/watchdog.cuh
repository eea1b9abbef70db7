// watchdog.cuh: waiting, bounded where it waits on other CTAs.
//
// Only the waits on other CTAs' work have a time limit: dependency and
// partial flags, tagged copies, the scheduler's look at a held job and at the
// first fetches (SpinUntil). One that runs past KernelParams::spin_timeout_ns
// claims the host-mapped DeviceTimeoutRecord (first one wins), fills in who
// waited on what, and sets LaunchState::abort. Every other bounded wait sees
// the abort flag within a few microseconds and gives up too. A role whose
// wait gave up drains: it waits for no other CTA again and keeps its side of
// each ring going until the job stream ends (the narrow kernel's loaders
// without data, narrow_loader_role.cuh; the tiled kernel's with whatever the
// producers left, cta_context.cuh), and the scheduler hands out the rest of
// the queue. So the waits on a CTA's own rings, staging buffers, job slots
// and consumer meetings (WaitPhase) need no clock, and each CTA reaches its
// final barrier and the kernel returns: the host then reports a
// DeadlineExceeded status instead of hanging (and no trap kills the
// context).
#ifndef LOOM_OPS_KERNEL_WATCHDOG_CUH_
#define LOOM_OPS_KERNEL_WATCHDOG_CUH_

#include <cuda/ptx>

#include <cstdint>

#include "kernel_params.h"
#include "ptx.cuh"

namespace loom::kernel {

// Waits, with no time limit, for the phase with parity `parity` of an
// mbarrier in this CTA to complete (acquire, CTA scope). Only for a barrier
// that is certain to complete: a CTA's own rings, staging buffers and job
// slots, whose every role keeps its side going until the job stream ends,
// even after a time-out (a role that gives up drains: above). What bounds
// such a wait is the watchdog's bound on the waits that can give up by
// themselves.
// NOTE: the loop must stay this bare. Against the bounded loop the ring
// waits had before (the watchdog's clock and abort checks), a narrow CTA
// streamed 7-12% faster at 33 CTAs and the 64-token MLP block and chain took
// 3-5 us less (the tiled kernel: bench/NOTES.md v1.58); every bounded shape tried
// was as slow as that loop or slower, however rarely its checks ran (checks
// every 4096 tries, a first try with a suspend hint, 64 or 1024 plain tries
// first: bench/NOTES.md v1.47), and a loop that read one shared-memory word
// after each unsuccessful try 32% slower (v1.48). Measure any change.
__device__ __forceinline__ void WaitPhase(uint64_t* barrier, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(barrier, parity)) {
  }
}

// WaitPhase acquiring at cluster scope: for a barrier whose arrivals release
// generic stores another CTA of the cluster made to this CTA's shared memory.
__device__ __forceinline__ void WaitPhaseCluster(uint64_t* barrier, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, barrier, parity)) {
  }
}

class Watchdog {
 public:
  // NOTE: holds a reference to the __grid_constant__ parameters, not copies of
  // their fields: reads through it compile to constant-bank operands, so the
  // watchdog costs the consumers' main loop no registers (copies in the object
  // were loop-carried and pushed the ring cursors into local memory).
  __device__ explicit Watchdog(const KernelParams& params) : params_(params) {}

  __device__ bool aborted() const { return ptx::ld_volatile(&params_.state->abort) != 0; }

  // Spins until ready() returns true. Returns false if the time limit ran out
  // (WaitLimitNs for `what`; recording `what`) or another wait already
  // aborted the launch.
  template <typename Ready>
  __device__ bool SpinUntil(Ready&& ready, WaitKind what, int job, int flag = -1,
                            uint32_t expected = 0, const uint32_t* seen = nullptr) const {
    if (ready()) return true;
    const uint64_t start = ptx::globaltimer();
    const uint64_t limit = WaitLimitNs(what, params_.spin_timeout_ns);
    for (uint32_t spin = 1;; ++spin) {
      if (ready()) return true;
      if ((spin & 63) == 0) {
        if (aborted()) return false;
        if (ptx::globaltimer() - start > limit) {
          Report(what, job, flag, expected, seen != nullptr ? ptx::ld_volatile(seen) : 0);
          return false;
        }
      }
    }
  }

  // SpinUntil for a whole warp that polls together: ready() is a warp vote
  // (the same answer in every lane), and lane 0 decides for the warp when
  // to give up, so that the lanes leave together. On a time-out every lane
  // calls report() (which records the wait: Report, from one lane), then
  // returns false; after another wait's abort, false at once.
  template <typename Ready, typename OnTimeout>
  __device__ bool SpinUntilAsWarp(Ready&& ready, OnTimeout&& report) const {
    if (ready()) return true;
    const uint64_t start = ptx::globaltimer();
    for (uint32_t spin = 1;; ++spin) {
      __nanosleep(64);
      if (ready()) return true;
      if ((spin & 63) != 0) continue;
      int verdict = 0;  // 1: aborted elsewhere; 2: timed out here
      if (threadIdx.x % 32 == 0) {
        verdict = aborted() ? 1 : (ptx::globaltimer() - start > params_.spin_timeout_ns ? 2 : 0);
      }
      verdict = __shfl_sync(0xffffffffu, verdict, 0);
      if (verdict == 2) report();
      if (verdict != 0) return false;
    }
  }

  __device__ void Report(WaitKind what, int job, int flag, uint32_t expected, uint32_t seen) const {
    DeviceTimeoutRecord* record = params_.timeout;
    if (atomicCAS(&record->timed_out, 0, 1) == 0) {
      record->sm = static_cast<int32_t>(cuda::ptx::get_sreg_smid());
      record->block = static_cast<int32_t>(blockIdx.x);
      record->job = job;
      record->flag = flag;
      record->expected = expected;
      record->seen = seen;
      record->wait_kind = static_cast<int32_t>(what);
      __threadfence_system();
    }
    atomicExch(&params_.state->abort, 1u);
  }

 private:
  const KernelParams& params_;
};

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_WATCHDOG_CUH_
