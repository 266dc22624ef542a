// Split-KV GQA decode on bf16 (CUDA cores, fp32 online softmax), templated on the KV source, and its combine.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/attention/async_copy.cuh"
#include "kernels/attention/params.h"
#include "kernels/common/vec_types.cuh"

namespace astrai {
namespace attention {

constexpr int kDecodeThreads = 128;  // 4 warps
constexpr int kDecodeWarps = kDecodeThreads / 32;
// Most q heads of one kv head a block holds (registers: 16 floats per head per thread). A larger GQA
// group (MQA with many q heads) runs ceil(group / kMaxGroup) blocks per kv head, which share K/V through L2.
constexpr int kMaxGroup = 8;

// Work layout of one block: (sequence b, kv head, head group of kGroup q heads, split).
//   A "lane group" of kLanes = D/8 lanes holds one key row: each lane owns 8 consecutive dims (one 16-byte
//   load of K and one of V). A warp holds 32/kLanes lane groups; the block holds kTokenGroups of them.
//   Each lane group takes kKeys keys per step (their loads all issue before the first use), so a block
//   step covers kStep keys. Scores reduce over the lane group with xor shuffles; the G q heads share every
//   K/V load, so K/V stream from memory once per kv head.
template <int kHeadDim, int kGroup>
struct DecodeTraits {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "decode supports head_dim 64, 128, 256");
  static_assert(kGroup == 1 || kGroup == 2 || kGroup == 4 || kGroup == 8, "q heads per block: 1, 2, 4 or 8");
  static constexpr int kLanes = kHeadDim / 8;                        // lanes per key row
  static constexpr int kTokenGroups = kDecodeThreads / kLanes;       // lane groups per block
  // Keys per lane group per step: 4 keeps 128 bytes of K+V in flight per thread; 8 q heads need the
  // registers for q and the accumulators, so they take 2.
  static constexpr int kKeys = kGroup <= 4 ? 4 : 2;
  static constexpr int kStep = kTokenGroups * kKeys;                 // keys per block step
  // K/V staging: each thread cp.asyncs the 16-byte runs it will itself read (so no barrier is needed in
  // the loop) into a ring of kStages steps; kStages - 1 steps are in flight while one is computed.
  // 48 KB per block whatever the shape (the epilogue reuses it).
  static constexpr int kSmemBytes = 48 * 1024;
  static constexpr int kStageBytes = kDecodeThreads * kKeys * 2 * 16;  // K and V of kKeys keys per thread
  static constexpr int kStages = kSmemBytes / kStageBytes;             // 3 (kKeys 4) or 6 (kKeys 2)
  static_assert(kStages >= 2, "the ring needs two stages");
};

// Where key t of sequence b lives. Contiguous: [B, L, Hkv, D]. Paged: page_table[b, t >> log2(page_size)],
// slot t & (page_size - 1); an id outside [0, num_pages) makes the key unaddressable (it is dropped).
template <bool kPaged>
struct KvSource {
  __device__ __forceinline__ static bool locate(const DecodeParams& p, int b, int t, int64_t& k_off,
                                                int64_t& v_off) {
    if constexpr (kPaged) {
      const int page = __ldg(p.page_table_ptr + int64_t(b) * p.page_table_batch_stride + (t >> p.page_size_log2));
      if (page < 0 || page >= p.num_pages) return false;
      const int slot = t & ((1 << p.page_size_log2) - 1);
      k_off = int64_t(page) * p.k_batch_stride + int64_t(slot) * p.k_seq_stride;
      v_off = int64_t(page) * p.v_batch_stride + int64_t(slot) * p.v_seq_stride;
    } else {
      k_off = int64_t(b) * p.k_batch_stride + int64_t(t) * p.k_seq_stride;
      v_off = int64_t(b) * p.v_batch_stride + int64_t(t) * p.v_seq_stride;
    }
    return true;
  }
};

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// The 8 floats of one 16-byte bf16 load.
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
  f[0] = bf16_lo(v.x); f[1] = bf16_hi(v.x); f[2] = bf16_lo(v.y); f[3] = bf16_hi(v.y);
  f[4] = bf16_lo(v.z); f[5] = bf16_hi(v.z); f[6] = bf16_lo(v.w); f[7] = bf16_hi(v.w);
}

__device__ __forceinline__ void store8_bf16(void* dst, const float* f) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]),
                                              pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// grid: (Hkv * head_groups, B, num_splits); block: kDecodeThreads.
// Split s covers keys [s * split_len, min((s + 1) * split_len, kv_len)). Keys past kv_len, masked, past
// mask_len or on an invalid page are dropped. A query with no kept key gets 0 (lse -inf).
template <int kHeadDim, int kGroup, bool kPaged>
// Min blocks per SM: 4 keeps G <= 4 at <= 128 registers (4 x 48 KB of ring fit an H100/H200 SM).
__global__ void __launch_bounds__(kDecodeThreads, kGroup <= 4 ? 4 : 2)
    decode_split_kv_kernel(const __grid_constant__ DecodeParams p) {
  using Traits = DecodeTraits<kHeadDim, kGroup>;
  constexpr int kLanes = Traits::kLanes;
  constexpr int kTokenGroups = Traits::kTokenGroups;
  constexpr int kKeys = Traits::kKeys;
  constexpr int kStep = Traits::kStep;
  using bf16 = __nv_bfloat16;

  constexpr int kStages = Traits::kStages;
  // The K/V ring during the loop: [kStages][kKeys][K, V][kDecodeThreads] 16-byte runs; thread tid only
  // touches column tid. After the loop (and a barrier) the same bytes hold the lane groups' states.
  __shared__ __align__(16) uint4 sm_ring[kStages * kKeys * 2 * kDecodeThreads];
  static_assert(sizeof(sm_ring) == Traits::kSmemBytes, "ring size");
  static_assert(sizeof(float) * kTokenGroups * kGroup * (kHeadDim + 2) <= sizeof(sm_ring), "epilogue fits the ring");
  // per lane group: unnormalized o, running max (log2), sum of exp2
  auto& sm_o = *reinterpret_cast<float(*)[kTokenGroups][kGroup][kHeadDim]>(&sm_ring[0]);
  auto& sm_m = *reinterpret_cast<float(*)[kTokenGroups][kGroup]>(
      reinterpret_cast<float*>(&sm_ring[0]) + kTokenGroups * kGroup * kHeadDim);
  auto& sm_l = *reinterpret_cast<float(*)[kTokenGroups][kGroup]>(
      reinterpret_cast<float*>(&sm_ring[0]) + kTokenGroups * kGroup * (kHeadDim + 1));

  const int group_size = p.num_q_heads / p.num_kv_heads;
  const int head_groups = (group_size + kGroup - 1) / kGroup;
  const int kvh = int(blockIdx.x) / head_groups;
  const int g0 = (int(blockIdx.x) % head_groups) * kGroup;  // first head of this block within the kv head's group
  const int b = blockIdx.y;
  const int split = blockIdx.z;
  const int tid = threadIdx.x;
  const int tg = tid / kLanes;         // lane group
  const int d0 = (tid % kLanes) * 8;   // this lane's first dim

  int kv_len = p.max_kv_len;
  if (p.kv_lens_ptr != nullptr) kv_len = min(max(__ldg(p.kv_lens_ptr + b), 0), p.max_kv_len);
  const int64_t start64 = int64_t(split) * p.split_len;
  const int start = int(min(start64, int64_t(kv_len)));
  const int end = int(min(start64 + p.split_len, int64_t(kv_len)));

  // q, pre-scaled into the exp2 domain: scores come out as scale * log2(e) * q.k.
  float q[kGroup][8];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    const int gh = g0 + g;
    if (gh < group_size) {
      const int qh = kvh * group_size + gh;
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.q_ptr) +
                                                             (int64_t(b) * p.q_batch_stride +
                                                              int64_t(qh) * p.q_head_stride + d0)));
      unpack8(raw, q[g]);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[g][i] *= p.scale_log2;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) q[g][i] = 0.f;
    }
  }

  float m[kGroup], l[kGroup], acc[kGroup][8];  // online softmax state of this lane group, per head
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m[g] = neg_inf();
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  }

  const bf16* k_base = static_cast<const bf16*>(p.k_ptr) + (int64_t(kvh) * p.k_head_stride + d0);
  const bf16* v_base = static_cast<const bf16*>(p.v_ptr) + (int64_t(kvh) * p.v_head_stride + d0);
  const uint8_t* mask_row = p.mask_ptr == nullptr ? nullptr : p.mask_ptr + int64_t(b) * p.mask_batch_stride;

  // Starts the copies of step `step` (keys base + j * kTokenGroups + tg) into ring slot `slot`; returns
  // the keep bits of its kKeys keys. Dropped keys copy nothing. Always commits one group (maybe empty).
  auto issue = [&](int step, int slot) -> uint32_t {
    uint32_t bits = 0;
    const int base = start + step * kStep;
    uint4* dst = &sm_ring[slot * (kKeys * 2 * kDecodeThreads) + tid];
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      const int t = base + j * kTokenGroups + tg;
      bool ok = t < end;
      if (ok && mask_row != nullptr) ok = t < p.mask_len && mask_row[t] != 0;
      int64_t k_off = 0, v_off = 0;
      if (ok) ok = KvSource<kPaged>::locate(p, b, t, k_off, v_off);
      if (ok) {
        cp_async16(dst + (2 * j) * kDecodeThreads, k_base + k_off);
        cp_async16(dst + (2 * j + 1) * kDecodeThreads, v_base + v_off);
        bits |= 1u << j;
      }
    }
    cp_async_commit();
    return bits;
  };

  // keep bits of the steps in flight: ring slot r holds bits [r * kKeys, (r + 1) * kKeys).
  constexpr uint32_t kKeyBits = (1u << kKeys) - 1u;
  uint32_t keep_ring = 0;
  const int steps = end > start ? (end - start + kStep - 1) / kStep : 0;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    const uint32_t bits = st < steps ? issue(st, st) : (cp_async_commit(), 0u);
    keep_ring |= bits << (st * kKeys);
  }

  // Block-uniform loop: every lane reaches every shuffle. Step `step` is read from slot step % kStages;
  // before computing it, step + kStages - 1 is started into the slot step - 1 freed (this thread's own).
  int slot = 0;
  for (int step = 0; step < steps; ++step) {
    {
      const int ahead = step + kStages - 1;
      const int ahead_slot = slot == 0 ? kStages - 1 : slot - 1;
      const uint32_t bits = ahead < steps ? issue(ahead, ahead_slot) : (cp_async_commit(), 0u);
      keep_ring = (keep_ring & ~(kKeyBits << (ahead_slot * kKeys))) | (bits << (ahead_slot * kKeys));
    }
    cp_async_wait<kStages - 1>();  // this thread's copies of `step` have landed

    uint4 kr[kKeys], vr[kKeys];  // (kKeys,) raw 16-byte runs of K and V
    bool keep[kKeys];
    const uint4* src = &sm_ring[slot * (kKeys * 2 * kDecodeThreads) + tid];
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      keep[j] = (keep_ring >> (slot * kKeys + j)) & 1u;
      if (keep[j]) {
        kr[j] = src[(2 * j) * kDecodeThreads];
        vr[j] = src[(2 * j + 1) * kDecodeThreads];
      } else {
        kr[j] = make_uint4(0, 0, 0, 0);
        vr[j] = make_uint4(0, 0, 0, 0);
      }
    }
    slot = slot + 1 == kStages ? 0 : slot + 1;

    float s[kKeys][kGroup];  // scores, exp2 domain
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      float kf[8];
      unpack8(kr[j], kf);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float dot = q[g][0] * kf[0];
#pragma unroll
        for (int i = 1; i < 8; ++i) dot = fmaf(q[g][i], kf[i], dot);
        s[j][g] = dot;
      }
    }
    // Xor butterfly inside each lane group: every lane ends with the same, complete sums (a + b == b + a).
#pragma unroll
    for (int off = kLanes / 2; off >= 1; off /= 2) {
#pragma unroll
      for (int j = 0; j < kKeys; ++j)
#pragma unroll
        for (int g = 0; g < kGroup; ++g) s[j][g] += __shfl_xor_sync(0xffffffffu, s[j][g], off);
    }

#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int j = 0; j < kKeys; ++j) {
        if (!keep[j]) s[j][g] = neg_inf();
        m_new = fmaxf(m_new, s[j][g]);
      }
      if (m_new == neg_inf()) continue;  // nothing kept yet: the state stays empty
      // Rescale only when the max grew: with m_new == m the factor would be exp2(0) == 1 (a no-op), and
      // after the first keys the max rarely moves, so this saves the exp2 and G * 9 multiplies per step.
      if (m_new > m[g]) {
        const float alpha = exp2f(m[g] - m_new);  // 0 when m was -inf
        l[g] *= alpha;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
        m[g] = m_new;
      }
#pragma unroll
      for (int j = 0; j < kKeys; ++j) {
        const float pj = exp2f(s[j][g] - m_new);  // 0 for dropped keys
        l[g] += pj;
        float vf[8];
        unpack8(vr[j], vf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(pj, vf[i], acc[g][i]);
      }
    }
  }

  // Merge the lane groups' states in a fixed order (deterministic), then normalize. The states overwrite
  // the ring: every thread's copies are done (only empty groups can be pending) and read.
  cp_async_wait<0>();
  __syncthreads();
  if (tid % kLanes == 0) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      sm_m[tg][g] = m[g];
      sm_l[tg][g] = l[g];
    }
  }
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    float4* dst = reinterpret_cast<float4*>(&sm_o[tg][g][d0]);
    dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
  }
  __syncthreads();

  for (int item = tid; item < kGroup * kLanes; item += kDecodeThreads) {
    const int g = item / kLanes;
    const int c = (item % kLanes) * 8;
    const int gh = g0 + g;
    if (gh >= group_size) continue;
    float mx = neg_inf();
#pragma unroll
    for (int t = 0; t < kTokenGroups; ++t) mx = fmaxf(mx, sm_m[t][g]);
    float sum = 0.f, o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (mx != neg_inf()) {
#pragma unroll
      for (int t = 0; t < kTokenGroups; ++t) {
        const float w = exp2f(sm_m[t][g] - mx);  // 0 for an empty lane group
        sum = fmaf(sm_l[t][g], w, sum);
        const float4 a = *reinterpret_cast<const float4*>(&sm_o[t][g][c]);
        const float4 bb = *reinterpret_cast<const float4*>(&sm_o[t][g][c + 4]);
        o[0] = fmaf(a.x, w, o[0]); o[1] = fmaf(a.y, w, o[1]); o[2] = fmaf(a.z, w, o[2]); o[3] = fmaf(a.w, w, o[3]);
        o[4] = fmaf(bb.x, w, o[4]); o[5] = fmaf(bb.y, w, o[5]); o[6] = fmaf(bb.z, w, o[6]); o[7] = fmaf(bb.w, w, o[7]);
      }
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] *= inv;
    const int qh = kvh * group_size + gh;
    if (p.num_splits == 1) {
      const int64_t at = int64_t(b) * p.out_batch_stride + int64_t(qh) * p.out_head_stride + c;
      store8_bf16(static_cast<bf16*>(p.out_ptr) + at, o);
    } else {
      const int64_t row = (int64_t(split) * p.batch + b) * p.num_q_heads + qh;
      float4* dst = reinterpret_cast<float4*>(p.partial_o_ptr + row * kHeadDim + c);
      dst[0] = make_float4(o[0], o[1], o[2], o[3]);
      dst[1] = make_float4(o[4], o[5], o[6], o[7]);
      if (c == 0) p.partial_lse_ptr[row] = sum > 0.f ? mx + log2f(sum) : neg_inf();
    }
  }
}

}  // namespace attention
}  // namespace astrai
