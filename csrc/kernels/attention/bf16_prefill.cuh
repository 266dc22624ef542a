// GQA prefill on bf16 tensor cores (mma.sync m16n8k16, fp32 online softmax), FlashAttention-2 style, templated on
// the Q schedule (dense / ragged) and the KV source (contiguous / paged).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

#include "kernels/attention/params.h"
#include "kernels/attention/prefill_schedule.h"
#include "kernels/common/ptx/async_copy.cuh"
#include "kernels/common/ptx/ldmatrix.cuh"
#include "kernels/common/ptx/math.cuh"
#include "kernels/common/ptx/mma_sm80.cuh"
#include "kernels/common/ptx/smem.cuh"
#include "kernels/common/swizzle.cuh"

namespace astrai {
namespace attention {

// Block shapes per head_dim. A block holds BM packed (row, head) pairs of one kv head: 4 warps of kMTiles m16
// tiles each; K and V stream through shared memory in tiles of BN keys, double-buffered with cp.async.
//   D = 64:  BM 128 (4 warps x 32 rows), BN 64: 16 KB Q + 2 x 16 KB K/V                 =  48.8 KB
//   D = 128: BM 128 (4 warps x 32 rows), BN 64: 32 KB Q + 2 x 32 KB K/V                 =  96.8 KB
//   D = 256: BM  64 (4 warps x 16 rows), BN 32: 32 KB Q + 2 x 32 KB K/V                 =  96.4 KB
// Every shape fits the 99 KB a block may use on sm_89 and sm_120a, so one configuration serves every image
// (sm_80 and sm_90a could take more stages; two already overlap one tile's loads with the previous tile's
// math). 32 rows per warp (two m16 tiles sharing each K/V fragment) halve the shared-memory reads per mma
// against 16 rows per warp: at 16 rows the ldmatrix traffic, not the tensor cores, would bound the loop.
// Q stays in shared memory and is re-read by ldmatrix per k-step, as in FlashAttention-2: a warp's 32 x 128 Q
// fragments would take 64 registers that the 128 fp32 accumulators of O (D = 128) and those of S leave no room
// for under the 255-register cap; the re-read costs 16 of the 80 ldmatrix per 64-key tile and warp.
// kRowPages: paged K/V copied through per-row offsets (pages smaller than a thread's row group), which takes its
// own softmax step at D = 128; contiguous K/V and paged K/V copied in page groups share theirs (and their bits).
template <int kHeadDim, bool kRowPages = false>
struct PrefillTraits {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "prefill supports head_dim 64, 128, 256");
  static constexpr int kThreads = kPrefillThreads;
  static constexpr int kWarps = kPrefillWarps;
  static constexpr int kBM = prefill_block_rows(kHeadDim);           // packed rows per block
  static constexpr int kMTiles = kBM / (16 * kWarps);                // m16 tiles per warp
  static constexpr int kWarpRows = 16 * kMTiles;                     // packed rows per warp
  static constexpr int kBN = kHeadDim == 256 ? 32 : 64;              // keys per K/V tile
  static constexpr int kStages = 2;                                  // K/V tiles in flight
  static constexpr int kChunks = kHeadDim / 8;                       // 16-byte chunks per row
  // Keys per softmax step: a 64-key tile of D = 128 is computed in two halves, so that the S accumulators take
  // 32 registers next to O's 128 (at 64 the transient peak of S, fragments and O passes 255 and ptxas spills
  // ~130 bytes; the halves cost 16 more Q ldmatrix per tile and warp instead). That is the trade-off of paged K/V
  // through per-row offsets; contiguous K/V and paged page groups are faster in whole 64-key steps in spite of the
  // spills (docs/benchmarks.md, prefill section), so at D = 128 the row-offset path's results may differ from the
  // others' in the last bits.
  static constexpr int kSubN = kHeadDim == 128 ? (kRowPages ? 32 : 64) : kBN;
  static_assert(kBN % kSubN == 0 && kSubN % 16 == 0, "softmax steps split a K/V tile into 16-key blocks");
  static constexpr int kSTiles = kSubN / 8;                          // n8 tiles of S per m16 tile
  static constexpr int kOTiles = kHeadDim / 8;                       // n8 tiles of O per m16 tile
  static constexpr int kRowsPerPass = kThreads / kChunks;            // rows one 16-byte load per thread covers
  static constexpr int kGroupRows = kBN / kRowsPerPass;              // K/V rows of a tile one thread copies
  static constexpr int kPageSlots = 3;                               // page-id rows: tiles j, j + 1, j + 2
  static constexpr int kOffBufs = 2;                                 // row-offset rows: tiles j + 1, j + 2
  static constexpr int kKkUnroll = 4;                                // k-steps of S unrolled together (of D / 16)
  static constexpr int kQChunks = kBM * kChunks;                     // sQ: (BM, D) in 16-byte chunks
  static constexpr int kTileChunks = kBN * kChunks;                  // one K or V tile: (BN, D)
  static constexpr int kSmemBytes =
      (kQChunks + kStages * 2 * kTileChunks + kOffBufs * kBN) * 16 + kPageSlots * kBN * 4;
  static_assert(kSmemBytes <= 99 * 1024, "a prefill block must fit the 99 KB of sm_89 / sm_120a");
  static_assert(kMTiles >= 1 && kBN % 16 == 0 && kBN <= kThreads, "tile shape");
  static_assert(kBN % kRowsPerPass == 0 && kBM % kRowsPerPass == 0, "loads cover whole tiles");
  static_assert(kRowsPerPass % 4 == 0, "the load swizzle offsets assume rows step by a multiple of 4");
};

__device__ __forceinline__ float prefill_neg_inf() { return __int_as_float(0xff800000u); }

// Where a block's Q tile lies: computed at the start and again for the epilogue (recomputing is cheaper than
// holding these registers across the K/V loop, where the accumulators need them).
struct QTile {
  int b;        // sequence; -1: idle block
  int row0;     // first row of the tile within the sequence
  int q_len;    // rows of the sequence
  int seq_lo;   // ragged: first row of the sequence in the packed tensor; dense: 0
  int kvh;      // kv head
  int qh0;      // first q head of the block
  int hb_log2;  // log2(HB): q heads packed per block
  int rows_log2;  // log2(BM / HB): sequence rows per tile
};

// Work item `item` of the grid's order (the block index, or a persistent block's next tile).
template <int kBM, bool kRaggedQ>
__device__ __forceinline__ QTile locate_q_tile(const PrefillParams& p, unsigned item) {
  QTile t;
  const int group = p.num_q_heads / p.num_kv_heads;
  t.hb_log2 = prefill_heads_log2(group);
  t.rows_log2 = ilog2_exact(kBM) - t.hb_log2;
  const int groups_per_kv = group >> t.hb_log2;
  const unsigned head_blocks = unsigned(p.num_kv_heads * groups_per_kv);
  const int head_block = int(item % head_blocks);
  const int tile = int(item / head_blocks);
  t.kvh = head_block / groups_per_kv;
  t.qh0 = t.kvh * group + ((head_block % groups_per_kv) << t.hb_log2);
  if constexpr (kRaggedQ) {
    t.b = p.q_tile_to_batch[tile];
    t.row0 = p.q_tile_to_index[tile];
    if (t.b < 0 || t.b >= p.batch) {
      t.b = -1;
      return t;
    }
    const RowRange rows = clamp_indptr(__ldg(p.qo_indptr_ptr + t.b), __ldg(p.qo_indptr_ptr + t.b + 1), p.q_len);
    t.q_len = rows.len;
    t.seq_lo = rows.lo;
  } else {
    // Within a sequence the last (heaviest under causal) tile runs first.
    const int tiles_per_seq = tiles_of(p.q_len, t.rows_log2);
    t.b = tile / tiles_per_seq;
    t.row0 = (tiles_per_seq - 1 - tile % tiles_per_seq) << t.rows_log2;
    t.q_len = p.q_len;
    t.seq_lo = 0;
  }
  if (t.b >= p.batch || t.row0 < 0 || t.row0 >= t.q_len) t.b = -1;
  return t;
}

// The keys a Q tile reads: key t of its sequence is row kv_key0 + t of batch kv_batch (contiguous) or sits on a
// page (paged); row i of the sequence sits at key position pos0 + (i - row0) (causal aligned to the end); keys at
// or past n_end are dropped for every row of the tile.
struct TileKeys {
  int kv_len;
  int kv_key0;
  int kv_batch;
  int pos0;
  int n_end;
};

template <bool kPaged>
__device__ __forceinline__ TileKeys tile_keys(const PrefillParams& p, const QTile& qt) {
  TileKeys k{0, 0, 0, 0, 0};
  const int b = qt.b;
  if constexpr (kPaged) {
    k.kv_len = min(max(__ldg(p.kv_lens_ptr + b), 0), p.max_kv_len);
  } else if (p.kv_indptr_ptr != nullptr) {
    const RowRange keys = clamp_indptr(__ldg(p.kv_indptr_ptr + b), __ldg(p.kv_indptr_ptr + b + 1), p.max_kv_len);
    k.kv_len = keys.len;
    k.kv_key0 = keys.lo;
  } else {
    k.kv_len = p.kv_lens_ptr != nullptr ? min(max(__ldg(p.kv_lens_ptr + b), 0), p.max_kv_len) : p.max_kv_len;
    k.kv_batch = b;
  }
  const int rows_here = min(qt.q_len - qt.row0, 1 << qt.rows_log2);
  k.pos0 = k.kv_len - qt.q_len + qt.row0;
  k.n_end = k.kv_len;
  if (p.is_causal) k.n_end = int(min(int64_t(k.n_end), max(int64_t(k.pos0) + rows_here, int64_t(0))));
  if (p.mask_ptr != nullptr) {
    k.n_end = min(k.n_end, max(p.mask_len, 0));
    if (p.mask_q_stride != 0 && qt.row0 >= p.mask_q_len) k.n_end = 0;
  }
  return k;
}

// grid: num_q_tiles x head_blocks, flattened with the head block fastest (the blocks of one Q tile, which read
// the same K/V rows, run side by side); block: kPrefillThreads; dynamic shared memory: kSmemBytes.
// Block (tile, hblk): kv head hblk / (G / HB), q heads qh0 .. qh0 + HB - 1, sequence rows row0 .. row0 + BM/HB - 1
// of sequence b. Packed row m (0 .. BM - 1) is sequence row row0 + (m >> hb_log2), q head qh0 + (m & (HB - 1)).
// Paged K/V is copied one of two ways. kPageGroups (page_size >= Tr::kGroupRows): thread tid copies its chunk of
// kGroupRows consecutive key rows of a tile, which lie on one page, so it reads one page id per tile (a register,
// one tile ahead) and steps a row pointer, as for contiguous K/V. Otherwise (pages of 1..4 keys) it copies every
// kRowsPerPass-th row, each on its own page, through per-row offsets in shared memory: the 64-bit K and V offsets
// of a tile's key rows are computed once per row (by thread `row`, two iterations ahead), and the 16 threads
// loading a row's chunks read them with one broadcast 16-byte load, rather than each resolving the page of every
// row it loads (a page-id load, a range check and four 64-bit products per row and thread, which was slower:
// docs/benchmarks.md, prefill section).
template <int kHeadDim, bool kRaggedQ, bool kPaged, bool kPageGroups = false>
// 2 blocks per SM: 4 warps at up to 255 registers each use the whole register file of an SM at 2 x 128 threads.
__global__ void __launch_bounds__(kPrefillThreads, 2) prefill_bf16_kernel(const __grid_constant__ PrefillParams p) {
  static_assert(kPaged || !kPageGroups, "page groups are a paged copy scheme");
  using Tr = PrefillTraits<kHeadDim, kPaged && !kPageGroups>;
  using bf16 = __nv_bfloat16;
  constexpr int kBM = Tr::kBM, kBN = Tr::kBN, kChunks = Tr::kChunks, kMTiles = Tr::kMTiles;
  constexpr int kSubN = Tr::kSubN, kSTiles = Tr::kSTiles, kOTiles = Tr::kOTiles, kRowsPerPass = Tr::kRowsPerPass;

  extern __shared__ __align__(128) uint4 smem[];
  uint4* const sQ = smem;                                            // (BM, D), swizzled; O in the epilogue
  uint4* const sKV = smem + Tr::kQChunks;                            // (stages, K|V, BN, D), swizzled
  // (2, BN) {K, V} element offsets of each key row (paged, row offsets); then (kPageSlots, BN) page ids
  longlong2* const sRowOff = reinterpret_cast<longlong2*>(sKV + Tr::kStages * 2 * Tr::kTileChunks);
  int32_t* const sPage = reinterpret_cast<int32_t*>(sRowOff + Tr::kOffBufs * kBN);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // ---- which rows, heads and keys ------------------------------------------------------------------
  const QTile qt = locate_q_tile<kBM, kRaggedQ>(p, blockIdx.x);
  if (qt.b < 0) return;  // idle tile (block-uniform: before any barrier)
  const int b = qt.b, row0 = qt.row0, q_len_b = qt.q_len, hb_log2 = qt.hb_log2;
  const int kvh = qt.kvh, qh0 = qt.qh0;
  const int64_t q_off = kRaggedQ ? int64_t(qt.seq_lo) * p.q_seq_stride : int64_t(b) * p.q_batch_stride;

  // K/V rows of this block as small integers: issue_kv forms the 64-bit addresses per tile (two live 64-bit base
  // pointers would cost the loop 4 registers it does not have).
  const TileKeys keys = tile_keys<kPaged>(p, qt);
  const int kv_len = keys.kv_len, kv_key0 = keys.kv_key0, kv_batch = keys.kv_batch, pos0 = keys.pos0;
  const bool has_mask = p.mask_ptr != nullptr;
  const int n_tiles = (keys.n_end + kBN - 1) / kBN;  // block-uniform trip count

  // ---- loads ---------------------------------------------------------------------------------------
  const int ld_chunk = tid % kChunks;  // this thread's 16-byte chunk of every row it loads
  const int ld_row = tid / kChunks;    // first row it loads; then every kRowsPerPass-th
  const uint4 zero16 = make_uint4(0, 0, 0, 0);

  auto issue_q = [&]() {
    const bf16* q = static_cast<const bf16*>(p.q_ptr) + q_off + ld_chunk * 8;
#pragma unroll
    for (int r = ld_row; r < kBM; r += kRowsPerPass) {
      const int i = row0 + (r >> hb_log2);
      const int h = qh0 + (r & ((1 << hb_log2) - 1));
      uint4* dst = sQ + swizzle<kChunks>(r, ld_chunk);
      if (i < q_len_b) {
        cp_async16(dst, q + (int64_t(i) * p.q_seq_stride + int64_t(h) * p.q_head_stride));
      } else {
        *dst = zero16;  // rows past the sequence: zeros, never stored
      }
    }
  };

  auto page_ok = [&](int32_t id) { return id >= 0 && id < p.num_pages; };

  // Row offsets: the table entry of key j * BN + tid (tid < BN), read into a register one iteration early
  // (the barrier wait covers its latency); -1 past kv_len.
  auto load_page_id = [&](int j) -> int32_t {
    const int t = j * kBN + tid;
    return tid < kBN && t < kv_len
               ? __ldg(p.page_table_ptr + (int64_t(b) * p.page_table_batch_stride + (t >> p.page_size_log2)))
               : -1;
  };
  // Thread tid < BN stores that id (for the element mask) and its row's K and V element offsets from the page-0
  // base: kRowDropped past kv_len, kRowBadPage on an invalid page (its keys are dropped too, and the tile then
  // needs the element mask).
  constexpr long long kRowDropped = -1, kRowBadPage = -2;
  auto resolve_row = [&](int j, int32_t id, int32_t* ids, longlong2* off) {
    const int t = j * kBN + tid;
    if (tid < kBN) {
      const int slot = t & ((1 << p.page_size_log2) - 1);
      longlong2 o;
      if (t >= kv_len) {
        o.x = o.y = kRowDropped;
      } else if (!page_ok(id)) {
        o.x = o.y = kRowBadPage;
      } else {
        o.x = int64_t(id) * p.k_batch_stride + int64_t(slot) * p.k_seq_stride;
        o.y = int64_t(id) * p.v_batch_stride + int64_t(slot) * p.v_seq_stride;
      }
      ids[tid] = id;
      off[tid] = o;
    }
  };

  // Paged: `off` holds the tile's row offsets.
  auto issue_kv = [&](int j, int stage, const longlong2* off) -> bool {
    uint4* sK = sKV + stage * (2 * Tr::kTileChunks) + swizzle<kChunks>(ld_row, ld_chunk);
    uint4* sV = sK + Tr::kTileChunks;
    const int t0 = j * kBN + ld_row;  // this thread's first key of the tile
    const int c0 = ld_chunk ^ (ld_row & 7);
    const int flip4 = (c0 ^ 4) - c0;  // chunk shift of a row 4 further down (D = 256 only)
    bool bad = false;
    // Contiguous: one 64-bit product per tile, then a pointer that steps kRowsPerPass keys (per-row products
    // would be hoisted out of the loop as 8 live 64-bit induction variables per tensor).
    const int key = kPaged ? 0 : kv_key0 + t0;  // contiguous: this thread's first key row of the tile
    const bf16* kp = static_cast<const bf16*>(p.k_ptr) +
                     (int64_t(key) * p.k_seq_stride + int64_t(kvh) * p.k_head_stride +
                      int64_t(kv_batch) * p.k_batch_stride + ld_chunk * 8);
    const bf16* vp = static_cast<const bf16*>(p.v_ptr) +
                     (int64_t(key) * p.v_seq_stride + int64_t(kvh) * p.v_head_stride +
                      int64_t(kv_batch) * p.v_batch_stride + ld_chunk * 8);
    // Fully unrolled: a partial unroll spills more (ptxas).
    constexpr int kIssueUnroll = kBN / kRowsPerPass;
#pragma unroll kIssueUnroll
    for (int r = 0; r < kBN; r += kRowsPerPass) {
      const int t = t0 + r;
      // Row ld_row + r: the swizzle depends on the row mod 8 only, and (ld_row + r) mod 8 = (ld_row mod 8) ^ (r & 4)
      // (r is a multiple of kRowsPerPass: of 8, or of 4 for D = 256), so the offset from row ld_row's chunk is
      // a compile-time constant (plus one precomputed correction when r & 4).
      const int at = r * kChunks + ((r & 4) ? flip4 : 0);
      bool ok;
      const bf16* ksrc;
      const bf16* vsrc;
      if constexpr (kPaged) {
        const longlong2 o = off[ld_row + r];  // same address for the row's 16 threads: a broadcast
        ok = o.x >= 0;
        bad |= o.x == kRowBadPage;
        ksrc = kp + o.x;
        vsrc = vp + o.y;
      } else {
        ok = t < kv_len;
        ksrc = kp;
        vsrc = vp;
        kp += kRowsPerPass * p.k_seq_stride;
        vp += kRowsPerPass * p.v_seq_stride;
      }
      if (ok) {
        cp_async16(sK + at, ksrc);
        cp_async16(sV + at, vsrc);
      } else {
        sK[at] = zero16;
        sV[at] = zero16;
      }
    }
    return bad;
  };

  // Page groups: the page id of this thread's rows of tile j (-1 past kv_len).
  constexpr int kGroupRows = Tr::kGroupRows;
  auto group_page_id = [&](int j) -> int32_t {
    const int t = j * kBN + ld_row * kGroupRows;
    return t < kv_len
               ? __ldg(p.page_table_ptr + (int64_t(b) * p.page_table_batch_stride + (t >> p.page_size_log2)))
               : -1;
  };
  // Page groups: bit g of sBadBits[j % 3] marks row group g of tile j on an invalid page (its keys are dropped:
  // the tile then needs the element mask). Set by the copying threads after the barrier that opens iteration
  // j - 1, read after the one that opens iteration j, cleared by thread 0 in iteration j + 2 (see the loop).
  uint32_t* const sBadBits = reinterpret_cast<uint32_t*>(sPage);
  auto issue_kv_groups = [&](int j, int stage, int slot, int32_t id) {
    uint4* sK = sKV + stage * (2 * Tr::kTileChunks);
    uint4* sV = sK + Tr::kTileChunks;
    const int row0g = ld_row * kGroupRows;
    const int t0 = j * kBN + row0g;
    if (page_ok(id)) {
      const int64_t in_page = t0 & ((1 << p.page_size_log2) - 1);
      const bf16* kp = static_cast<const bf16*>(p.k_ptr) + (int64_t(id) * p.k_batch_stride + in_page * p.k_seq_stride +
                                                            int64_t(kvh) * p.k_head_stride + ld_chunk * 8);
      const bf16* vp = static_cast<const bf16*>(p.v_ptr) + (int64_t(id) * p.v_batch_stride + in_page * p.v_seq_stride +
                                                            int64_t(kvh) * p.v_head_stride + ld_chunk * 8);
#pragma unroll
      for (int r = 0; r < kGroupRows; ++r) {
        const int at = swizzle<kChunks>(row0g + r, ld_chunk);
        if (t0 + r < kv_len) {
          cp_async16(sK + at, kp);
          cp_async16(sV + at, vp);
        } else {
          sK[at] = zero16;
          sV[at] = zero16;
        }
        kp += p.k_seq_stride;
        vp += p.v_seq_stride;
      }
    } else {
#pragma unroll
      for (int r = 0; r < kGroupRows; ++r) {
        const int at = swizzle<kChunks>(row0g + r, ld_chunk);
        sK[at] = zero16;
        sV[at] = zero16;
      }
      if (t0 < kv_len && ld_chunk == 0) atomicOr(sBadBits + slot, 1u << ld_row);
    }
  };

  // ---- per-thread state ------------------------------------------------------------------------------
  float acc_o[kMTiles][kOTiles][4];  // O, unnormalized: rows (lane/4, +8) of each m16 tile, fp32
  float row_max[kMTiles][2];         // running max of the scaled scores (exp2 domain) per row
  float row_sum[kMTiles][2];         // this thread's part of the running sum of exp2 (quad-reduced at the end)
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][nt][e] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[mt][h] = prefill_neg_inf();
      row_sum[mt][h] = 0.f;
    }
  }

  const int warp_row0 = warp * Tr::kWarpRows;  // this warp's first packed row
  // ldmatrix addresses (see ldsm_step): one lane offset per operand.
  const uint32_t smem_base = smem_addr(smem);
  const uint32_t q_lane = ldsm_a_offset<kChunks>(lane, warp_row0);              // Q: A fragments
  const uint32_t k_lane = ldsm_b_offset<kChunks>(lane);                          // K: B fragments, 2 n-tiles
  const uint32_t v_lane = ldsm_bt_offset<kChunks>(lane);                         // V: B fragments (transposed)

  // One K/V tile, in sub-tiles of kSubN keys: S = Q K^T, mask (kMask), online softmax, O += P V.
  // Paged: `ids` points to the tile's page ids (row offsets) or to its sBadBits word (page groups).
  auto tile_step = [&](auto mask_tag, int j, int stage, const int32_t* ids) {
    constexpr bool kMask = decltype(mask_tag)::value;
    const uint32_t sK_addr = smem_base + (Tr::kQChunks + stage * 2 * Tr::kTileChunks) * 16;  // K tile of `stage`
    const uint32_t sV_addr = sK_addr + Tr::kTileChunks * 16;
    constexpr int kSubBlocks = kSubN / 16;  // 16-key blocks per sub-tile
#pragma unroll
    for (int sub = 0; sub < kBN / kSubN; ++sub) {
      float s[kMTiles][kSTiles][4];  // (warp rows, kSubN) scores
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
      // Unrolled by 4, not fully: a full unroll lets the scheduler hoist every fragment load of the tile past
      // the register budget.
#pragma unroll Tr::kKkUnroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) ldmatrix_x4(a[mt], smem_base + ldsm_step<kChunks>(q_lane, kk, mt));
#pragma unroll
        for (int np = 0; np < kSubBlocks; ++np) {
          uint32_t bk[4];
          ldmatrix_x4(bk, sK_addr + ldsm_step<kChunks>(k_lane, kk, sub * kSubBlocks + np));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_bf16_16816(s[mt][2 * np], a[mt], bk[0], bk[1]);
            mma_bf16_16816(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
          }
        }
      }

      // Scale into the exp2 domain (any sign of the scale), then drop keys.
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] *= p.scale_log2;
      if constexpr (kMask) {
        // Limits relative to the sub-tile's first key n0 (they change with j, so the compiler keeps them out of
        // the registers that live across the loop): column col is kept iff col < lim and its mask byte / page
        // allow it.
        const int n0 = j * kBN + sub * kSubN;
        const int di0 = (warp_row0 + (lane >> 2)) >> hb_log2;  // rows of this thread: di0 + ((8 h + 16 mt) >> hb)
        int key_lim = kv_len - n0;
        if (has_mask) key_lim = min(key_lim, p.mask_len - n0);
        uint32_t page_bits = 0;  // bit 2 nt + e: column nt * 8 + 2 (lane % 4) + e is on a valid page
        if constexpr (kPageGroups) {
          const uint32_t bad_groups = uint32_t(*ids);  // re-read here: no register held across the tile
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int kc = sub * kSubN + nt * 8 + 2 * (lane & 3) + e;  // key within the tile
              page_bits |= (~bad_groups >> (kc / kGroupRows) & 1u) << (2 * nt + e);
            }
        } else if constexpr (kPaged) {
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              page_bits |= uint32_t(page_ok(ids[sub * kSubN + nt * 8 + 2 * (lane & 3) + e])) << (2 * nt + e);
        }
        (void)page_bits;
        (void)ids;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int di = di0 + ((8 * h + 16 * mt) >> hb_log2);
            const int i = row0 + di;  // row within the sequence
            int lim = key_lim;
            if (p.is_causal) lim = min(lim, pos0 + di - n0 + 1);
            if (i >= q_len_b || (has_mask && p.mask_q_stride != 0 && i >= p.mask_q_len)) lim = 0;
            const uint8_t* mrow = has_mask ? p.mask_ptr + (int64_t(b) * p.mask_batch_stride +
                                                           int64_t(i) * p.mask_q_stride + n0) : nullptr;
#pragma unroll
            for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int col = nt * 8 + 2 * (lane & 3) + e;
                bool keep = col < lim;
                if (has_mask) keep = keep && mrow[col] != 0;
                if constexpr (kPaged) keep = keep && ((page_bits >> (2 * nt + e)) & 1u);
                if (!keep) s[mt][nt][2 * h + e] = prefill_neg_inf();
              }
          }
      }

      // Online softmax per row (the 4 lanes of a quad hold a row's kSubN scores). The weights go to bf16 as soon
      // as they exist: the S accumulators of n-tiles 2 ks and 2 ks + 1, packed, are the A fragment of k-step ks
      // of P V (no shared-memory round trip), and the fp32 scores die early.
      uint32_t pa[kMTiles][kSubBlocks][4];  // [mt][ks] = {row g: k lo, g + 8: k lo, g: k hi, g + 8: k hi}
      float alpha[kMTiles][2];
      bool moved = false;  // some row max of this thread grew: O needs rescaling
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = row_max[mt][h];
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // Nothing kept yet: subtract 0 so that exp2(-inf - m) stays 0 instead of NaN.
          const float m_use = mx == prefill_neg_inf() ? 0.f : mx;
          const bool grew = mx != row_max[mt][h];
          alpha[mt][h] = grew ? fast_exp2(row_max[mt][h] - m_use) : 1.f;  // 0 when the row was empty
          moved |= grew;
          row_max[mt][h] = mx;
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt) {
            const float p0 = fast_exp2(s[mt][nt][2 * h] - m_use);  // 0 for dropped keys
            const float p1 = fast_exp2(s[mt][nt][2 * h + 1] - m_use);
            sum += p0 + p1;
            pa[mt][nt / 2][(nt % 2) * 2 + h] = pack_bf16x2_rn(p0, p1);
          }
          row_sum[mt][h] = row_sum[mt][h] * alpha[mt][h] + sum;
        }
      // Past the first tiles a row max rarely grows: skip the 4 x D/2 multiplies when no row of the warp moved
      // (warp-uniform branch).
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][nt][e] *= alpha[mt][e / 2];
      }

      // O += P V, V fragments by ldmatrix.trans from the [key][dim] tile.
#pragma unroll
      for (int ks = 0; ks < kSubBlocks; ++ks) {
#pragma unroll
        for (int np = 0; np < kHeadDim / 16; ++np) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, sV_addr + ldsm_step<kChunks>(v_lane, np, sub * kSubBlocks + ks));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_bf16_16816(acc_o[mt][2 * np], pa[mt][ks], bv[0], bv[1]);
            mma_bf16_16816(acc_o[mt][2 * np + 1], pa[mt][ks], bv[2], bv[3]);
          }
        }
      }
    }
  };

  // ---- main loop: tile j computes while tile j + 1 lands ---------------------------------------------
  // Paged: the page ids of tile j sit in sPage row j % 3.
  // Row offsets: row offsets of tile j in sRowOff row j % 2. Iteration j resolves tile j + 2 (its ids loaded
  // into a register at the end of iteration j - 1) into id row (j + 2) % 3 and offset row j % 2, whose readers
  // (tile j - 1's mask, issue_kv(j)) ran before this barrier; the barrier of iteration j + 1 publishes them to
  // issue_kv(j + 2). Then, after the tile's math, it loads the ids of tile j + 3.
  auto off_row = [&](int j) { return sRowOff + (j & 1) * kBN; };
  bool bad = false;        // this thread's last issued tile had an invalid page (needs the element mask)
  int32_t next_id = -1;    // row offsets: the page id of key (j + 2) * BN + tid; page groups: this thread's of tile j + 1
  if (n_tiles > 0) {
    int32_t first_id = -1;  // page groups: this thread's page of tile 0
    if constexpr (kPageGroups) {
      if (tid < 3) sBadBits[tid] = 0u;
      first_id = group_page_id(0);
      next_id = n_tiles > 1 ? group_page_id(1) : -1;
      __syncthreads();  // the bits are zero before any copy marks them
    } else if constexpr (kPaged) {
      const int32_t id0 = load_page_id(0), id1 = n_tiles > 1 ? load_page_id(1) : -1;
      resolve_row(0, id0, sPage, off_row(0));
      if (n_tiles > 1) resolve_row(1, id1, sPage + kBN, off_row(1));
      if (n_tiles > 2) next_id = load_page_id(2);
      __syncthreads();
    }
    issue_q();
    if constexpr (kPageGroups) {
      issue_kv_groups(0, 0, 0, first_id);
    } else {
      bad = issue_kv(0, 0, off_row(0));
    }
    cp_async_commit();
    (void)first_id;
  }
  int slot = 0;  // j % 3
  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j & 1;
    const int slot1 = slot == 2 ? 0 : slot + 1, slot2 = slot1 == 2 ? 0 : slot1 + 1;
    cp_async_wait<0>();  // tile j (and Q, page ids of j + 1) landed for this thread's copies
    // After the barrier: every thread's copies of tile j are visible, and every warp is done with tile j - 1,
    // whose stage tile j + 1 now overwrites.
    bool any_bad = false;
    if constexpr (kPageGroups) {
      __syncthreads();
      any_bad = sBadBits[slot] != 0u;
      // Tile j - 1's bits: read before this barrier; tile j + 2 marks them after the next one.
      if (tid == 0) sBadBits[slot2] = 0u;
      if (j + 1 < n_tiles) {
        issue_kv_groups(j + 1, stage ^ 1, slot1, next_id);
        next_id = j + 2 < n_tiles ? group_page_id(j + 2) : -1;  // lands while tile j computes
      }
    } else {
      if constexpr (kPaged) {
        any_bad = __syncthreads_or(bad) != 0;
      } else {
        __syncthreads();
      }
      if (j + 1 < n_tiles) bad = issue_kv(j + 1, stage ^ 1, off_row(j + 1));
      if constexpr (kPaged) {
        if (j + 2 < n_tiles) resolve_row(j + 2, next_id, sPage + slot2 * kBN, off_row(j));
      }
    }
    cp_async_commit();

    const int n0 = j * kBN;
    const bool need_mask = has_mask || any_bad || n0 + kBN > kv_len || (p.is_causal && n0 + kBN - 1 > pos0);
    const int32_t* tile_pages = kPageGroups ? reinterpret_cast<const int32_t*>(sBadBits + slot) : sPage + slot * kBN;
    if (need_mask) {
      tile_step(std::true_type{}, j, stage, tile_pages);
    } else {
      tile_step(std::false_type{}, j, stage, tile_pages);
    }
    if constexpr (kPaged && !kPageGroups) {
      if (j + 3 < n_tiles) next_id = load_page_id(j + 3);
    }
    slot = slot1;
  }
  (void)next_id;

  // ---- epilogue: O / l to bf16, staged through this warp's own rows of sQ for 16-byte stores ------------
  // Only this warp ever read those rows (its A fragments), and no copy is in flight: a warp barrier suffices.
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;  // a row that kept no key: zeros
      const int r = warp_row0 + mt * 16 + (lane >> 2) + 8 * h;
#pragma unroll
      for (int nt = 0; nt < kOTiles; ++nt) {
        uint32_t* dst = reinterpret_cast<uint32_t*>(sQ + swizzle<kChunks>(r, nt)) + (lane & 3);
        *dst = pack_bf16x2_rn(acc_o[mt][nt][2 * h] * inv, acc_o[mt][nt][2 * h + 1] * inv);
      }
    }
  __syncwarp();
  const QTile ot = locate_q_tile<kBM, kRaggedQ>(p, blockIdx.x);  // as qt, recomputed
  bf16* out = static_cast<bf16*>(p.out_ptr) +
              (kRaggedQ ? int64_t(ot.seq_lo) * p.out_seq_stride : int64_t(ot.b) * p.out_batch_stride);
#pragma unroll
  for (int idx = lane; idx < Tr::kWarpRows * kChunks; idx += 32) {
    const int m = warp * Tr::kWarpRows + idx / kChunks;
    const int c = idx % kChunks;
    const int i = ot.row0 + (m >> ot.hb_log2);
    const int h = ot.qh0 + (m & ((1 << ot.hb_log2) - 1));
    if (i < ot.q_len) {
      *reinterpret_cast<uint4*>(out + (int64_t(i) * p.out_seq_stride + int64_t(h) * p.out_head_stride + c * 8)) =
          sQ[swizzle<kChunks>(m, c)];
    }
  }
}

}  // namespace attention
}  // namespace astrai
