// Split-KV GQA decode on bf16 tensor cores (mma.sync m16n8k16, fp32 online softmax), templated on the KV
// source and the tile configuration.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/attention/params.h"
#include "kernels/common/ptx/async_copy.cuh"
#include "kernels/common/ptx/griddep.cuh"
#include "kernels/common/ptx/ldmatrix.cuh"
#include "kernels/common/ptx/math.cuh"
#include "kernels/common/ptx/mma_sm80.cuh"
#include "kernels/common/ptx/smem.cuh"
#include "kernels/common/vec_types.cuh"

namespace astrai {
namespace attention {

// Most q heads of one kv head a block holds: the N = 8 columns of the P V mma. A larger GQA group (MQA with
// many q heads) runs ceil(group / kMaxGroup) blocks per kv head, which share K/V through L2.
constexpr int kMaxGroup = 8;
// A block is kWarps independent warps over one (sequence, kv head, head group, split). Each warp takes every
// kWarps-th tile of kTileKeys keys of the split and streams it through its own cp.async ring of kStages
// tiles (no block barrier in the loop): kStages - 1 tiles are in flight while one is computed.
template <int kWarps_, int kTileKeys_, int kStages_, bool kSplitP_ = true>
struct DecodeTile {
  static constexpr int kWarps = kWarps_;
  static constexpr int kTileKeys = kTileKeys_;
  static constexpr int kStages = kStages_;
  // P enters the P V mma as bf16. kSplitP: as hi + lo (two mmas), so P keeps ~16 bits and the output is as
  // accurate as an fp32 P V (a single bf16 P is off by up to 2^-9 relative per weight: ~1e-2 at |V| = 4).
  static constexpr bool kSplitP = kSplitP_;
  static_assert(kWarps >= 1 && kWarps <= 8, "1..8 warps per block");
  static_assert(kTileKeys == 16 || kTileKeys == 32, "a tile is one or two k = 16 steps of the P V mma, at most a warp of keys");
  static_assert(kStages >= 2 && kStages <= 8, "the ring needs two stages");
};

// Production tiles, and the blocks per SM of the one wave the split planner fills with them (attn_decode_plan).
// D = 128: 8 warps, 2 stages (128 KB of ring, one block per SM): against the earlier 2 warps x 3 stages (48 KB)
// at 2 blocks per SM it wins for paged K/V and for contiguous one-split plans and loses a little where one wave
// of 2 blocks per SM beats two of 1 (csrc/tools/decode_merge_sweep.cu; docs/benchmarks.md, decode section).
// 4 warps x 3 stages gains for contiguous K/V at small batches but loses more for paged K/V; one tile serves
// both so that a fixed split gives them equal bits.
// D = 64 and 256: 48 KB blocks (not re-swept); paged targets 4 per SM, contiguous D = 64 2 (see the planner).
template <int kHeadDim>
struct DecodeDefaultTile;
template <>
struct DecodeDefaultTile<64> {
  using type = DecodeTile<2, 32, 3>;
  static constexpr int kWaveBlocksPerSm = 2;       // contiguous K/V
  static constexpr int kPagedWaveBlocksPerSm = 4;  // paged K/V (with at least 128-key splits, see the planner)
};
template <>
struct DecodeDefaultTile<128> {
  using type = DecodeTile<8, 16, 2>;
  static constexpr int kWaveBlocksPerSm = 1;
  static constexpr int kPagedWaveBlocksPerSm = 1;
};
template <>
struct DecodeDefaultTile<256> {
  using type = DecodeTile<1, 16, 3>;
  static constexpr int kWaveBlocksPerSm = 4;
  static constexpr int kPagedWaveBlocksPerSm = 4;
};

// The tile where a block may not take the default tile's shared memory (sm_89 and sm_120 allow 99 KB per block
// against the 8-warp D = 128 tile's 128 KB), and for splits shorter than one 16-key tile per warp of the default
// (launch_decode_split_kv): 4 warps x 3 stages (96 KB), also one block per SM, so the plan is the same (its speed
// against the default on sm_90: docs/benchmarks.md, decode section).
template <int kHeadDim>
struct DecodeSmallSmemTile {
  using type = typename DecodeDefaultTile<kHeadDim>::type;
};
template <>
struct DecodeSmallSmemTile<128> {
  using type = DecodeTile<4, 16, 3>;
};

template <int kHeadDim, class Tile>
struct DecodeTraits {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "decode supports head_dim 64, 128, 256");
  static constexpr int kThreads = Tile::kWarps * 32;
  static constexpr int kChunks = kHeadDim / 8;                         // 16-byte chunks per key row
  static constexpr int kTileBytes = Tile::kTileKeys * kHeadDim * 2;    // K (or V) of one tile
  static constexpr int kStageBytes = 2 * kTileBytes;                   // K then V
  static constexpr int kSmemBytes = Tile::kWarps * Tile::kStages * kStageBytes;
  // Lane l copies chunk l % kChunks of tile rows l / kChunks + i * kRowStep, i < kCopies (K and V each).
  static constexpr int kRowStep = 32 / kChunks;
  static constexpr int kCopies = Tile::kTileKeys / kRowStep;
  // Epilogue: per warp and head, unnormalized o, running max (log2) and sum, over the ring.
  static constexpr int kEpilogueBytes = Tile::kWarps * kMaxGroup * (kHeadDim + 2) * 4;
  static_assert(kEpilogueBytes <= kSmemBytes, "the epilogue fits the ring");
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// grid: (Hkv * head_groups, B, num_splits); block: Tile::kWarps * 32; dynamic shared memory:
// DecodeTraits::kSmemBytes.
// Split s covers keys [s * split_len, min((s + 1) * split_len, kv_len)). Keys past kv_len, masked, past
// mask_len or on an invalid page are dropped. A query with no kept key gets 0 (lse -inf).
// num_splits > 1: every block writes its normalized partial and lse; the combine kernel merges them.
//
// Per warp and tile of T keys (g = lane / 4, c = 2 (lane % 4)):
//   S = Q K^T      mma M = q heads (rows 0..7, the rest zero), N = 8 keys, K = 16 dims; Q stays in registers as
//                  the A fragment, K^T comes from ldmatrix of the K rows. Lane holds S[head g][keys c, c+1].
//   softmax        per head over the 4 lanes of a quad (2 shuffles); P = exp2(S - m) is already the B fragment
//                  (keys c..c+1, c+8..c+9 of head g) of
//   O^T += V^T P^T mma M = 16 dims, N = 8 q heads, K = 16 keys; V^T comes from ldmatrix.trans of the V rows.
//                  Lane holds O^T[dims g, g+8][heads c, c+1].
// K/V tiles are stored row-major with the 16-byte chunk index XORed by (row % 8): ldmatrix's 8 rows of a
// matrix then hit 8 different bank groups.
template <int kHeadDim, bool kPaged, class Tile>
__global__ void __launch_bounds__(Tile::kWarps * 32) decode_split_kv_kernel(const __grid_constant__ DecodeParams p) {
  using Traits = DecodeTraits<kHeadDim, Tile>;
  using bf16 = __nv_bfloat16;
  constexpr int kWarps = Tile::kWarps;
  constexpr int kT = Tile::kTileKeys;
  constexpr int kStages = Tile::kStages;
  constexpr int kChunks = Traits::kChunks;
  constexpr int kNT = kT / 8;          // n-tiles of S per tile
  constexpr int kKK = kT / 16;         // k-steps of P V per tile
  constexpr int kMT = kHeadDim / 16;   // m-tiles of O^T
  constexpr int kKS = kHeadDim / 16;   // k-steps of Q K^T

  extern __shared__ __align__(128) unsigned char sm_ring[];  // [kWarps][kStages][K, V][kT][kHeadDim] bf16, swizzled

  // The next kernel of the stream (the combine, or the next call's decode), when launched as a programmatic
  // dependent, may take free SM slots now: it waits for this grid's completion before touching global memory,
  // and all of this grid's blocks are resident by the time it starts.
  launch_dependents();
  // Launched as a programmatic dependent itself (the launcher's choice), this block may be resident while the
  // stream's previous kernel still runs: nothing global is read or written before that grid has completed and
  // its writes are visible. Otherwise (and below sm_90) a no-op.
  wait_prerequisites();
  // Inputs are read with plain loads, never __ldg: ptxas treats a non-coherent (.nc) load as reading memory
  // that does not change while the kernel runs and hoisted one above griddepcontrol.wait (seen in the SASS),
  // where the previous kernel may still be writing it (q, lengths, the page table). Not __ldcg (L2 only) either:
  // slower at B = 1 (docs/benchmarks.md, decode section), presumably the 16 blocks of a kv head each reading its
  // q from L2.

  const int group_size = p.num_q_heads / p.num_kv_heads;
  const int head_groups = (group_size + kMaxGroup - 1) / kMaxGroup;
  const int kvh = int(blockIdx.x) / head_groups;
  const int g0 = (int(blockIdx.x) % head_groups) * kMaxGroup;  // first head of this block within the group
  const int heads = min(kMaxGroup, group_size - g0);          // q heads this block serves
  const int b = blockIdx.y;
  const int split = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int gq = lane / 4;        // mma group: row of A / C, column of B
  const int cq = 2 * (lane % 4);  // mma column pair

  int kv_len = p.max_kv_len;
  if (p.kv_lens_ptr != nullptr) kv_len = min(max(p.kv_lens_ptr[b], 0), p.max_kv_len);
  const int64_t start64 = int64_t(split) * p.split_len;
  const int start = int(min(start64, int64_t(kv_len)));
  const int end = int(min(start64 + p.split_len, int64_t(kv_len)));

  // Q as the A fragment of S = Q K^T: {Q[g][16 ks + c..c+1], Q[g][16 ks + 8 + c..c+9]} (rows 8..15 are zero).
  uint32_t qa[kKS][2];  // (kKS, 2) bf16x2
  if (gq < heads) {
    const int qh = kvh * group_size + g0 + gq;
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(static_cast<const bf16*>(p.q_ptr) +
                                                             (int64_t(b) * p.q_batch_stride + int64_t(qh) * p.q_head_stride));
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) {
      qa[ks][0] = qrow[8 * ks + cq / 2];
      qa[ks][1] = qrow[8 * ks + 4 + cq / 2];
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) qa[ks][0] = qa[ks][1] = 0u;
  }

  // Online softmax state of head g (quad-uniform m, per-lane partial l) and O^T[dims][heads c, c+1].
  float m_run = neg_inf(), l_run = 0.f;
  float o[kMT][4];  // (kMT, 4): O^T[16 mt + g][c], [16 mt + g][c + 1], [16 mt + g + 8][c], [16 mt + g + 8][c + 1]
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;

  const int tiles = end > start ? (end - start + kT - 1) / kT : 0;
  const int my_tiles = tiles > warp ? (tiles - warp + kWarps - 1) / kWarps : 0;

  const int chunk = lane % kChunks;
  const int row0 = lane / kChunks;
  const bf16* k_head = static_cast<const bf16*>(p.k_ptr) + (int64_t(kvh) * p.k_head_stride + chunk * 8);
  const bf16* v_head = static_cast<const bf16*>(p.v_ptr) + (int64_t(kvh) * p.v_head_stride + chunk * 8);
  const uint8_t* mask_row = p.mask_ptr == nullptr ? nullptr : p.mask_ptr + int64_t(b) * p.mask_batch_stride;
  unsigned char* warp_ring = sm_ring + warp * (kStages * Traits::kStageBytes);

  // Paged: lane r's page id of the warp's next local tile, read one issue ahead (a register per lane), so a
  // tile's copies never wait on a page-table read.
  const int32_t* table_row = kPaged ? p.page_table_ptr + int64_t(b) * p.page_table_batch_stride : nullptr;
  auto read_page = [&](int i) -> int {
    const int t = start + (warp + i * kWarps) * kT + lane;
    return lane < kT && t < end ? table_row[t >> p.page_size_log2] : -1;
  };
  int page_ahead = kPaged ? read_page(0) : 0;

  // Starts the copies of this warp's local tile `i` into ring slot `slot` and returns its keep bits (bit r:
  // key r of the tile). Lane r < kT decides key r (mask byte, page id); the copying lanes read the page ids
  // with shuffles, so the table is read once per key. Dropped keys get zeros (no copy), so no stale or
  // uninitialized bytes ever reach the mma. Always commits one group.
  auto issue = [&](int i, int slot) -> uint32_t {
    const int tb = start + (warp + i * kWarps) * kT;  // first key of the tile
    const int t = tb + lane;
    bool keep = lane < kT && t < end;
    if (keep && mask_row != nullptr) keep = t < p.mask_len && mask_row[t] != 0;
    int page = 0;
    if constexpr (kPaged) {
      page = page_ahead;
      page_ahead = read_page(i + 1);
      keep = keep && page >= 0 && page < p.num_pages;
    }
    const uint32_t bits = __ballot_sync(0xffffffffu, keep);
    unsigned char* dst_k = warp_ring + slot * Traits::kStageBytes;
    unsigned char* dst_v = dst_k + Traits::kTileBytes;
    // Contiguous: rows advance by a fixed stride; paged: each row's page id comes from lane r.
    const bf16* k_src = k_head;
    const bf16* v_src = v_head;
    if constexpr (!kPaged) {
      k_src += int64_t(b) * p.k_batch_stride + int64_t(tb + row0) * p.k_seq_stride;
      v_src += int64_t(b) * p.v_batch_stride + int64_t(tb + row0) * p.v_seq_stride;
    }
#pragma unroll
    for (int j = 0; j < Traits::kCopies; ++j) {
      const int r = row0 + j * Traits::kRowStep;
      const bf16* k_at = k_src;
      const bf16* v_at = v_src;
      if constexpr (kPaged) {
        const int pg = __shfl_sync(0xffffffffu, page, r);
        const int in_page = (tb + r) & ((1 << p.page_size_log2) - 1);
        k_at += int64_t(pg) * p.k_batch_stride + int64_t(in_page) * p.k_seq_stride;
        v_at += int64_t(pg) * p.v_batch_stride + int64_t(in_page) * p.v_seq_stride;
      } else {
        k_src += Traits::kRowStep * p.k_seq_stride;
        v_src += Traits::kRowStep * p.v_seq_stride;
      }
      const int at = (r * kChunks + (chunk ^ (r & 7))) * 16;
      if ((bits >> r) & 1u) {
        cp_async16(dst_k + at, k_at);
        cp_async16(dst_v + at, v_at);
      } else {
        *reinterpret_cast<uint4*>(dst_k + at) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(dst_v + at) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    cp_async_commit();
    return bits;
  };

  // keep[j]: bits of local tile i + j while tile i is computed, a shift register (static indices only, so it
  // stays in registers). Each step shifts it and issues the newest tile; the prologue issues kStages - 1.
  uint32_t keep[kStages];
#pragma unroll
  for (int st = 0; st < kStages; ++st) keep[st] = 0u;
  auto shift_and_issue = [&](int i, int slot) {
#pragma unroll
    for (int st = 0; st + 1 < kStages; ++st) keep[st] = keep[st + 1];
    keep[kStages - 1] = i < my_tiles ? issue(i, slot) : (cp_async_commit(), 0u);
  };
#pragma unroll 1
  for (int st = 0; st < kStages - 1; ++st) shift_and_issue(st, st);

  const float scale_log2 = p.scale_log2;
  int slot = 0;
  for (int i = 0; i < my_tiles; ++i) {
    __syncwarp();  // every lane is done reading the slot refilled below (tile i - 1's)
    shift_and_issue(i + kStages - 1, slot == 0 ? kStages - 1 : slot - 1);
    cp_async_wait<kStages - 1>();  // this lane's copies of tile i have landed
    __syncwarp();                  // ... and every other lane's (and their zero fills)
    const uint32_t bits = keep[0];
    const uint32_t k_smem = smem_addr(warp_ring + slot * Traits::kStageBytes);
    const uint32_t v_smem = k_smem + Traits::kTileBytes;
    slot = slot + 1 == kStages ? 0 : slot + 1;

    // S = Q K^T: s[nt] = {S[g][8 nt + c], S[g][8 nt + c + 1], (rows 8..15: 0, 0)}
    float s[kNT][4];  // (kNT, 4)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      const int row = 8 * nt + (lane & 7);
#pragma unroll
      for (int q4 = 0; q4 < kHeadDim / 32; ++q4) {
        uint32_t kb[4];  // chunks 4 q4 .. 4 q4 + 3 of keys 8 nt .. 8 nt + 7: B fragments of k-steps 2 q4, 2 q4 + 1
        const int ch = 4 * q4 + (lane >> 3);
        ldmatrix_x4(kb, k_smem + (row * kChunks + (ch ^ (lane & 7))) * 16);
        mma_bf16_16816(s[nt], {qa[2 * q4][0], 0u, qa[2 * q4][1], 0u}, kb[0], kb[1]);
        mma_bf16_16816(s[nt], {qa[2 * q4 + 1][0], 0u, qa[2 * q4 + 1][1], 0u}, kb[2], kb[3]);
      }
    }

    // Online softmax of head g over the tile (exp2 domain); dropped keys score -inf.
    float mx = m_run;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = ((bits >> (8 * nt + cq + e)) & 1u) ? s[nt][e] * scale_log2 : neg_inf();
        s[nt][e] = v;
        mx = fmaxf(mx, v);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Rescale only when some head's max grew (rare after the first tiles); m_run == -inf gives alpha 0.
    if (__any_sync(0xffffffffu, mx > m_run)) {
      const float alpha = mx > m_run ? fast_exp2(m_run - mx) : 1.f;
      l_run *= alpha;
      // This lane's O^T columns are heads c and c + 1, whose states live in quads c and c + 1.
      const float alpha_lo = __shfl_sync(0xffffffffu, alpha, 4 * cq);
      const float alpha_hi = __shfl_sync(0xffffffffu, alpha, 4 * cq + 4);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        o[mt][0] *= alpha_lo;
        o[mt][1] *= alpha_hi;
        o[mt][2] *= alpha_lo;
        o[mt][3] *= alpha_hi;
      }
      m_run = mx;
    }
    const float base = m_run == neg_inf() ? 0.f : m_run;  // no key kept yet: every p is exp2(-inf) = 0

    // P as the B fragment of O^T += V^T P^T: {P[g][16 kk + c..c+1], P[g][16 kk + 8 + c..c+9]}.
    uint32_t ph[kKK][2], pl[kKK][2];  // (kKK, 2) bf16x2: P's bf16 rounding and (kSplitP) the remainder
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const float p0 = fast_exp2(s[nt][0] - base);
      const float p1 = fast_exp2(s[nt][1] - base);
      l_run += p0 + p1;
      const uint32_t hi = pack_bf16x2_rn(p0, p1);
      ph[nt / 2][nt % 2] = hi;
      pl[nt / 2][nt % 2] = Tile::kSplitP ? pack_bf16x2_rn(p0 - bf16_lo(hi), p1 - bf16_hi(hi)) : 0u;
    }

#pragma unroll
    for (int kk = 0; kk < kKK; ++kk) {
      const int row = 16 * kk + 8 * (lane >> 4) + (lane & 7);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        uint32_t va[4];  // V^T[16 mt .. 16 mt + 15][16 kk .. 16 kk + 15] as the A fragment
        const int ch = 2 * mt + ((lane >> 3) & 1);
        ldmatrix_x4_trans(va, v_smem + (row * kChunks + (ch ^ (lane & 7))) * 16);
        mma_bf16_16816(o[mt], va, ph[kk][0], ph[kk][1]);
        if constexpr (Tile::kSplitP) mma_bf16_16816(o[mt], va, pl[kk][0], pl[kk][1]);
      }
    }
  }
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);

  // Merge the warps' states in a fixed order (deterministic), then normalize. The states overwrite the
  // ring: every copy has landed (only empty groups can be pending) and been read.
  cp_async_wait<0>();
  __syncthreads();
  float* sm_o = reinterpret_cast<float*>(sm_ring);  // [kWarps][kMaxGroup][kHeadDim]
  float* sm_m = sm_o + kWarps * kMaxGroup * kHeadDim;  // [kWarps][kMaxGroup]
  float* sm_l = sm_m + kWarps * kMaxGroup;             // [kWarps][kMaxGroup]
  if ((lane & 3) == 0) {
    sm_m[warp * kMaxGroup + gq] = m_run;
    sm_l[warp * kMaxGroup + gq] = l_run;
  }
  {
    float* ow = sm_o + warp * (kMaxGroup * kHeadDim);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      ow[cq * kHeadDim + 16 * mt + gq] = o[mt][0];
      ow[(cq + 1) * kHeadDim + 16 * mt + gq] = o[mt][1];
      ow[cq * kHeadDim + 16 * mt + gq + 8] = o[mt][2];
      ow[(cq + 1) * kHeadDim + 16 * mt + gq + 8] = o[mt][3];
    }
  }
  __syncthreads();

  for (int item = tid; item < heads * kChunks; item += Traits::kThreads) {
    const int g = item / kChunks;
    const int c = (item % kChunks) * 8;
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w * kMaxGroup + g]);
    float sum = 0.f, out[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (mx != neg_inf()) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float wt = fast_exp2(sm_m[w * kMaxGroup + g] - mx);  // 0 for an empty warp
        sum = fmaf(sm_l[w * kMaxGroup + g], wt, sum);
        const float4 a = *reinterpret_cast<const float4*>(&sm_o[(w * kMaxGroup + g) * kHeadDim + c]);
        const float4 bb = *reinterpret_cast<const float4*>(&sm_o[(w * kMaxGroup + g) * kHeadDim + c + 4]);
        out[0] = fmaf(a.x, wt, out[0]); out[1] = fmaf(a.y, wt, out[1]);
        out[2] = fmaf(a.z, wt, out[2]); out[3] = fmaf(a.w, wt, out[3]);
        out[4] = fmaf(bb.x, wt, out[4]); out[5] = fmaf(bb.y, wt, out[5]);
        out[6] = fmaf(bb.z, wt, out[6]); out[7] = fmaf(bb.w, wt, out[7]);
      }
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] *= inv;
    const int qh = kvh * group_size + g0 + g;
    if (p.num_splits == 1) {
      const int64_t at = int64_t(b) * p.out_batch_stride + int64_t(qh) * p.out_head_stride + c;
      store_bf16<8, true>(static_cast<bf16*>(p.out_ptr) + at, out);
    } else {
      const int64_t row = (int64_t(split) * p.batch + b) * p.num_q_heads + qh;
      float4* dst = reinterpret_cast<float4*>(p.partial_o_ptr + row * kHeadDim + c);
      dst[0] = make_float4(out[0], out[1], out[2], out[3]);
      dst[1] = make_float4(out[4], out[5], out[6], out[7]);
      if (c == 0) p.partial_lse_ptr[row] = sum > 0.f ? mx + log2f(sum) : neg_inf();
    }
  }
}

}  // namespace attention
}  // namespace astrai
