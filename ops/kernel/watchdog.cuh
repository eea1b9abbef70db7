// watchdog.cuh: bounded waiting. Every spin in the kernel goes through here.
//
// A wait that runs past KernelParams::spin_timeout_ns claims the host-mapped
// DeviceTimeoutRecord (first one wins), fills in who waited on what, and sets
// LaunchState::abort. Every other wait sees the abort flag within a few
// microseconds and gives up too, so each role leaves its loop, the CTA reaches
// its final cluster barrier and the kernel returns: the host then reports a
// DeadlineExceeded status instead of hanging (and no trap kills the context).
#ifndef LOOM_OPS_KERNEL_WATCHDOG_CUH_
#define LOOM_OPS_KERNEL_WATCHDOG_CUH_

#include <cuda/ptx>

#include <cstdint>

#include "kernel_params.h"
#include "ptx.cuh"

namespace loom::kernel {

class Watchdog {
 public:
  __device__ explicit Watchdog(const KernelParams& params)
      : state_(params.state), record_(params.timeout), limit_ns_(params.spin_timeout_ns) {}

  __device__ bool aborted() const { return ptx::ld_volatile(&state_->abort) != 0; }

  // Spins until ready() returns true. Returns false if the time limit ran out
  // (recording `what`) or another wait already aborted the launch.
  // NOTE: only dependency-flag waits get the plain limit; every other wait
  // (rings, staging, job slots) is a downstream symptom of some other wait,
  // so it gets four times as long and the root cause is the one reported.
  template <typename Ready>
  __device__ bool SpinUntil(Ready&& ready, WaitKind what, int job, int flag = -1,
                            uint32_t expected = 0, const uint32_t* seen = nullptr) const {
    if (ready()) return true;
    const uint64_t start = ptx::globaltimer();
    const uint64_t limit = what == WaitKind::kDependencyFlag ? limit_ns_ : 4 * limit_ns_;
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

  static constexpr bool kClusterScope = true;

  // Waits for the phase with parity `parity` of an mbarrier in this CTA to
  // complete. Acquire at CTA scope by default (ring and staging barriers order
  // async-proxy traffic, which the barrier's complete_tx already covers);
  // at cluster scope where the peer wrote shared memory with generic stores
  // before arriving (job slots).
  __device__ bool WaitBarrier(uint64_t* barrier, uint32_t parity, WaitKind what, int job,
                              bool cluster_scope = false) const {
    if (cluster_scope) {
      return SpinUntil(
          [&] {
            return cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster,
                                                       barrier, parity);
          },
          what, job);
    }
    return SpinUntil([&] { return cuda::ptx::mbarrier_try_wait_parity(barrier, parity); }, what, job);
  }

  __device__ void Report(WaitKind what, int job, int flag, uint32_t expected, uint32_t seen) const {
    if (atomicCAS(&record_->timed_out, 0, 1) == 0) {
      record_->sm = static_cast<int32_t>(cuda::ptx::get_sreg_smid());
      record_->block = static_cast<int32_t>(blockIdx.x);
      record_->job = job;
      record_->flag = flag;
      record_->expected = expected;
      record_->seen = seen;
      record_->wait_kind = static_cast<int32_t>(what);
      __threadfence_system();
    }
    atomicExch(&state_->abort, 1u);
  }

 private:
  LaunchState* state_;
  DeviceTimeoutRecord* record_;
  uint64_t limit_ns_;
};

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_WATCHDOG_CUH_
