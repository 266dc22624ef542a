// Launcher of the fused bf16 rotary kernel and its plan (rotary.h): the policy picks the variant and the launch
// shape, the launcher checks and launches exactly that.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/rotary/rotary.h"
#include "kernels/rotary/rotary_bf16.cuh"

namespace astrai {
namespace {

using rotary::kHeadUnroll;
using rotary::kMaxBlockThreads;

// Threads across the chunks of one head; more chunks than this (scalar variant with D > 128, 16-byte
// variant with D > 1024) loop.
constexpr int kMaxChunkThreads = 64;
// Preferred block size once a token's threads are placed: small enough to spread short problems over
// many SMs, large enough that block scheduling stays cheap.
constexpr int kTargetBlockThreads = 256;
// Grid cap in full-occupancy waves; beyond it blocks loop over tokens. Several waves keep the last,
// partial wave small even when registers allow fewer resident blocks than threads do.
constexpr int64_t kMaxWaves = 16;

template <bool kInterleaved, int kPairs, bool kVecCs>
cudaError_t launch(const RotaryParams& p, const RotaryLaunch& l, cudaStream_t stream) {
  rotary::rotary_bf16_kernel<kInterleaved, kPairs, kVecCs>
      <<<dim3(unsigned(l.blocks)), dim3(l.block_x, l.block_y, l.block_z), 0, stream>>>(p);
  return cudaGetLastError();
}

template <bool kInterleaved, int kPairs>
cudaError_t launch_cs(const RotaryParams& p, const RotaryLaunch& l, cudaStream_t stream) {
  if constexpr (kPairs % 4 == 0) {
    if (l.vec_cs) return launch<kInterleaved, kPairs, true>(p, l, stream);
  }
  return launch<kInterleaved, kPairs, false>(p, l, stream);
}

bool params_valid(const RotaryParams& p) {
  if (p.num_tokens < 0 || p.num_rows < 0 || p.num_q_heads < 0 || p.num_k_heads < 0) return false;
  if (p.head_dim < 0 || p.head_dim % 2 != 0) return false;
  if (int64_t(p.num_q_heads) + p.num_k_heads > INT_MAX) return false;
  if (p.q_ptr == nullptr || p.q_out_ptr == nullptr) return false;
  if (p.num_k_heads > 0 && (p.k_ptr == nullptr || p.k_out_ptr == nullptr)) return false;
  if (p.num_rows > 0 && (p.cos_ptr == nullptr || p.sin_ptr == nullptr)) return false;
  // Without positions the row is the token: the table must have one row per token.
  if (p.positions_ptr == nullptr && p.num_rows != p.num_tokens) return false;
  return true;
}

// The widest pairs a thread may move for this shape (8, 4: 16-byte runs of x; 1: scalar).
int widest_pairs(const RotaryShape& s) {
  if (!s.vec_x) return 1;
  if (s.interleaved) return s.head_dim % 16 == 0 ? 8 : s.head_dim % 8 == 0 ? 4 : 1;
  return (s.head_dim / 2) % 8 == 0 ? 8 : 1;
}

}  // namespace

RotaryShape rotary_shape_of(const RotaryParams& p) {
  RotaryShape s{};
  s.num_tokens = p.num_tokens;
  s.num_q_heads = p.num_q_heads;
  s.num_k_heads = p.num_k_heads;
  s.head_dim = p.head_dim;
  s.interleaved = p.interleaved;
  s.max_blocks = p.max_blocks;
  // 16-byte x moves: every x base 16-byte aligned and every token/head stride a multiple of 8 elements, so each
  // chunk's runs start 16-byte aligned.
  s.vec_x = aligned16(p.q_ptr) && aligned16(p.q_out_ptr) && p.q_token_stride % 8 == 0 && p.q_head_stride % 8 == 0 &&
            p.q_out_token_stride % 8 == 0 && p.q_out_head_stride % 8 == 0;
  if (p.num_k_heads > 0) {
    s.vec_x = s.vec_x && aligned16(p.k_ptr) && aligned16(p.k_out_ptr) && p.k_token_stride % 8 == 0 &&
              p.k_head_stride % 8 == 0 && p.k_out_token_stride % 8 == 0 && p.k_out_head_stride % 8 == 0;
  }
  s.vec_cs = aligned16(p.cos_ptr) && aligned16(p.sin_ptr) && p.cos_row_stride % 4 == 0 && p.sin_row_stride % 4 == 0;
  return s;
}

RotaryLaunch rotary_plan(const RotaryShape& s, const RotaryTarget& t) {
  RotaryLaunch l{};
  l.pairs = widest_pairs(s);
  l.vec_cs = l.pairs % 4 == 0 && s.vec_cs;
  const int64_t tokens = std::max<int64_t>(s.num_tokens, 1);
  const int chunks = std::max(s.head_dim / 2 / l.pairs, 1);
  const int heads = std::max(s.num_q_heads + s.num_k_heads, 1);
  const int sm_count = std::max(t.sm_count, 1), threads_per_sm = std::max(t.threads_per_sm, 1);
  const int bx = std::min(chunks, kMaxChunkThreads);
  // One head per thread while every (token, head, chunk) item could be resident at once (threads_per_sm
  // is an upper bound: registers allow fewer): short problems are latency-bound and want the most SMs.
  // Otherwise each thread takes kHeadUnroll heads for bytes in flight and cos/sin reuse.
  const int64_t resident_threads = int64_t(sm_count) * threads_per_sm;
  const bool fits_resident = tokens <= resident_threads / (int64_t(heads) * chunks);
  const int heads_per_thread = fits_resident ? 1 : kHeadUnroll;
  const int by = std::min(ceil_div(heads, heads_per_thread), kMaxBlockThreads / bx);
  const int bz = int(std::min<int64_t>(std::max(1, kTargetBlockThreads / (bx * by)), tokens));
  const int block_threads = bx * by * bz;
  const int64_t blocks_per_wave = int64_t(sm_count) * std::max(1, threads_per_sm / block_threads);
  int64_t blocks = std::min(ceil_div<int64_t>(tokens, bz), blocks_per_wave * kMaxWaves);
  if (s.max_blocks > 0) blocks = std::min<int64_t>(blocks, s.max_blocks);
  l.block_x = bx;
  l.block_y = by;
  l.block_z = bz;
  l.blocks = blocks;
  return l;
}

std::string rotary_launch_unfit(const RotaryShape& s, const RotaryLaunch& l) {
  if (l.pairs != 1 && l.pairs != 4 && l.pairs != 8) return "pairs must be 1, 4 or 8, got " + std::to_string(l.pairs);
  if (l.pairs > widest_pairs(s) || (l.pairs == 4 && !s.interleaved)) {
    return "pairs " + std::to_string(l.pairs) + " is not allowed here: this call's pointers, strides, layout and " +
           "head_dim allow at most " + std::to_string(widest_pairs(s)) + " (4 only in the interleaved layout)";
  }
  if (l.vec_cs && (l.pairs % 4 != 0 || !s.vec_cs)) {
    return "vec_cs needs pairs 4 or 8 and cos/sin 16-byte aligned with row strides multiples of 4 elements";
  }
  if (l.block_x < 1 || l.block_y < 1 || l.block_z < 1 || l.block_z > 64 ||
      int64_t(l.block_x) * l.block_y * l.block_z > kMaxBlockThreads) {
    return "block (" + std::to_string(l.block_x) + ", " + std::to_string(l.block_y) + ", " + std::to_string(l.block_z) +
           ") must be positive with at most " + std::to_string(kMaxBlockThreads) + " threads (z at most 64)";
  }
  if (l.blocks < 1 || l.blocks > INT_MAX) return "blocks must be in [1, 2^31), got " + std::to_string(l.blocks);
  return std::string();
}

cudaError_t rotary_device_target(int device, RotaryTarget* target) {
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(device_facts(device, &facts));
  *target = RotaryTarget{facts.sm_count, facts.max_threads_per_sm};
  return cudaSuccess;
}

cudaError_t rotary_bf16_launch(const RotaryParams& p, const RotaryLaunch& l, cudaStream_t stream) {
  if (!params_valid(p)) return cudaErrorInvalidValue;
  if (p.num_tokens == 0 || p.num_q_heads + p.num_k_heads == 0 || p.head_dim == 0) return cudaSuccess;
  if (!rotary_launch_unfit(rotary_shape_of(p), l).empty()) return cudaErrorInvalidValue;
  if (p.interleaved) {
    if (l.pairs == 8) return launch_cs<true, 8>(p, l, stream);
    if (l.pairs == 4) return launch_cs<true, 4>(p, l, stream);
    return launch_cs<true, 1>(p, l, stream);
  }
  if (l.pairs == 8) return launch_cs<false, 8>(p, l, stream);
  return launch_cs<false, 1>(p, l, stream);
}

}  // namespace astrai
