// Consumer mainloop of the sm_90a bf16 prefill: per work item and K/V tile, S = Q K^T and O += P V on the
// warpgroup tensor cores (taking turns with the other consumer), the mask, the online softmax, then the epilogue.
#pragma once

#include <cstdint>

#include "kernels/attention/sm90_bf16_prefill_epilogue.cuh"
#include "kernels/attention/sm90_bf16_prefill_mask.cuh"
#include "kernels/attention/sm90_bf16_prefill_scheduler.cuh"
#include "kernels/attention/sm90_bf16_prefill_softmax.cuh"
#include "kernels/attention/sm90_bf16_prefill_traits.cuh"

namespace astrai {
namespace attention {

// The wgmma of one consumer: descriptors, one per operand base, then each k-step's and stage's by adding its byte
// offset / 16 to the low word (wgmma_desc_sw128_add), which keeps the descriptor arithmetic out of the loop.
struct PrefillSm90Mma {
  using Tr = PrefillSm90Traits;
  static constexpr uint32_t kStageBytes = 2 * Tr::kTileBytes;
  uint64_t q_desc;  // this consumer's 64 rows of Q, K-major
  uint64_t k_desc;  // K of stage 0, K-major
  uint64_t v_desc;  // V of stage 0, MN-major (read transposed)

  __device__ __forceinline__ static PrefillSm90Mma make(uint32_t base, int wg_row0) {
    return PrefillSm90Mma{wgmma_desc_sw128(base + uint32_t(wg_row0) * 128, 16, 1024),
                          wgmma_desc_sw128(base + Tr::kQBytes, 16, 1024),
                          wgmma_desc_sw128(base + Tr::kQBytes + Tr::kTileBytes, Tr::kHalfKV, 1024)};
  }

  // S = Q K^T of the tile in `stage`: one commit group of 8 k-steps.
  __device__ __forceinline__ void issue_s(float (&s)[64], int stage) const {  // s: (64 rows, 128 keys)
    const uint64_t k_stage = wgmma_desc_sw128_add(k_desc, uint32_t(stage) * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t half = uint32_t(kk >> 2), step = uint32_t(kk & 3) * 32;
      const uint64_t da = wgmma_desc_sw128_add(q_desc, half * Tr::kHalfQ + step);
      const uint64_t db = wgmma_desc_sw128_add(k_stage, half * Tr::kHalfKV + step);
      wgmma_m64n128k16_ss(s, da, db, kk > 0);
    }
    wgmma_commit();
  }

  // O += P V of the tile in `stage`, P from pa: one commit group of 8 k-steps of 16 keys.
  __device__ __forceinline__ void issue_pv(float (&acc_o)[64], const uint32_t (&pa)[8][4], int stage) const {
    const uint64_t v_stage = wgmma_desc_sw128_add(v_desc, uint32_t(stage) * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      wgmma_m64n128k16_rs_tnspb(acc_o, pa[kk], wgmma_desc_sw128_add(v_stage, uint32_t(kk) * 2048), true);
    }
    wgmma_commit();
  }
};

// After a wait that completes P V: O and pa stay in their registers until here (see wgmma_fence_operand).
__device__ __forceinline__ void fence_pv_operands(float (&acc_o)[64], uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma_fence_operand(acc_o[i]);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) wgmma_fence_operand(pa[kk][e]);
}

// The weights of S (its accumulator fragment) rounded to bf16 as the A fragments of P V.
__device__ __forceinline__ void round_p(const float (&s)[64], uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    pa[n / 2][(n % 2) * 2] = pack_bf16x2_rn(s[4 * n], s[4 * n + 1]);
    pa[n / 2][(n % 2) * 2 + 1] = pack_bf16x2_rn(s[4 * n + 2], s[4 * n + 3]);
  }
}

// Consumer c (warpgroup 1 + c, threads 128 (1 + c) ..) computes packed rows 64 c .. 64 c + 63 of every item of
// the block. Iteration j issues S_j = Q K_j, then O += P_{j-1} V_{j-1}, computes the softmax of S_j, then rescales
// O and rounds P_j. ptxas places the wait for that P V before the softmax (the SASS, not the source order: a
// branch that kept it after the exps measured slower), so the softmax runs under the other consumer's products.
template <bool kRaggedQ, bool kPaged, class Hooks>
__device__ __forceinline__ void prefill_sm90_consumer(const PrefillParams& p, const PrefillSm90Smem& sm,
                                                      const PrefillSm90Scheduler& sched, Hooks& hooks, int tid,
                                                      int lane, int c) {
  using Tr = PrefillSm90Traits;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN;
  const int wq = (tid >> 5) & 3;  // warp within the warpgroup
  const int wg_row0 = c * 64;                           // this consumer's first packed row
  const int my_row0 = wg_row0 + wq * 16 + (lane >> 2);  // this thread's first packed row (the second: + 8)
  const bool has_mask = p.mask_ptr != nullptr;

  float acc_o[64];  // O, unnormalized: acc_o[4 n + e] = O[row g + 8 (e / 2)][8 n + 2 (lane % 4) + e % 2]
  float row_max[2], row_sum[2];  // the online softmax's (prefill_sm90_softmax)
  uint32_t pa[8][4];  // P in bf16, the A fragments of P V: k-step kk is n-tiles 2 kk and 2 kk + 1 of S

  const PrefillSm90Mma mma = PrefillSm90Mma::make(sm.base, wg_row0);

  // The tensor cores pass between the consumers (named barriers 3 + c) across all items: consumer 0 goes first,
  // and takes consumer 1's last pass after the last item, so that no barrier is left mid-phase at the exit.
  const int my_turn = 3 + c, their_turn = 4 - c;
  if (c == 1) named_barrier_arrive(3, 256);
  uint32_t q_uses = 0;  // Q tiles read by this block
  uint32_t phase = 0;   // parity of the current use of stage
  int stage = 0;        // the block's tile count % 3
  for (int item_no = 0;; ++item_no) {
    const int64_t w = sched.read(item_no);
    hooks.at(PrefillSm90Point::kItem, item_no);
    if (w >= sched.num_items) break;
    const QTile qt = locate_q_tile<kBM, kRaggedQ>(p, unsigned(w));
    if (qt.b < 0) continue;  // idle item
    const TileKeys keys = tile_keys<kPaged>(p, qt);
    const int n_tiles = (keys.n_end + kBN - 1) / kBN;  // block-uniform trip count
    const PrefillSm90Mask<kPaged> mask{p, qt.b, qt.row0, qt.q_len, qt.hb_log2, keys.kv_len, keys.pos0,
                                       my_row0, lane, has_mask};

#pragma unroll
    for (int i = 0; i < 64; ++i) acc_o[i] = 0.f;
    prefill_sm90_softmax_reset(row_max, row_sum);

    // ---- main loop ----
    if (n_tiles > 0) {
      mbarrier_wait(sm.q_full, q_uses & 1u);
      hooks.at(PrefillSm90Point::kQReady, item_no);
      ++q_uses;
    }
    int prev_stage = 0;
    uint32_t prev_phase = 0;  // parity of the use of prev_stage
    for (int j = 0; j < n_tiles; ++j) {
      mbarrier_wait(sm.k_full + stage, phase);
      if (j == 0) hooks.at(PrefillSm90Point::kK0Ready, item_no);
      if (j > 0) mbarrier_wait(sm.v_full + prev_stage, prev_phase);
      fence_proxy_async_smem();  // the copies (generic proxy) before the tensor cores' reads (async proxy)
      // Paged: byte g of page_bad is nonzero when row group g of the tile lies on an invalid page.
      uint4 page_bad = make_uint4(0u, 0u, 0u, 0u);
      if constexpr (kPaged) page_bad = *reinterpret_cast<const uint4*>(sm.page_flags + stage * Tr::kGroups);
      const bool any_bad = (page_bad.x | page_bad.y | page_bad.z | page_bad.w) != 0u;

      float s[64];  // (64 rows, 128 keys): s[4 n + e] = S[row g + 8 (e / 2)][8 n + 2 (lane % 4) + e % 2]
      named_barrier_sync(my_turn, 256);
      if (j == 0) hooks.at(PrefillSm90Point::kTurn0, item_no);
      wgmma_fence();  // pa and acc_o were written since the last wgmma
      // Each wait sits in the branch of its issues: ptxas proves the accumulators ready per path (a wait<1> that
      // a path without P V could reach would make it serialize every wgmma).
      if (j > 0) {
        mma.issue_s(s, stage);
        mma.issue_pv(acc_o, pa, prev_stage);
        named_barrier_arrive(their_turn, 256);
        wgmma_wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
      } else {
        mma.issue_s(s, stage);
        named_barrier_arrive(their_turn, 256);
        wgmma_wait<0>();
        hooks.at(PrefillSm90Point::kFirstS, item_no);
      }
      mbarrier_arrive(sm.k_empty + stage);        // K_j read
      if (j == n_tiles - 1) mbarrier_arrive(sm.q_empty);  // Q read for the last time: the next item's may land
#pragma unroll
      for (int i = 0; i < 64; ++i) wgmma_fence_operand(s[i]);

      const int n0 = j * kBN;
      const bool need_mask =
          has_mask || any_bad || n0 + kBN > keys.kv_len || (p.is_causal && n0 + kBN - 1 > keys.pos0);
      float alpha[2];
      if (need_mask) mask.apply(s, j, page_bad);
      const bool moved = prefill_sm90_softmax(s, alpha, row_max, row_sum, p.scale_log2);
      wgmma_wait<0>();  // P_{j-1} V_{j-1} done: O and pa are free, and so is tile j - 1
      fence_pv_operands(acc_o, pa);
      if (j > 0) mbarrier_arrive(sm.v_empty + prev_stage);  // V_{j-1} read
      // Past the first tiles a row max rarely grows: skip the 64 multiplies when no row of the warp moved.
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int i = 0; i < 64; ++i) acc_o[i] *= alpha[(i % 4) / 2];
      }
      round_p(s, pa);
      hooks.tile_done(item_no, j, need_mask);
      prev_stage = stage;
      prev_phase = phase;
      if (++stage == Tr::kStages) {
        stage = 0;
        phase ^= 1u;
      }
    }
    hooks.at(PrefillSm90Point::kLoopEnd, item_no);
    if (n_tiles > 0) {
      mbarrier_wait(sm.v_full + prev_stage, prev_phase);
      fence_proxy_async_smem();
      wgmma_fence();
      mma.issue_pv(acc_o, pa, prev_stage);
      wgmma_wait<0>();
      fence_pv_operands(acc_o, pa);
      mbarrier_arrive(sm.v_empty + prev_stage);  // V of the last tile read
    }
    hooks.at(PrefillSm90Point::kLastPV, item_no);

    // ---- epilogue ----
    uint32_t cols[4];
    prefill_sm90_store_o<kRaggedQ>(p, w, acc_o, row_sum, my_row0, lane, cols);
    hooks.at(PrefillSm90Point::kStored, item_no);
  }
  if (c == 0) named_barrier_sync(3, 256);  // consumer 1's last pass
}

}  // namespace attention
}  // namespace astrai
