// Persistent tile scheduler of the sm_90a bf16 prefill: the producer's thread 0 draws work items and publishes
// them to the block through two mbarrier-guarded shared-memory slots.
#pragma once

#include <cstdint>

#include "kernels/attention/sm90_bf16_prefill_traits.cuh"

namespace astrai {
namespace attention {

// The work items are the mma.sync kernel's blocks (Q tile x head block, in its order). Block k takes item k
// first, then the next item from p.sched_counter_ptr (gridDim.x + the counter's old value: a dynamic schedule, the
// counter zeroed before the launch), or k + n gridDim.x when that is null. The block's n-th item sits in slot
// n % 2; num_items or more: no more work.
struct PrefillSm90Scheduler {
  uint64_t* full;           // [2] thread 0 published the slot's item
  uint64_t* empty;          // [2] every thread of the block read it
  volatile int32_t* slot;   // [2]
  int64_t num_items;

  // Every thread, in order of n.
  __device__ __forceinline__ int64_t read(int n) const {
    const int s = n & 1;
    mbarrier_wait(full + s, uint32_t(n >> 1) & 1u);
    // Read by every lane, then lane 0's value for all: ptxas then knows the item (and every trip count derived
    // from it) uniform across the warp, which it needs to keep the wgmma asynchronous.
    const int32_t w = __shfl_sync(0xffffffffu, slot[s], 0);
    mbarrier_arrive(empty + s);
    return w;
  }

  // The producer's thread 0, before its read(n). `ticket` (starting at blockIdx.x) is drawn one item ahead: the
  // atomic's latency passes while the producer copies the current item, not at the next one's start.
  __device__ __forceinline__ void publish(const PrefillParams& p, int n, int64_t& ticket) const {
    const int s = n & 1;
    if (n >= 2) mbarrier_wait(empty + s, (uint32_t(n >> 1) & 1u) ^ 1u);  // all read its last item
    const int64_t w = ticket;
    if (w < num_items) {  // past the end the block stops: no more draws
      ticket = p.sched_counter_ptr != nullptr
                   ? int64_t(gridDim.x) + int64_t(atomicAdd(reinterpret_cast<unsigned*>(p.sched_counter_ptr), 1u))
                   : int64_t(blockIdx.x) + int64_t(n + 1) * gridDim.x;
    }
    slot[s] = int32_t(w < num_items ? w : num_items);
    mbarrier_arrive(full + s);
  }
};

}  // namespace attention
}  // namespace astrai
