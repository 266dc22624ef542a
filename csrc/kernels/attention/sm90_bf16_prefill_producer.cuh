// Producer warpgroup of the sm_90a bf16 prefill: per work item, Q and the K/V tiles into the mbarrier rings, by
// TMA (whole tiles, contiguous or paged) or cp.async (the rest, contiguous or paged, zero-filled).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/attention/sm90_bf16_prefill_scheduler.cuh"
#include "kernels/attention/sm90_bf16_prefill_traits.cuh"

namespace astrai {
namespace attention {

// One producer thread's view of the current work item (tid < 128): where its K/V rows and pages come from.
// Built per item by prefill_sm90_producer over its locals (references, as a lambda's captures: copies of them
// compiled to other SASS); the ring state stays there and is passed in.
template <bool kRaggedQ, bool kPaged>
struct PrefillSm90KvCopy {
  using Tr = PrefillSm90Traits;
  using bf16 = __nv_bfloat16;
  static constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kStages = Tr::kStages, kGroupRows = Tr::kGroupRows;

  const PrefillParams& p;
  const PrefillSm90KvMaps& maps;
  const PrefillSm90Smem& sm;
  const QTile& qt;
  const TileKeys& keys;
  const int &tid, &lane;
  const int& chunk;  // this thread's 16-byte chunk of a row
  const int& rg;     // its row groups: rg (rows 8 rg ..) and 8 + rg (rows 64 + 8 rg ..) of a tile
  const bool& tma;   // whole K/V tiles by TMA (maps.enabled)
  const int &n_tiles, &b, &kv_len;
  const bf16* const& k_base;  // this thread's chunk of the item's kv head (+ key row, or + page and slot)
  const bf16* const& v_base;
  // Paged TMA: a tile is n_parts parts of min(page size, 128) rows, each on one page. Part q is producer warp
  // q % 4's, its 64-column halves lanes 2 (q / 4) and 2 (q / 4) + 1 (spread over the warps: one warp issuing all
  // 16 or 32 boxes of a tile held the tiles back).
  const int &warp, &seg_log2, &n_parts, &my_part;
  const bool& has_box;
  const uint32_t& warp_box_bytes;  // this warp's share of a tile

  // ---- page ids (paged K/V) ----
  // The page id of this thread's group g of tile j (-1 past kv_len), read once for K and V. The read depends on
  // max_kv_len only (the page table's width), not on kv_len: it need not wait for kv_lens.
  __device__ __forceinline__ int32_t group_page_id(int j, int g) const {
    const int t0 = j * kBN + 64 * g + 8 * rg;
    const int32_t id = t0 < p.max_kv_len ? __ldg(p.page_table_ptr + (int64_t(b) * p.page_table_batch_stride +
                                                                     (t0 >> p.page_size_log2)))
                                         : -1;
    return t0 < kv_len ? id : -1;
  }
  // The page id of this lane's part of tile j (-1 without one).
  __device__ __forceinline__ int32_t box_page_id(int j) const {
    const int t0 = j * kBN + (my_part << seg_log2);
    return has_box && t0 < p.max_kv_len
               ? __ldg(p.page_table_ptr + (int64_t(b) * p.page_table_batch_stride + (t0 >> p.page_size_log2)))
               : -1;
  }

  // ---- cp.async ----
  // One K or V tile (j) into `dst`: groups of 8 rows, each from one page id (ids: this thread's groups'); keys
  // past kv_len and rows of invalid pages are zeros (V rows must be finite: P = 0 times them is 0). K's copy also
  // writes the page flags.
  __device__ __forceinline__ void copy_tile(int j, const int32_t (&ids)[2], uint32_t dst, const bf16* src_base,
                                            int64_t batch_stride, int64_t seq_stride, uint8_t* flags) const {
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const int row = 64 * g + 8 * rg;  // first row of the group within the tile
      const int t0 = j * kBN + row;     // its first key
      const bf16* src;
      bool page_valid = true;
      if constexpr (kPaged) {
        const int32_t id = ids[g];
        page_valid = id >= 0 && id < p.num_pages;
        const int64_t in_page = t0 & ((1 << p.page_size_log2) - 1);
        src = src_base + (int64_t(page_valid ? id : 0) * batch_stride + in_page * seq_stride);
        // An invalid page (keys before kv_len on a page id out of range): its keys are dropped (and zeroed).
        if (flags != nullptr && chunk == 0) flags[8 * g + rg] = uint8_t(!page_valid && t0 < kv_len);
      } else {
        src = src_base + ((int64_t(keys.kv_key0) + t0) * seq_stride + int64_t(keys.kv_batch) * batch_stride);
      }
      // Row row + r sits at at0 + 128 r, its chunk at (chunk % 8) ^ r (row % 8 == 0: sm90_tile_offset).
      const uint32_t at0 = dst + uint32_t(chunk >> 3) * Tr::kHalfKV + uint32_t(row) * 128u;
      if (page_valid && t0 + Tr::kGroupRows <= kv_len) {
#pragma unroll
        for (int r = 0; r < Tr::kGroupRows; ++r) {
          cp_async16_zfill(at0 + uint32_t(r) * 128u + (uint32_t((chunk & 7) ^ r) << 4), src, true);
          src += seq_stride;
        }
      } else {
#pragma unroll
        for (int r = 0; r < Tr::kGroupRows; ++r) {
          const bool valid = page_valid && t0 + r < kv_len;
          cp_async16_zfill(at0 + uint32_t(r) * 128u + (uint32_t((chunk & 7) ^ r) << 4), valid ? src : src_base,
                           valid);
          src += seq_stride;
        }
      }
    }
  }

  // Q after the item's first K/V tile: its buffer frees only when both consumers issued the previous item's last
  // S, while the tile's stages free earlier. q_loads: Q tiles loaded by this block.
  template <class Hooks>
  __device__ __forceinline__ void copy_q(uint32_t& q_loads, Hooks& hooks, int item_no) const {
    if (q_loads > 0) mbarrier_wait(sm.q_empty, (q_loads - 1u) & 1u);
    hooks.at(PrefillSm90Point::kProducerQ, item_no);
    ++q_loads;
    const int64_t q_off = kRaggedQ ? int64_t(qt.seq_lo) * p.q_seq_stride : int64_t(b) * p.q_batch_stride;
    // Packed rows m = rg + 8 r: HB <= 4 divides 8, so all are head qh0 + rg % HB, sequence rows i0 + r 8 / HB
    // (stepping one pointer; rows past the sequence are zeros, never stored).
    const int i0 = qt.row0 + (rg >> qt.hb_log2), di = 8 >> qt.hb_log2;
    const bf16* const q0 = static_cast<const bf16*>(p.q_ptr) + q_off + chunk * 8;
    const bf16* q = q0 + (int64_t(i0) * p.q_seq_stride +
                          int64_t(qt.qh0 + (rg & ((1 << qt.hb_log2) - 1))) * p.q_head_stride);
    const int64_t q_step = int64_t(di) * p.q_seq_stride;
    const uint32_t q_dst = sm.base + sm90_tile_offset(rg, chunk, Tr::kHalfQ);  // row rg + 8 r: + 1024 r
#pragma unroll
    for (int r = 0; r < kBM / 8; ++r) {
      const bool valid = i0 + r * di < qt.q_len;
      cp_async16_zfill(q_dst + uint32_t(r) * 1024u, valid ? q : q0, valid);
      q += q_step;
    }
    cp_async_mbarrier_arrive(sm.q_full);
  }

  // ---- TMA ----
  // Tile j by TMA: it lies wholly below kv_len (TMA cannot zero-fill past a sequence's keys inside its tensor).
  __device__ __forceinline__ bool by_tma(int j) const { return tma && (j + 1) * kBN <= kv_len; }

  // Paged TMA: lane 0 of each producer warp writes the page flags of its parts' row groups (from a ballot: the
  // thread that arrives for the tile stores them), 1 for keys before kv_len on an invalid page. box_id: this
  // lane's part's page id.
  __device__ __forceinline__ void write_part_flags(int j, const int32_t& box_id, uint8_t* flags) const {
    const bool bad = has_box && !(box_id >= 0 && box_id < p.num_pages);
    const uint32_t bad_lanes = __ballot_sync(0xffffffffu, bad);
    if (lane == 0) {
#pragma unroll
      for (int g = 0; g < Tr::kGroups; ++g) {
        const int q = (g * kGroupRows) >> seg_log2;  // the part of row group g
        if ((q & 3) == warp) {
          flags[g] = uint8_t(((bad_lanes >> (2 * (q >> 2))) & 1u) != 0u && j * kBN + g * kGroupRows < kv_len);
        }
      }
    }
  }

  // A whole tile of K or V by TMA into dst, its bytes completing on bar. Contiguous: thread 0 copies the two
  // halves. Paged: each lane with a part copies one half of it; a box of an invalid page id lies outside the map
  // and lands as zeros (V rows there must be finite; the flags drop the keys).
  __device__ __forceinline__ void tma_tile(int j, const int32_t& box_id, uint32_t dst, const CUtensorMap* map,
                                           uint64_t* bar) const {
    if constexpr (kPaged) {
      if (lane == 0) {
        if (warp_box_bytes != 0u) {
          mbarrier_arrive_expect_tx(bar, warp_box_bytes);
        } else {
          mbarrier_arrive(bar);
        }
      }
      __syncwarp();  // the bytes announced before any of them can land
      if (has_box) {
        const int half = lane & 1;
        const int in_page = (j * kBN) & ((1 << p.page_size_log2) - 1);  // 0 unless pages exceed a tile
        tma_load_4d(dst + uint32_t(half) * Tr::kHalfKV + (uint32_t(my_part) << seg_log2) * 128u, map, bar,
                    64 * half, qt.kvh, in_page, box_id);
      }
    } else {
      if (tid == 0) {
        const int key = keys.kv_key0 + j * kBN;
        mbarrier_arrive_expect_tx(bar, Tr::kTileBytes);
        tma_load_4d(dst, map, bar, 0, qt.kvh, key, keys.kv_batch);
        tma_load_4d(dst + Tr::kHalfKV, map, bar, 64, qt.kvh, key, keys.kv_batch);
      }
    }
  }

  // ---- one K/V tile into the ring ----
  // K and V run in separate rings: K_j's stage frees as soon as both consumers' S_j is done, a tile earlier than
  // V_j's (freed after P V), which gives the copies of K a longer lead. stage / phase: the ring position, issued:
  // tiles issued by this block (a stage is waited on from its second use); ids / box_id: tile j's page ids, and
  // on return tile j + 1's (read a tile ahead).
  __device__ __forceinline__ void copy_kv(int j, int& stage, uint32_t& phase, uint32_t& issued, int32_t (&ids)[2],
                                          int32_t& box_id) const {
    const uint32_t sK = sm.base + Tr::kQBytes + uint32_t(stage) * 2 * Tr::kTileBytes, sV = sK + Tr::kTileBytes;
    uint8_t* const flags = kPaged ? sm.page_flags + stage * Tr::kGroups : nullptr;
    int32_t next_ids[2] = {-1, -1};
    int32_t next_box_id = -1;
    if constexpr (kPaged) {
      if (j + 1 < n_tiles) {
        if (tma) next_box_id = box_page_id(j + 1);
        if (!by_tma(j + 1)) {
          next_ids[0] = group_page_id(j + 1, 0);
          next_ids[1] = group_page_id(j + 1, 1);
        }
      }
    }
    if (issued >= kStages) mbarrier_wait(sm.k_empty + stage, phase ^ 1u);  // its last tile's S done
    if (by_tma(j)) {  // a whole tile
      if constexpr (kPaged) write_part_flags(j, box_id, flags);
      tma_tile(j, box_id, sK, &maps.k, sm.k_full + stage);
      if (issued >= kStages) mbarrier_wait(sm.v_empty + stage, phase ^ 1u);
      tma_tile(j, box_id, sV, &maps.v, sm.v_full + stage);
    } else if (tma) {  // the last, partial tile: cp.async zero-fills past kv_len; then the TMA arrivals (thread
      // 0's, paged lane 0's of each warp) once every producer thread's copies have landed (an asynchronous
      // arrival that only holds the phase open, cp.async.mbarrier.arrive without .noinc, from threads that
      // never wait on the barrier, is what compute-sanitizer's synccheck rejects as a missing wait)
      if constexpr (kPaged) write_part_flags(j, box_id, flags);
      copy_tile(j, ids, sK, k_base, p.k_batch_stride, p.k_seq_stride, nullptr);
      if (issued >= kStages) mbarrier_wait(sm.v_empty + stage, phase ^ 1u);
      copy_tile(j, ids, sV, v_base, p.v_batch_stride, p.v_seq_stride, nullptr);
      cp_async_commit();
      cp_async_wait<0>();
      named_barrier_sync(1, 128);
      if (kPaged ? lane == 0 : tid == 0) {
        mbarrier_arrive(sm.k_full + stage);
        mbarrier_arrive(sm.v_full + stage);
      }
    } else {
      copy_tile(j, ids, sK, k_base, p.k_batch_stride, p.k_seq_stride, flags);
      cp_async_mbarrier_arrive(sm.k_full + stage);
      mbarrier_arrive(sm.k_full + stage);  // releases the page flags (plain stores)
      if (issued >= kStages) mbarrier_wait(sm.v_empty + stage, phase ^ 1u);
      copy_tile(j, ids, sV, v_base, p.v_batch_stride, p.v_seq_stride, nullptr);
      cp_async_mbarrier_arrive(sm.v_full + stage);
    }
    ids[0] = next_ids[0];
    ids[1] = next_ids[1];
    box_id = next_box_id;
    ++issued;
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// The producer warpgroup's life (tid < 128): every item of the block, K/V tile 0, then Q once the consumers read
// the last one, then tiles 1 ...
template <bool kRaggedQ, bool kPaged, class Hooks>
__device__ __forceinline__ void prefill_sm90_producer(const PrefillParams& p, const PrefillSm90KvMaps& maps,
                                                      const PrefillSm90Smem& sm, const PrefillSm90Scheduler& sched,
                                                      Hooks& hooks, int tid, int lane, bool tma) {
  using Tr = PrefillSm90Traits;
  using bf16 = __nv_bfloat16;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN;
  const int chunk = tid % Tr::kChunks;
  const int rg = tid / Tr::kChunks;
  int stage = 0;         // the ring position of the next tile
  uint32_t issued = 0;   // tiles issued by this block
  uint32_t phase = 0;    // parity of stage `stage`'s current use
  uint32_t q_loads = 0;  // Q tiles loaded by this block
  int64_t ticket = blockIdx.x;  // PrefillSm90Scheduler::publish
  for (int item_no = 0;; ++item_no) {
    if (tid == 0) sched.publish(p, item_no, ticket);
    const int64_t w = sched.read(item_no);
    hooks.at(PrefillSm90Point::kProducerItem, item_no);
    if (w >= sched.num_items) break;
    const QTile qt = locate_q_tile<kBM, kRaggedQ>(p, unsigned(w));
    if (qt.b < 0) continue;  // idle item
    const TileKeys keys = tile_keys<kPaged>(p, qt);
    const int n_tiles = (keys.n_end + kBN - 1) / kBN;
    if (n_tiles == 0) continue;  // the consumers write zeros without Q
    const int b = qt.b, kv_len = keys.kv_len;

    const bf16* const k_base = static_cast<const bf16*>(p.k_ptr) + (int64_t(qt.kvh) * p.k_head_stride + chunk * 8);
    const bf16* const v_base = static_cast<const bf16*>(p.v_ptr) + (int64_t(qt.kvh) * p.v_head_stride + chunk * 8);
    const int warp = tid >> 5;
    const int seg_log2 = kPaged ? min(p.page_size_log2, 7) : 7;
    const int n_parts = kBN >> seg_log2;
    const int my_part = warp + 4 * (lane >> 1);
    const bool has_box = my_part < n_parts;
    const int warp_parts = n_parts > warp ? (n_parts - warp + 3) / 4 : 0;
    const uint32_t warp_box_bytes = uint32_t(2 * warp_parts) * (128u << seg_log2);
    const PrefillSm90KvCopy<kRaggedQ, kPaged> copy{p,       maps,    sm,   qt,       keys,     tid,     lane,
                                                   chunk,   rg,      tma,  n_tiles,  b,        kv_len,  k_base,
                                                   v_base,  warp,    seg_log2, n_parts, my_part, has_box,
                                                   warp_box_bytes};
    // Paged: the page ids of tile j, read a tile ahead (their latency would otherwise delay every tile's copies):
    // per thread and row group for cp.async (ids); with TMA, per part (box_id: the flags of every tile, the
    // copies of whole ones).
    int32_t ids[2] = {-1, -1};
    int32_t box_id = -1;
    if constexpr (kPaged) {
      if (tma) box_id = copy.box_page_id(0);
      if (!copy.by_tma(0)) {
        ids[0] = copy.group_page_id(0, 0);
        ids[1] = copy.group_page_id(0, 1);
      }
    }
    copy.copy_kv(0, stage, phase, issued, ids, box_id);
    copy.copy_q(q_loads, hooks, item_no);  // peeled: the Q tile's values are dead in the loop
    for (int j = 1; j < n_tiles; ++j) copy.copy_kv(j, stage, phase, issued, ids, box_id);
    hooks.at(PrefillSm90Point::kProducerIssued, item_no);
    hooks.tiles(item_no, n_tiles);
  }
  cp_async_wait<0>();
}

}  // namespace attention
}  // namespace astrai
