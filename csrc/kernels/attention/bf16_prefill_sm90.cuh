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
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap (a type only: the launcher reaches the driver through the runtime)
#include <cuda_bf16.h>

#include "kernels/attention/bf16_prefill.cuh"
#include "kernels/attention/params.h"
#include "kernels/attention/prefill_schedule.h"
#include "kernels/common/ptx/arch.cuh"
#include "kernels/common/ptx/async_copy.cuh"
#include "kernels/common/ptx/math.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/smem.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/common/ptx/tma.cuh"
#include "kernels/common/ptx/wgmma_sm90.cuh"

namespace astrai {
namespace attention {

// Block shape. Shared memory: Q (128 x 128) 32 KB + 3 stages x (K, V: 128 x 128) 192 KB + mbarriers and page flags
// + 1 KB of alignment slack: 225 KB of the 227 KB a block may take; one block per SM. Every (rows x 128) operand is
// stored as two halves of 64 columns (128-byte rows, chunk c of row r at chunk c ^ (r % 8)): the canonical
// 128-byte-swizzle layout of wgmma, K-major for Q and K, MN-major for V.
struct PrefillSm90Traits {
  static constexpr int kHeadDim = 128;
  static constexpr int kConsumers = 2;                 // consumer warpgroups (64 packed rows each)
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBM = 128;                      // packed rows per block (the mma.sync kernel's tile)
  static constexpr int kBN = 128;                      // keys per K/V tile
  static constexpr int kStages = 3;                    // tiles j - 1 (P V), j (S), j + 1 (landing)
  static constexpr int kChunks = kHeadDim / 8;         // 16-byte chunks per row
  static constexpr int kGroupRows = 8;                 // consecutive K/V rows copied from one page id
  static constexpr int kGroups = kBN / kGroupRows;     // row groups per tile (page flags)
  // setmaxnreg: 128 x producer + 256 x consumer <= 128 x 504 (the 168 per thread the launch holds). Paged K/V's
  // producer (page ids, one tile ahead) spilled at 40, the contiguous one does not; the consumers fit 224 unspilled.
  static constexpr int producer_regs(bool paged) { return paged ? 56 : 40; }
  static constexpr int consumer_regs(bool paged) { return paged ? 224 : 232; }
  static constexpr uint32_t kHalfQ = kBM * 128;        // bytes of one 64-column half of Q
  static constexpr uint32_t kHalfKV = kBN * 128;       // bytes of one half of a K or V tile
  static constexpr uint32_t kQBytes = 2 * kHalfQ;
  static constexpr uint32_t kTileBytes = 2 * kHalfKV;  // one K or V tile
  // mbarriers: K, V full / empty [kStages] each, Q full / empty, work-item full / empty [2] each (18 x 8 bytes);
  // then the two work-item slots (int32).
  static constexpr uint32_t kBarOffset = kQBytes + kStages * 2 * kTileBytes;
  static constexpr uint32_t kItemOffset = kBarOffset + 4 * kStages * 8 + 2 * 8 + 4 * 8;
  static constexpr uint32_t kFlagOffset = kBarOffset + 256;  // page flags: [stage][group] bytes, 16-byte aligned
  static constexpr int kSmemBytes = int(kFlagOffset) + kStages * kGroups + 1024;  // + alignment slack
  static_assert(kBN == kBM && 128 / kChunks * 2 * kGroupRows == kBN, "a producer thread copies two row groups");
  static_assert(kItemOffset + 2 * 4 <= kFlagOffset, "barriers and item slots fit their region");
};
static_assert(PrefillSm90Traits::kBM == prefill_block_rows(128), "the sm_90a kernel takes the planned Q tiles");

// TMA descriptors of K and V, each a 4-D tensor (head_dim, kv heads, keys, sequences; paged: head_dim, kv heads,
// page slots, pages) read in boxes of 64 columns x 128 keys (paged: x min(page size, 128) slots of one page) with
// the 128-byte swizzle: a half of a K/V tile, or of one page's part of it. With `enabled`, every K/V tile that lies
// wholly below the sequence's key count is copied by TMA (per half one instruction from thread 0; paged, one per
// half of each page's part, spread over the lanes of the four producer warps; instead of 16 cp.async per producer
// thread); the tile past the last whole one by cp.async, which zero-fills the keys past the sequence (V rows there
// must be finite). Without it (the launcher could not encode them, or ASTRAI_PREFILL_SM90_TMA=0), every tile by
// cp.async: the same bits.
struct PrefillSm90KvMaps {  // 128-byte aligned (CUtensorMap)
  CUtensorMap k;
  CUtensorMap v;
  int enabled;
};

// Developer timeline (csrc/tools/prefill_sm90_trace.cu defines ASTRAI_PREFILL_SM90_TRACE; compiled out otherwise):
// clock64 stamps into g_prefill_sm90_trace[block][item n < kTraceItems][role][slot]. Roles: 0 the producer's thread
// 0, 1 + c consumer c's first thread, 3 consumer 0's per-tile stamps (slot j: tile j < 8 done).
struct PrefillSm90Trace {
  static constexpr int kItems = 64, kRoles = 4, kSlots = 8;
  // role 0
  static constexpr int kProdItem = 0, kProdQ = 1, kProdIssued = 2, kMaskBits = 6, kTiles = 7;
  // roles 1, 2
  static constexpr int kItem = 0, kQReady = 1, kFirstS = 2, kLoopEnd = 3, kLastPV = 4, kStored = 5, kK0Ready = 6,
                       kTurn0 = 7;
};
#ifdef ASTRAI_PREFILL_SM90_TRACE
__device__ unsigned long long* g_prefill_sm90_trace;
__device__ __forceinline__ void prefill_sm90_trace(int role, int item, int slot, unsigned long long value) {
  using T = PrefillSm90Trace;
  if (g_prefill_sm90_trace != nullptr && item < T::kItems) {
    g_prefill_sm90_trace[((int64_t(blockIdx.x) * T::kItems + item) * T::kRoles + role) * T::kSlots + slot] = value;
  }
}
#define ASTRAI_SM90_TRACE_VALUE(cond, role, item, slot, value) \
  do {                                                         \
    if (cond) prefill_sm90_trace(role, item, slot, value);     \
  } while (0)
#else
#define ASTRAI_SM90_TRACE_VALUE(cond, role, item, slot, value) \
  do {                                                         \
    (void)(cond);                                              \
  } while (0)
#endif
#define ASTRAI_SM90_TRACE(cond, role, item, slot) ASTRAI_SM90_TRACE_VALUE(cond, role, item, slot, clock64())

// Byte offset of 16-byte chunk c (0..15) of row r in a two-half operand of `half_bytes` per half.
__device__ __forceinline__ uint32_t sm90_tile_offset(int r, int c, uint32_t half_bytes) {
  return uint32_t(c >> 3) * half_bytes + uint32_t(r) * 128u + (uint32_t((c & 7) ^ (r & 7)) << 4);
}

// Byte g (a compile-time index after unrolling) of 16 page-flag bytes.
__device__ __forceinline__ uint32_t page_flag(const uint4& f, int g) {
  const uint32_t w = g < 4 ? f.x : g < 8 ? f.y : g < 12 ? f.z : f.w;
  return (w >> (8 * (g % 4))) & 0xffu;
}

// op(t[0], ..., t[15]) as a balanced tree (4 levels of independent operations instead of a chain of 15).
template <typename Op>
__device__ __forceinline__ float tree_reduce16(const float (&t)[16], Op op) {
  float u[8];
#pragma unroll
  for (int n = 0; n < 8; ++n) u[n] = op(t[n], t[n + 8]);
#pragma unroll
  for (int n = 0; n < 4; ++n) u[n] = op(u[n], u[n + 4]);
  return op(op(u[0], u[2]), op(u[1], u[3]));
}

// Masked score tiles: a lane holds columns nt * 8 + 2 (lane % 4) + e (e = 0, 1) of its rows, relative to the tile's
// first key n0 (the mma.sync kernel computes the same limits inline, bf16_prefill.cuh). Written without a branch per
// column: with one (short-circuit tests, as there) the masked tiles took twice the others' time (H200 clock64 trace,
// 2026-12-01).
//
// Row i of the sequence (di = i - row0) keeps columns below the returned limit: kv_len, mask_len, its causal
// position; none past q_len or mask_q_len.
__device__ __forceinline__ int masked_row_limit(const PrefillParams& p, int i, int di, int q_len_b, int kv_len,
                                                int pos0, int n0) {
  const bool has_mask = p.mask_ptr != nullptr;
  int lim = kv_len - n0;
  if (has_mask) lim = min(lim, p.mask_len - n0);
  if (p.is_causal) lim = min(lim, pos0 + di - n0 + 1);
  if (i >= q_len_b || (has_mask && p.mask_q_stride != 0 && i >= p.mask_q_len)) lim = 0;
  return lim;
}
// With a mask: bit 2 nt + e clear where the mask byte of that column (below lim) is zero; kNT <= 16 n-tiles.
template <int kNT>
__device__ __forceinline__ uint32_t mask_row_keep(const PrefillParams& p, int b, int i, int n0, int lim, int lane) {
  static_assert(kNT >= 1 && kNT <= 16, "32 keep bits");
  uint32_t keep = ~0u;
  if (lim > 0) {
    const uint8_t* mrow = p.mask_ptr + (int64_t(b) * p.mask_batch_stride + int64_t(i) * p.mask_q_stride + n0);
    const int c0 = 2 * (lane & 3);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = min(nt * 8 + c0 + e, lim - 1);  // inside the mask row; columns past lim are dropped anyway
        keep &= ~(uint32_t(mrow[col] == 0) << (2 * nt + e));
      }
  }
  return keep;
}

// A 4 x 4 transpose over the lanes of a quad: lane q's v[e] becomes lane e's v[q] (q = lane % 4). Two exchanges:
// the off-diagonal 2 x 2 blocks between lanes q and q ^ 2, then the corners of each block between q and q ^ 1.
__device__ __forceinline__ void quad_transpose4(uint32_t (&v)[4], int q) {
  const bool upper = (q & 2) != 0;
  uint32_t a = upper ? v[0] : v[2], b = upper ? v[1] : v[3];
  a = __shfl_xor_sync(0xffffffffu, a, 2);
  b = __shfl_xor_sync(0xffffffffu, b, 2);
  if (upper) {
    v[0] = a;
    v[1] = b;
  } else {
    v[2] = a;
    v[3] = b;
  }
  const bool odd = (q & 1) != 0;
  a = odd ? v[0] : v[1];
  b = odd ? v[2] : v[3];
  a = __shfl_xor_sync(0xffffffffu, a, 1);
  b = __shfl_xor_sync(0xffffffffu, b, 1);
  if (odd) {
    v[0] = a;
    v[2] = b;
  } else {
    v[1] = a;
    v[3] = b;
  }
}

// Semantics and Q tiles: as prefill_bf16_kernel<128, ...> (bf16_prefill.cuh); block: kThreads threads, kSmemBytes
// of dynamic shared memory. Persistent: the work items are the mma.sync kernel's blocks (Q tile x head block, in
// its order); block k takes item k first, then the next item from p.sched_counter_ptr (gridDim.x + the counter's
// old value: a dynamic schedule, the counter zeroed before the launch), or k + n gridDim.x when that is null.
// Warpgroup 0 copies; consumer c (warpgroup 1 + c) computes packed rows 64 c .. 64 c + 63. kPaged: pages of >=
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
template <bool kRaggedQ, bool kPaged>
__global__ void __launch_bounds__(PrefillSm90Traits::kThreads, 1)
    prefill_bf16_sm90_kernel(const __grid_constant__ PrefillParams p, const __grid_constant__ PrefillSm90KvMaps maps) {
#if ASTRAI_WGMMA
  using Tr = PrefillSm90Traits;
  using bf16 = __nv_bfloat16;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kStages = Tr::kStages, kGroupRows = Tr::kGroupRows;

  extern __shared__ __align__(128) uint8_t smem_raw[];
  // The swizzle atoms must start 1024-byte aligned (descriptor base offset 0).
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  uint8_t* const smem = smem_raw + (base - raw_addr);
  uint64_t* const k_full = reinterpret_cast<uint64_t*>(smem + Tr::kBarOffset);
  uint64_t* const k_empty = k_full + kStages;
  uint64_t* const v_full = k_empty + kStages;
  uint64_t* const v_empty = v_full + kStages;
  uint64_t* const q_full = v_empty + kStages;
  uint64_t* const q_empty = q_full + 1;
  uint64_t* const item_full = q_empty + 1;  // [2]
  uint64_t* const item_empty = item_full + 2;  // [2]
  volatile int32_t* const item_slot = reinterpret_cast<volatile int32_t*>(smem + Tr::kItemOffset);  // [2]
  uint8_t* const page_flags = smem + Tr::kFlagOffset;

  const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int64_t num_items = int64_t(p.num_q_tiles) * (p.num_kv_heads * (group >> prefill_heads_log2(group)));

  const bool tma = maps.enabled != 0;
  const int tma_arrivals = kPaged ? 4 : 1;  // TMA mode: thread 0, or lane 0 of each producer warp (paged)
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
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

  // The block's n-th work item: thread 0 (the producer's) publishes it in slot n % 2 (publish_item), every thread
  // reads it in order (read_item). num_items or more: no more work.
  auto read_item = [&](int n) -> int64_t {
    const int slot = n & 1;
    mbarrier_wait(item_full + slot, uint32_t(n >> 1) & 1u);
    // Read by every lane, then lane 0's value for all: ptxas then knows the item (and every trip count derived
    // from it) uniform across the warp, which it needs to keep the wgmma asynchronous.
    const int32_t w = __shfl_sync(0xffffffffu, item_slot[slot], 0);
    mbarrier_arrive(item_empty + slot);
    return w;
  };

  if (wg == 0) {
    // ==== producer: per item, tile 0, then Q once the consumers read the last one, then tiles 1 ... ============
    setmaxnreg_dec<Tr::producer_regs(kPaged)>();
    const int chunk = tid % Tr::kChunks;
    const int rg = tid / Tr::kChunks;  // row groups rg (rows 8 rg ..) and 8 + rg (rows 64 + 8 rg ..) of a tile
    int stage = 0;
    uint32_t phase = 0;      // parity of stage `stage`'s current use
    uint32_t issued = 0;     // tiles issued by this block (a stage is waited on from its second use)
    uint32_t q_loads = 0;    // Q tiles loaded by this block
    // Thread 0 draws the counter one item ahead (`ticket`): the atomic's latency passes while the producer copies
    // the current item, not at the next one's start.
    int64_t ticket = blockIdx.x;
    auto publish_item = [&](int n) {
      const int slot = n & 1;
      if (n >= 2) mbarrier_wait(item_empty + slot, (uint32_t(n >> 1) & 1u) ^ 1u);  // all read its last item
      const int64_t w = ticket;
      if (w < num_items) {  // past the end the block stops: no more draws
        ticket = p.sched_counter_ptr != nullptr
                     ? int64_t(gridDim.x) + int64_t(atomicAdd(reinterpret_cast<unsigned*>(p.sched_counter_ptr), 1u))
                     : int64_t(blockIdx.x) + int64_t(n + 1) * gridDim.x;
      }
      item_slot[slot] = int32_t(w < num_items ? w : num_items);
      mbarrier_arrive(item_full + slot);
    };
    for (int item_no = 0;; ++item_no) {
      if (tid == 0) publish_item(item_no);
      const int64_t w = read_item(item_no);
      ASTRAI_SM90_TRACE(tid == 0, 0, item_no, PrefillSm90Trace::kProdItem);
      if (w >= num_items) break;
      const QTile qt = locate_q_tile<kBM, kRaggedQ>(p, unsigned(w));
      if (qt.b < 0) continue;  // idle item
      const TileKeys keys = tile_keys<kPaged>(p, qt);
      const int n_tiles = (keys.n_end + kBN - 1) / kBN;
      if (n_tiles == 0) continue;  // the consumers write zeros without Q
      const int b = qt.b, kv_len = keys.kv_len;

      const bf16* const k_base = static_cast<const bf16*>(p.k_ptr) + (int64_t(qt.kvh) * p.k_head_stride + chunk * 8);
      const bf16* const v_base = static_cast<const bf16*>(p.v_ptr) + (int64_t(qt.kvh) * p.v_head_stride + chunk * 8);
      // Paged: the page id of this thread's group g of tile j (-1 past kv_len), read once for K and V.
      // The read depends on max_kv_len only (the page table's width), not on kv_len: it need not wait for kv_lens.
      auto group_page_id = [&](int j, int g) -> int32_t {
        const int t0 = j * kBN + 64 * g + 8 * rg;
        const int32_t id = t0 < p.max_kv_len ? __ldg(p.page_table_ptr + (int64_t(b) * p.page_table_batch_stride +
                                                                         (t0 >> p.page_size_log2)))
                                             : -1;
        return t0 < kv_len ? id : -1;
      };
      // One K or V tile (j) into `dst`: groups of 8 rows, each from one page id; keys past kv_len and rows of
      // invalid pages are zeros (V rows must be finite: P = 0 times them is 0). K's copy also writes the page flags.
      auto copy_tile = [&](int j, const int32_t (&ids)[2], uint32_t dst, const bf16* src_base, int64_t batch_stride,
                           int64_t seq_stride, uint8_t* flags) {
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
      };
      // Q after the item's first K/V tile: its buffer frees only when both consumers issued the previous item's
      // last S, while the tile's stages free earlier.
      auto copy_q = [&]() {
        if (q_loads > 0) mbarrier_wait(q_empty, (q_loads - 1u) & 1u);
        ASTRAI_SM90_TRACE(tid == 0, 0, item_no, PrefillSm90Trace::kProdQ);
        ++q_loads;
        const int64_t q_off = kRaggedQ ? int64_t(qt.seq_lo) * p.q_seq_stride : int64_t(b) * p.q_batch_stride;
        // Packed rows m = rg + 8 r: HB <= 4 divides 8, so all are head qh0 + rg % HB, sequence rows i0 + r 8 / HB
        // (stepping one pointer; rows past the sequence are zeros, never stored).
        const int i0 = qt.row0 + (rg >> qt.hb_log2), di = 8 >> qt.hb_log2;
        const bf16* const q0 = static_cast<const bf16*>(p.q_ptr) + q_off + chunk * 8;
        const bf16* q = q0 + (int64_t(i0) * p.q_seq_stride +
                              int64_t(qt.qh0 + (rg & ((1 << qt.hb_log2) - 1))) * p.q_head_stride);
        const int64_t q_step = int64_t(di) * p.q_seq_stride;
        const uint32_t q_dst = base + sm90_tile_offset(rg, chunk, Tr::kHalfQ);  // row rg + 8 r: + 1024 r
#pragma unroll
        for (int r = 0; r < kBM / 8; ++r) {
          const bool valid = i0 + r * di < qt.q_len;
          cp_async16_zfill(q_dst + uint32_t(r) * 1024u, valid ? q : q0, valid);
          q += q_step;
        }
        cp_async_mbarrier_arrive(q_full);
      };
      // K and V run in separate rings: K_j's stage frees as soon as both consumers' S_j is done, a tile earlier than
      // V_j's (freed after P V), which gives the copies of K a longer lead.
      // Tile j by TMA: it lies wholly below kv_len (TMA cannot zero-fill past a sequence's keys inside its tensor).
      auto by_tma = [&](int j) { return tma && (j + 1) * kBN <= kv_len; };
      // Paged TMA: a tile is n_parts parts of min(page size, 128) rows, each on one page. Part q is producer warp
      // q % 4's, its 64-column halves lanes 2 (q / 4) and 2 (q / 4) + 1 (spread over the warps: one warp issuing
      // all 16 or 32 boxes of a tile held the tiles back).
      const int warp = tid >> 5;
      const int seg_log2 = kPaged ? min(p.page_size_log2, 7) : 7;
      const int n_parts = kBN >> seg_log2;
      const int my_part = warp + 4 * (lane >> 1);
      const bool has_box = my_part < n_parts;
      const int warp_parts = n_parts > warp ? (n_parts - warp + 3) / 4 : 0;
      const uint32_t warp_box_bytes = uint32_t(2 * warp_parts) * (128u << seg_log2);  // this warp's share of a tile
      // The page id of this lane's part of tile j (-1 without one), read a tile ahead like ids below.
      auto box_page_id = [&](int j) -> int32_t {
        const int t0 = j * kBN + (my_part << seg_log2);
        return has_box && t0 < p.max_kv_len
                   ? __ldg(p.page_table_ptr + (int64_t(b) * p.page_table_batch_stride + (t0 >> p.page_size_log2)))
                   : -1;
      };
      // Paged: the page ids of tile j, read a tile ahead (their latency would otherwise delay every tile's copies):
      // per thread and row group for cp.async (ids); with TMA, per part (box_id: the flags of every tile, the
      // copies of whole ones).
      int32_t ids[2] = {-1, -1};
      int32_t box_id = -1;
      if constexpr (kPaged) {
        if (tma) box_id = box_page_id(0);
        if (!by_tma(0)) {
          ids[0] = group_page_id(0, 0);
          ids[1] = group_page_id(0, 1);
        }
      }
      // Paged TMA: lane 0 of each producer warp writes the page flags of its parts' row groups (from a ballot: the
      // thread that arrives for the tile stores them), 1 for keys before kv_len on an invalid page.
      auto write_part_flags = [&](int j, uint8_t* flags) {
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
      };
      // A whole tile of K or V by TMA into dst, its bytes completing on bar. Contiguous: thread 0 copies the two
      // halves. Paged: each lane with a part copies one half of it; a box of an invalid page id lies outside the
      // map and lands as zeros (V rows there must be finite; the flags drop the keys).
      auto tma_tile = [&](int j, uint32_t dst, const CUtensorMap* map, uint64_t* bar) {
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
      };
      auto copy_kv = [&](int j) {
        const uint32_t sK = base + Tr::kQBytes + uint32_t(stage) * 2 * Tr::kTileBytes, sV = sK + Tr::kTileBytes;
        uint8_t* const flags = kPaged ? page_flags + stage * Tr::kGroups : nullptr;
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
        if (issued >= kStages) mbarrier_wait(k_empty + stage, phase ^ 1u);  // its last tile's S done
        if (by_tma(j)) {  // a whole tile
          if constexpr (kPaged) write_part_flags(j, flags);
          tma_tile(j, sK, &maps.k, k_full + stage);
          if (issued >= kStages) mbarrier_wait(v_empty + stage, phase ^ 1u);
          tma_tile(j, sV, &maps.v, v_full + stage);
        } else if (tma) {  // the last, partial tile: cp.async zero-fills past kv_len; then the TMA arrivals (thread
          // 0's, paged lane 0's of each warp) once every producer thread's copies have landed (an asynchronous
          // arrival that only holds the phase open, cp.async.mbarrier.arrive without .noinc, from threads that
          // never wait on the barrier, is what compute-sanitizer's synccheck rejects as a missing wait)
          if constexpr (kPaged) write_part_flags(j, flags);
          copy_tile(j, ids, sK, k_base, p.k_batch_stride, p.k_seq_stride, nullptr);
          if (issued >= kStages) mbarrier_wait(v_empty + stage, phase ^ 1u);
          copy_tile(j, ids, sV, v_base, p.v_batch_stride, p.v_seq_stride, nullptr);
          cp_async_commit();
          cp_async_wait<0>();
          named_barrier_sync(1, 128);
          if (kPaged ? lane == 0 : tid == 0) {
            mbarrier_arrive(k_full + stage);
            mbarrier_arrive(v_full + stage);
          }
        } else {
          copy_tile(j, ids, sK, k_base, p.k_batch_stride, p.k_seq_stride, flags);
          cp_async_mbarrier_arrive(k_full + stage);
          mbarrier_arrive(k_full + stage);  // releases the page flags (plain stores)
          if (issued >= kStages) mbarrier_wait(v_empty + stage, phase ^ 1u);
          copy_tile(j, ids, sV, v_base, p.v_batch_stride, p.v_seq_stride, nullptr);
          cp_async_mbarrier_arrive(v_full + stage);
        }
        ids[0] = next_ids[0];
        ids[1] = next_ids[1];
        box_id = next_box_id;
        ++issued;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1u;
        }
      };
      copy_kv(0);
      copy_q();  // peeled: the Q tile's values are dead in the loop
      for (int j = 1; j < n_tiles; ++j) copy_kv(j);
      ASTRAI_SM90_TRACE(tid == 0, 0, item_no, PrefillSm90Trace::kProdIssued);
      ASTRAI_SM90_TRACE_VALUE(tid == 0, 0, item_no, PrefillSm90Trace::kTiles, n_tiles);
    }
    cp_async_wait<0>();
    return;
  }

  // ==== consumers ==========================================================================================
  setmaxnreg_inc<Tr::consumer_regs(kPaged)>();
  const int c = wg - 1;  // consumer index
  const int wq = (tid >> 5) & 3;  // warp within the warpgroup
  const int wg_row0 = c * 64;                                // this consumer's first packed row
  const int my_row0 = wg_row0 + wq * 16 + (lane >> 2);       // this thread's first packed row (the second: + 8)
  const bool has_mask = p.mask_ptr != nullptr;

  float acc_o[64];  // O, unnormalized: acc_o[4 n + e] = O[row g + 8 (e / 2)][8 n + 2 (lane % 4) + e % 2]
  float row_max[2], row_sum[2];
  uint32_t pa[8][4];  // P in bf16, the A fragments of P V: k-step kk is n-tiles 2 kk and 2 kk + 1 of S

  // Descriptors: one per operand base, then each k-step's and stage's by adding its byte offset / 16 to the low
  // word (wgmma_desc_sw128_add); without this the descriptor arithmetic took ~130 issue slots per tile and warp.
  const uint64_t q_desc = wgmma_desc_sw128(base + uint32_t(wg_row0) * 128, 16, 1024);
  const uint64_t k_desc = wgmma_desc_sw128(base + Tr::kQBytes, 16, 1024);
  const uint64_t v_desc = wgmma_desc_sw128(base + Tr::kQBytes + Tr::kTileBytes, Tr::kHalfKV, 1024);
  constexpr uint32_t kStageBytes = 2 * Tr::kTileBytes;
  // S = Q K^T of the tile in `stage`: one commit group of 8 k-steps.
  auto issue_s = [&](float (&s)[64], int stage) {
    const uint64_t k_stage = wgmma_desc_sw128_add(k_desc, uint32_t(stage) * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t half = uint32_t(kk >> 2), step = uint32_t(kk & 3) * 32;
      const uint64_t da = wgmma_desc_sw128_add(q_desc, half * Tr::kHalfQ + step);
      const uint64_t db = wgmma_desc_sw128_add(k_stage, half * Tr::kHalfKV + step);
      wgmma_m64n128k16_ss(s, da, db, kk > 0);
    }
    wgmma_commit();
  };
  // O += P V of the tile in `stage`, P from pa: one commit group of 8 k-steps of 16 keys.
  auto issue_pv = [&](int stage) {
    const uint64_t v_stage = wgmma_desc_sw128_add(v_desc, uint32_t(stage) * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      wgmma_m64n128k16_rs_tnspb(acc_o, pa[kk], wgmma_desc_sw128_add(v_stage, uint32_t(kk) * 2048), true);
    }
    wgmma_commit();
  };

  // After a wait that completes P V: O and pa stay in their registers until here (see wgmma_fence_operand).
  auto fence_pv_operands = [&]() {
#pragma unroll
    for (int i = 0; i < 64; ++i) wgmma_fence_operand(acc_o[i]);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) wgmma_fence_operand(pa[kk][e]);
  };

  // The tensor cores pass between the consumers (named barriers 3 + c) across all items: consumer 0 goes first,
  // and takes consumer 1's last pass after the last item, so that no barrier is left mid-phase at the exit.
  const int my_turn = 3 + c, their_turn = 4 - c;
  if (c == 1) named_barrier_arrive(3, 256);
  int stage = 0;         // the block's tile count % 3
  uint32_t phase = 0;    // parity of the current use of stage
  uint32_t q_uses = 0;   // Q tiles read by this block
  for (int item_no = 0;; ++item_no) {
    const int64_t w = read_item(item_no);
    const bool tracer = (tid & 127) == 0;  // the trace's stamping thread of this consumer (compiled out normally)
    ASTRAI_SM90_TRACE(tracer, 1 + c, item_no, PrefillSm90Trace::kItem);
    if (w >= num_items) break;
    QTile qt = locate_q_tile<kBM, kRaggedQ>(p, unsigned(w));
    if (qt.b < 0) continue;  // idle item
    const TileKeys keys = tile_keys<kPaged>(p, qt);
    const int n_tiles = (keys.n_end + kBN - 1) / kBN;  // block-uniform trip count
    const int b = qt.b, row0 = qt.row0, q_len_b = qt.q_len, hb_log2 = qt.hb_log2;
    const int kv_len = keys.kv_len, pos0 = keys.pos0;

#pragma unroll
    for (int i = 0; i < 64; ++i) acc_o[i] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[h] = prefill_neg_inf();
      row_sum[h] = 0.f;
    }

    // Drops the keys of tile j that a row may not see (-inf scores): past kv_len, the mask or the causal position,
    // on invalid pages. Only for the tiles that need it; one softmax (below) serves every tile (with a masked and an
    // unmasked copy of it, the unmasked tiles ran ~1.5% slower once the mask lost its branches: H200 trace).
    auto apply_mask = [&](float (&s)[64], int j, const uint4& page_bad) {
      const int n0 = j * kBN;
      uint32_t page_keep = ~0u;  // bits 2 n, 2 n + 1: n-tile n, which is row group n, lies on a valid page
      if constexpr (kPaged) {
        static_assert(kGroupRows == 8, "a row group is an n-tile of S");
#pragma unroll
        for (int n = 0; n < 16; ++n) page_keep &= ~(uint32_t(page_flag(page_bad, n) != 0u) * (3u << (2 * n)));
      }
      (void)page_bad;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int di = (my_row0 + 8 * h) >> hb_log2;
        const int i = row0 + di;
        const int row_lim = masked_row_limit(p, i, di, q_len_b, kv_len, pos0, n0);
        // This lane's column 8 n + 2 (lane % 4) + e is kept iff 8 n + e < lim (and its keep bit: a mask, pages).
        const int lim = row_lim - 2 * (lane & 3);
        if (kPaged || has_mask) {
          const uint32_t mask_keep = has_mask ? mask_row_keep<16>(p, b, i, n0, row_lim, lane) : ~0u;
          const uint32_t keep = mask_keep & page_keep;
#pragma unroll
          for (int n = 0; n < 16; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float v = s[4 * n + 2 * h + e];
              s[4 * n + 2 * h + e] = 8 * n + e < lim && ((keep >> (2 * n + e)) & 1u) ? v : prefill_neg_inf();
            }
        } else {
#pragma unroll
          for (int n = 0; n < 16; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float v = s[4 * n + 2 * h + e];
              s[4 * n + 2 * h + e] = 8 * n + e < lim ? v : prefill_neg_inf();
            }
        }
      }
    };

    // Scores of tile j to exp2 weights in place (online max, then exp2(s scale - max scale) in one FFMA each: the scale
    // is positive here, so the max of the raw scores is the max of the scaled ones), the running sums updated; alpha:
    // the factor O must take before this tile's P V. Returns whether some row max of this thread grew. Row maxima
    // are kept unscaled.
    auto softmax = [&](float (&s)[64], float (&alpha)[2]) -> bool {
      const float scale = p.scale_log2;
      // Reductions as trees: with two warps per scheduler, serial chains of 32 dependent max / add would leave the
      // issue slots idle for their latency.
      bool moved = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float t[16];
#pragma unroll
        for (int n = 0; n < 16; ++n) t[n] = fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]);
        float mx = fmaxf(row_max[h], tree_reduce16(t, [](float a, float b) { return fmaxf(a, b); }));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // Nothing kept yet: exp2(-inf scale - 0) = 0, not NaN.
        const float neg_m = mx == prefill_neg_inf() ? 0.f : -mx * scale;
        const bool grew = mx != row_max[h];
        alpha[h] = grew ? fast_exp2(fmaf(row_max[h], scale, neg_m)) : 1.f;
        moved |= grew;
        row_max[h] = mx;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          s[4 * n + 2 * h] = fast_exp2(fmaf(s[4 * n + 2 * h], scale, neg_m));
          s[4 * n + 2 * h + 1] = fast_exp2(fmaf(s[4 * n + 2 * h + 1], scale, neg_m));
          t[n] = s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
        }
        row_sum[h] = row_sum[h] * alpha[h] + tree_reduce16(t, [](float a, float b) { return a + b; });
      }
      return moved;
    };

    // ---- main loop ----------------------------------------------------------------------------------
    // Iteration j issues S_j = Q K_j, then O += P_{j-1} V_{j-1}, computes the softmax of S_j, then rescales O and
    // rounds P_j. ptxas places the wait for that P V before the softmax (the SASS, not the source order: a branch
    // that kept it after the exps made the tile 3% slower on the H200), so the softmax runs under the other
    // consumer's products.
    if (n_tiles > 0) {
      mbarrier_wait(q_full, q_uses & 1u);
      ASTRAI_SM90_TRACE(tracer, 1 + c, item_no, PrefillSm90Trace::kQReady);
      ++q_uses;
    }
    int prev_stage = 0;
    uint32_t prev_phase = 0;  // parity of the use of prev_stage
#ifdef ASTRAI_PREFILL_SM90_TRACE
    unsigned long long masked_tiles = 0;  // bit j: tile j took apply_mask
#endif
    for (int j = 0; j < n_tiles; ++j) {
      mbarrier_wait(k_full + stage, phase);
      ASTRAI_SM90_TRACE(tracer && j == 0, 1 + c, item_no, PrefillSm90Trace::kK0Ready);
      if (j > 0) mbarrier_wait(v_full + prev_stage, prev_phase);
      fence_proxy_async_smem();  // the copies (generic proxy) before the tensor cores' reads (async proxy)
      // Paged: byte g of page_bad is nonzero when row group g of the tile lies on an invalid page.
      uint4 page_bad = make_uint4(0u, 0u, 0u, 0u);
      if constexpr (kPaged) page_bad = *reinterpret_cast<const uint4*>(page_flags + stage * Tr::kGroups);
      const bool any_bad = (page_bad.x | page_bad.y | page_bad.z | page_bad.w) != 0u;

      float s[64];
      named_barrier_sync(my_turn, 256);
      ASTRAI_SM90_TRACE(tracer && j == 0, 1 + c, item_no, PrefillSm90Trace::kTurn0);
      wgmma_fence();  // pa and acc_o were written since the last wgmma
      // Each wait sits in the branch of its issues: ptxas proves the accumulators ready per path (a wait<1> that
      // a path without P V could reach would make it serialize every wgmma).
      if (j > 0) {
        issue_s(s, stage);
        issue_pv(prev_stage);
        named_barrier_arrive(their_turn, 256);
        wgmma_wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
      } else {
        issue_s(s, stage);
        named_barrier_arrive(their_turn, 256);
        wgmma_wait<0>();
        ASTRAI_SM90_TRACE(tracer, 1 + c, item_no, PrefillSm90Trace::kFirstS);
      }
      mbarrier_arrive(k_empty + stage);  // K_j read
      if (j == n_tiles - 1) mbarrier_arrive(q_empty);  // Q read for the last time: the next item's may land
#pragma unroll
      for (int i = 0; i < 64; ++i) wgmma_fence_operand(s[i]);

      const int n0 = j * kBN;
      const bool need_mask =
          has_mask || any_bad || n0 + kBN > kv_len || (p.is_causal && n0 + kBN - 1 > pos0);
      float alpha[2];
      if (need_mask) apply_mask(s, j, page_bad);
#ifdef ASTRAI_PREFILL_SM90_TRACE
      if (need_mask && j < 64) masked_tiles |= 1ull << j;
#endif
      const bool moved = softmax(s, alpha);
      wgmma_wait<0>();  // P_{j-1} V_{j-1} done: O and pa are free, and so is tile j - 1
      fence_pv_operands();
      if (j > 0) mbarrier_arrive(v_empty + prev_stage);  // V_{j-1} read
      // Past the first tiles a row max rarely grows: skip the 64 multiplies when no row of the warp moved.
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int i = 0; i < 64; ++i) acc_o[i] *= alpha[(i % 4) / 2];
      }
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        pa[n / 2][(n % 2) * 2] = pack_bf16x2_rn(s[4 * n], s[4 * n + 1]);
        pa[n / 2][(n % 2) * 2 + 1] = pack_bf16x2_rn(s[4 * n + 2], s[4 * n + 3]);
      }
      ASTRAI_SM90_TRACE(tid == 128 && j < PrefillSm90Trace::kSlots, 3, item_no, j);
      prev_stage = stage;
      prev_phase = phase;
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1u;
      }
    }
    ASTRAI_SM90_TRACE(tracer, 1 + c, item_no, PrefillSm90Trace::kLoopEnd);
    ASTRAI_SM90_TRACE_VALUE(tid == 128, 0, item_no, PrefillSm90Trace::kMaskBits, masked_tiles);
    if (n_tiles > 0) {
      mbarrier_wait(v_full + prev_stage, prev_phase);
      fence_proxy_async_smem();
      wgmma_fence();
      issue_pv(prev_stage);
      wgmma_wait<0>();
      fence_pv_operands();
      mbarrier_arrive(v_empty + prev_stage);  // V of the last tile read
    }
    ASTRAI_SM90_TRACE(tracer, 1 + c, item_no, PrefillSm90Trace::kLastPV);

    // ---- epilogue: O / l to bf16, stored from registers, 16 bytes per thread and store ---------------------
    // Shared memory stays the producer's: the next item's Q and tiles land meanwhile. A quad holds column pairs
    // 8 n + 2 q (lane q) of one row; transposed within the quad (quad_transpose4), lane q holds the 8 columns of
    // n = 4 k + q. (Stored as 4-byte pairs, the stores took ~3800 cycles per item, an H200 trace found.)
    qt = locate_q_tile<kBM, kRaggedQ>(p, unsigned(w));  // recomputed: not held across the loop
    const int q4 = lane & 3;
    bf16* out = static_cast<bf16*>(p.out_ptr) +
                (kRaggedQ ? int64_t(qt.seq_lo) * p.out_seq_stride : int64_t(qt.b) * p.out_batch_stride) + 8 * q4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;  // a row that kept no key: zeros
      const int m = my_row0 + 8 * h;
      const int i = qt.row0 + (m >> qt.hb_log2);
      const int hq = qt.qh0 + (m & ((1 << qt.hb_log2) - 1));
      bf16* const dst = out + (int64_t(i) * p.out_seq_stride + int64_t(hq) * p.out_head_stride);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t cols[4];  // column pairs 8 (4 k + e) + 2 q4 for e = 0..3; after the transpose, 8 (4 k + q4) + 2 e
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int n = 4 * k + e;
          cols[e] = pack_bf16x2_rn(acc_o[4 * n + 2 * h] * inv, acc_o[4 * n + 2 * h + 1] * inv);
        }
        quad_transpose4(cols, q4);  // every lane: the shuffles need the whole warp
        if (i < qt.q_len) *reinterpret_cast<uint4*>(dst + 32 * k) = make_uint4(cols[0], cols[1], cols[2], cols[3]);
      }
    }
    ASTRAI_SM90_TRACE(tracer, 1 + c, item_no, PrefillSm90Trace::kStored);
  }
  if (c == 0) named_barrier_sync(3, 256);  // consumer 1's last pass
#else
  (void)p;  // not an sm_90a pass: never launched (prefill_sm90_usable)
#endif
}

}  // namespace attention
}  // namespace astrai
