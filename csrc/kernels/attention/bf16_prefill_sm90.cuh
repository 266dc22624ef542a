// GQA prefill at head_dim 128 on Hopper warpgroup tensor cores (sm_90a wgmma, fp32 online softmax), behind the same
// op and parameters as the mma.sync kernel (bf16_prefill.cuh): the same Q tiles (128 packed rows, GQA head
// packing, the ragged tile map), dense / ragged Q, contiguous / paged K/V (pages of >= 8 keys), causal, masks.
// Warp-specialized, FlashAttention-3 style: a producer warpgroup copies Q and 128-key K/V tiles (whole tiles by
// TMA, contiguous or paged; the rest by cp.async) into the 128-byte-swizzled layout the wgmma descriptors read
// (three stages, mbarriers), and two consumer warpgroups of 64 packed rows each compute S = Q K^T (both operands
// from shared memory) and O += P V (P from registers: the S accumulators rounded to bf16; V read transposed),
// taking turns on the tensor cores (one's softmax runs while the other's products do) and issuing each tile's S
// with the previous tile's P V. Persistent: one block per SM takes Q tiles one after another (from a counter when
// the launcher gives one), so the next tile's Q and K/V copies run under the current tile's last products and its
// output stores.
//
// Its parts, one header each:
//   sm90_bf16_prefill_traits.cuh     block shape, shared-memory layout, K/V tensor maps, stage ring, timeline hooks
//   sm90_bf16_prefill_scheduler.cuh  persistent tile scheduler (work items through two shared slots)
//   sm90_bf16_prefill_producer.cuh   producer warpgroup: Q, K/V by TMA or cp.async, contiguous or paged
//   sm90_bf16_prefill_mainloop.cuh   consumer warpgroups: S = Q K^T, mask, softmax, O += P V, per tile
//   sm90_bf16_prefill_mask.cuh       the keys a row may not see
//   sm90_bf16_prefill_softmax.cuh    online softmax
//   sm90_bf16_prefill_epilogue.cuh   O / l to bf16, stored from registers
#pragma once

#include <cstdint>

#include "kernels/attention/sm90_bf16_prefill_mainloop.cuh"
#include "kernels/attention/sm90_bf16_prefill_producer.cuh"
#include "kernels/attention/sm90_bf16_prefill_scheduler.cuh"
#include "kernels/attention/sm90_bf16_prefill_traits.cuh"

namespace astrai {
namespace attention {

// The kernel's body, with a hooks policy (PrefillSm90NoHooks in production; see PrefillSm90Point).
// Semantics and Q tiles: as prefill_bf16_kernel<128, ...> (bf16_prefill.cuh); block: kThreads threads, kSmemBytes
// of dynamic shared memory; work items: PrefillSm90Scheduler. Warpgroup 0 copies (prefill_sm90_producer); consumer
// c (warpgroup 1 + c) computes packed rows 64 c .. 64 c + 63 (prefill_sm90_consumer). kPaged: pages of >=
// kGroupRows keys only, so each 8-row group of a tile lies on one page.
// Synchronization (mbarriers; parities count uses): the producer's thread 0 takes each item and publishes it in
// slot n % 2 (item_full[n % 2]); all 384 threads read it and arrive on item_empty, which the slot's next writer
// waits. K and V rings, stage s = t % 3 over the block's t-th tile of all its items: full[s] completes when the
// tile has landed (each producer thread arrives for its cp.async, and for K once more for its page flags; with
// TMA, thread 0 arrives once (paged: lane 0 of each producer warp, after writing its parts' page flags): with the
// tile's bytes to come, or after the producers' cp.async of a partial tile),
// empty[s] when both consumers are done with it (every consumer thread arrives: K after S, V after P V). q_full
// when an item's Q has landed, q_empty when both consumers have read it for their last S. Named barriers 3 and 4
// pass the tensor cores between the consumers, across items; named barrier 1 gathers the producers before thread
// 0 (paged: each warp's lane 0) completes a partial tile's phase (TMA mode).
template <bool kRaggedQ, bool kPaged, class Hooks>
__device__ __forceinline__ void prefill_bf16_sm90(const PrefillParams& p, const PrefillSm90KvMaps& maps,
                                                  Hooks& hooks) {
  using Tr = PrefillSm90Traits;
  // ---- shared memory and barriers ----
  // Carved and initialized here, not in helpers: as calls they changed the kernel's register allocation (the SASS
  // digest gates it).
  extern __shared__ __align__(128) uint8_t smem_raw[];
  // The swizzle atoms must start 1024-byte aligned (descriptor base offset 0).
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  uint8_t* const smem = smem_raw + (base - raw_addr);
  uint64_t* const k_full = reinterpret_cast<uint64_t*>(smem + Tr::kBarOffset);
  uint64_t* const k_empty = k_full + Tr::kStages;
  uint64_t* const v_full = k_empty + Tr::kStages;
  uint64_t* const v_empty = v_full + Tr::kStages;
  uint64_t* const q_full = v_empty + Tr::kStages;
  uint64_t* const q_empty = q_full + 1;
  uint64_t* const item_full = q_empty + 1;
  uint64_t* const item_empty = item_full + 2;
  volatile int32_t* const item_slot = reinterpret_cast<volatile int32_t*>(smem + Tr::kItemOffset);
  uint8_t* const page_flags = smem + Tr::kFlagOffset;
  const PrefillSm90Smem sm{base,    k_full,    k_empty,    v_full,    v_empty,   q_full,
                           q_empty, item_full, item_empty, item_slot, page_flags};

  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int64_t num_items = int64_t(p.num_q_tiles) * (p.num_kv_heads * (group >> prefill_heads_log2(group)));

  const bool tma = maps.enabled != 0;
  const int tma_arrivals = kPaged ? 4 : 1;  // TMA mode: thread 0, or lane 0 of each producer warp (paged)
  if (tid == 0) {
    for (int s = 0; s < Tr::kStages; ++s) {
      // Per producer thread: its copies landed, and (K) its page flags written; with TMA, thread 0's arrival (paged:
      // lane 0's of each producer warp).
      mbarrier_init(k_full + s, tma ? tma_arrivals : 2 * 128);
      mbarrier_init(v_full + s, tma ? tma_arrivals : 128);
      mbarrier_init(k_empty + s, Tr::kConsumers * 128);  // every consumer thread
      mbarrier_init(v_empty + s, Tr::kConsumers * 128);
    }
    mbarrier_init(q_full, 128);
    mbarrier_init(q_empty, Tr::kConsumers * 128);
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(item_full + s, 1);             // thread 0 published the item
      mbarrier_init(item_empty + s, Tr::kThreads);  // every thread read it
    }
  }
  __syncthreads();  // the only block-wide barrier: the producer may finish early
  const PrefillSm90Scheduler sched{item_full, item_empty, item_slot, num_items};

  // ---- warp specialization ----
  if (wg == 0) {
    setmaxnreg_dec<Tr::producer_regs(kPaged)>();
    prefill_sm90_producer<kRaggedQ, kPaged>(p, maps, sm, sched, hooks, tid, lane, tma);
    return;
  }
  setmaxnreg_inc<Tr::consumer_regs(kPaged)>();
  prefill_sm90_consumer<kRaggedQ, kPaged>(p, sm, sched, hooks, tid, lane, wg - 1);
}

template <bool kRaggedQ, bool kPaged>
__global__ void __launch_bounds__(PrefillSm90Traits::kThreads, 1)
    prefill_bf16_sm90_kernel(const __grid_constant__ PrefillParams p, const __grid_constant__ PrefillSm90KvMaps maps) {
#if ASTRAI_WGMMA
  PrefillSm90NoHooks hooks;
  prefill_bf16_sm90<kRaggedQ, kPaged>(p, maps, hooks);
#else
  (void)p;  // not an sm_90a pass: never launched (attn_prefill_unfit)
#endif
}

}  // namespace attention
}  // namespace astrai
