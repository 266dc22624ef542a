// Launcher of the fused bf16 rotary kernel: picks the variant and the launch shape, returns a status.
#include <algorithm>
#include <climits>
#include <cstdint>

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
cudaError_t launch(const RotaryParams& p, cudaStream_t stream) {
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  const int sm_count = facts.sm_count, threads_per_sm = facts.max_threads_per_sm;

  const int chunks = p.head_dim / 2 / kPairs;
  const int heads = p.num_q_heads + p.num_k_heads;
  const int bx = std::min(chunks, kMaxChunkThreads);
  // One head per thread while every (token, head, chunk) item could be resident at once (threads_per_sm
  // is an upper bound: registers allow fewer): short problems are latency-bound and want the most SMs.
  // Otherwise each thread takes kHeadUnroll heads for bytes in flight and cos/sin reuse.
  const int64_t resident_threads = int64_t(sm_count) * threads_per_sm;
  const bool fits_resident = p.num_tokens <= resident_threads / (int64_t(heads) * chunks);
  const int heads_per_thread = fits_resident ? 1 : kHeadUnroll;
  const int by = std::min(ceil_div(heads, heads_per_thread), kMaxBlockThreads / bx);
  const int bz = int(std::min<int64_t>(std::max(1, kTargetBlockThreads / (bx * by)), p.num_tokens));
  const int block_threads = bx * by * bz;

  const int64_t blocks_per_wave = int64_t(sm_count) * std::max(1, threads_per_sm / block_threads);
  int64_t blocks = std::min(ceil_div<int64_t>(p.num_tokens, bz), blocks_per_wave * kMaxWaves);
  if (p.max_blocks > 0) blocks = std::min<int64_t>(blocks, p.max_blocks);

  rotary::rotary_bf16_kernel<kInterleaved, kPairs, kVecCs>
      <<<dim3(unsigned(blocks)), dim3(bx, by, bz), 0, stream>>>(p);
  return cudaGetLastError();
}

template <bool kInterleaved, int kPairs>
cudaError_t launch_cs(const RotaryParams& p, bool vec_cs, cudaStream_t stream) {
  if constexpr (kPairs % 4 == 0) {
    if (vec_cs) return launch<kInterleaved, kPairs, true>(p, stream);
  }
  return launch<kInterleaved, kPairs, false>(p, stream);
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

}  // namespace

cudaError_t rotary_bf16_launch(const RotaryParams& p, cudaStream_t stream) {
  if (!params_valid(p)) return cudaErrorInvalidValue;
  if (p.num_tokens == 0 || p.num_q_heads + p.num_k_heads == 0 || p.head_dim == 0) return cudaSuccess;

  const int half = p.head_dim / 2;
  const bool has_k = p.num_k_heads > 0;
  // 16-byte x moves: every x base 16-byte aligned and every token/head stride a multiple of 8 elements,
  // so each chunk's runs start 16-byte aligned.
  bool vec_x = aligned16(p.q_ptr) && aligned16(p.q_out_ptr) && p.q_token_stride % 8 == 0 &&
               p.q_head_stride % 8 == 0 && p.q_out_token_stride % 8 == 0 && p.q_out_head_stride % 8 == 0;
  if (has_k) {
    vec_x = vec_x && aligned16(p.k_ptr) && aligned16(p.k_out_ptr) && p.k_token_stride % 8 == 0 &&
            p.k_head_stride % 8 == 0 && p.k_out_token_stride % 8 == 0 && p.k_out_head_stride % 8 == 0;
  }
  const bool vec_cs = aligned16(p.cos_ptr) && aligned16(p.sin_ptr) && p.cos_row_stride % 4 == 0 &&
                      p.sin_row_stride % 4 == 0;

  if (p.interleaved) {
    if (vec_x && p.head_dim % 16 == 0) return launch_cs<true, 8>(p, vec_cs, stream);
    if (vec_x && p.head_dim % 8 == 0) return launch_cs<true, 4>(p, vec_cs, stream);
    return launch_cs<true, 1>(p, vec_cs, stream);
  }
  if (vec_x && half % 8 == 0) return launch_cs<false, 8>(p, vec_cs, stream);
  return launch_cs<false, 1>(p, vec_cs, stream);
}

}  // namespace astrai
