// The weight-stream kernel: w8a16 in layout nt at recipe 2 (blocks of 16 rows of a; b in groups of 16 rows), where
// the GEMM is a read of the int8 weights. b's rows fill the mma's 16-row side and a's rows (the tokens) its 8-column side
// ("swap AB": the kernel computes y^T = b a^T), so a one-token call wastes tensor-core columns, not bandwidth.
// b goes from global memory straight into registers, 16 bytes a lane (no shared memory: each byte is used once),
// with the next chunk of each row in flight and the L2 asked to fetch 256 bytes around each read; a comes
// through L1 (the CTAs of an SM read the same a). Asking L1 for a's next chunk ahead (prefetch.global.L1) was
// slower on the H200 (geomean 19.5 vs 18.1 us at the built-in splits, M = 16 up to 40% slower): not kept.
//
// Why this shape (H200 probe, docs/benchmarks.md "GEMM, the weight stream"): the stream is bound by bytes in
// flight, not by the expansion (removing it gained 0-8%): 32 resident warps a SM (<= 64 registers) and the L2
// prefetch hint are what moved it, from 0.52-0.66x to 0.60-0.76x of a same-run read of the weights. Later (ncu,
// 2026-12-04) its ALU pipe read 67% busy with the expansion at four lop3 a pair; one lop3 a mask took 5-6% off.
//
// A CTA is R groups of 16 b rows (threadIdx.z) times W warps along K (threadIdx.y): warp w of a group streams K
// slice s W + w of its rows (s = the CTA's index along K, blockIdx.z), and the group's W partials are summed in
// slice order through shared memory before the epilogue, so the common plan (split_k <= W) is one kernel with no
// workspace. More slices than one CTA holds (split_k > kGemmStreamMaxWarpsK) add CTAs along K, whose partials
// gemm_reduce_kernel sums in order. The host picks R from M and W from (N, K) (ops/gemm.py's stream rule).
//
// A lane's 16 bytes of a b row are 16 consecutive K values; K is permuted inside each 64-value chunk, the same way
// for a and b, so the sum is the same: see stream_step. K order of an output: chunks in order within a slice, then
// the slices in order (left to right: ((s0 + s1) + s2) ...). It depends on (N, K, split) only, not on M, but it is
// not the mainloop's order, so a w8a16 row's bits differ between recipe 2 and recipes 0 / 1 / 3 (contracts.md).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/params.h"
#include "kernels/gemm/sm80_gemm.cuh"
#include "kernels/gemm/sm80_gemm_launch.cuh"

namespace astrai {
namespace gemm {

struct StreamRecipe {
  static constexpr int kInFlight = 2;     // 64-byte chunks of each b row a lane has loaded ahead
  // Chunks of a's rows a lane has loaded ahead (divides kInFlight): two spilled registers under the 64-register bound.
  static constexpr int kTokensAhead = 1;
  static constexpr int kRowsB = 16;       // b rows of a warp (the mma's 16-row side)
  static constexpr int kRowsA = 16;       // a rows of a CTA (two n8 token tiles)
  static constexpr int kChunk = 64;       // b bytes (K values) of a row per step
  static constexpr int kMaxWarps = kGemmStreamMaxWarpsK;  // R * W: warps of a CTA
  // Registers: <= 64 a thread with one token tile (32 warps a SM), <= 80 with two (24 warps a SM).
  static constexpr int kBoundThreads1 = 1024, kBoundThreads2 = 32 * kMaxWarps;
};
static_assert(StreamRecipe::kRowsA == RecipeM16N64::kBM, "the stream kernel runs recipe 2's rows of a");
static_assert(PairBf16S8::kKTile == 2 * StreamRecipe::kChunk, "a split is a whole number of chunks");

// 16 bytes of b, read once: not kept in L1, and the L2 fetches the 256-byte block around them. Coherent loads, not
// .nc: ptxas may schedule a non-coherent load above griddepcontrol.wait (the kernel is a programmatic dependent).
__device__ __forceinline__ uint4 ld_weights16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// 16 bytes of a (re-read by every CTA on the same K range: left to L1).
__device__ __forceinline__ uint4 ld_tokens16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// The 16 bytes at p of which `left` lie inside the row, zeros past it; byte by byte, never past the row.
__device__ __forceinline__ uint4 ld_tail16(const uint8_t* p, int64_t left) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 16; ++i)
    if (i < left) w[i >> 2] |= uint32_t(p[i]) << (8 * (i & 3));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 32 bytes (16 values) of chunk `chunk` past xp of each token tile's row, into one ring slot.
template <int kTokenTiles>
__device__ __forceinline__ void load_tokens(uint4 (&slot)[kTokenTiles][2], const uint8_t* const (&xp)[kTokenTiles],
                                            int chunk) {
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j) {
    slot[j][0] = ld_tokens16(xp[j] + chunk * 128);
    slot[j][1] = ld_tokens16(xp[j] + chunk * 128 + 16);
  }
}

// Four int8 as two registers of two bf16 / fp16 values, bytes (0, 2) and (1, 3): s8x4_to_16bit's arithmetic
// without its two prmt (bytes 0 and 2 already sit in the 16-bit lanes; 1 and 3 after a shift).
template <bool kF16>
__device__ __forceinline__ void s8x4_to_16bit_02_13(uint32_t u, uint32_t& b02, uint32_t& b13) {
  b02 = s8_lanes_to_16bit<kF16>(u);
  b13 = s8_lanes_to_16bit<kF16>(u >> 8);
}

// One 64-value chunk: lane (g, t) holds K values 16t .. 16t + 15 of b rows g and g + 8 (w, v) and of token g
// (x: 16 16-bit values). mma r takes the lane's values 4r .. 4r + 3: slots 2t, 2t + 1 <- values 4r, 4r + 2 and
// slots 2t + 8, 2t + 9 <- values 4r + 1, 4r + 3, in a (the weights) and in b (the tokens) alike.
template <class Pair>
__device__ __forceinline__ void stream_step(float (&acc)[4], const uint4& w, const uint4& v, const uint4& x0,
                                            const uint4& x1) {
  constexpr bool kF16 = std::is_same<typename Pair::TA, __half>::value;
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w}, vs[4] = {v.x, v.y, v.z, v.w};
  const uint32_t xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    uint32_t w02, w13, v02, v13;
    s8x4_to_16bit_02_13<kF16>(ws[r], w02, w13);
    s8x4_to_16bit_02_13<kF16>(vs[r], v02, v13);
    const uint32_t a[4] = {w02, v02, w13, v13};
    // token values (4r, 4r + 2) and (4r + 1, 4r + 3) from the words (4r, 4r + 1), (4r + 2, 4r + 3)
    const uint32_t x02 = __byte_perm(xs[2 * r], xs[2 * r + 1], 0x5410);
    const uint32_t x13 = __byte_perm(xs[2 * r], xs[2 * r + 1], 0x7632);
    Pair::mma(acc, a, x02, x13);
  }
}

// The partial sums of one warp: 16 b rows from n0 (< p.n) x kTokenTiles n8 tiles of tokens from m0, over K slice
// `split` (empty past K); token rows past M read row m0 and are not stored. acc[j][e]: b row n0 + g + 8 (e / 2),
// token m0 + 8 j + 2 t + e % 2.
template <class Pair, int kTokenTiles>
__device__ __forceinline__ void stream_slice(const GemmParams& p, int n0, int m0, int split, int64_t bz,
                                             float (&acc)[kTokenTiles][4]) {
  using SR = StreamRecipe;
  using TA = typename Pair::TA;
  constexpr int kU = SR::kInFlight;
  constexpr int kX = SR::kTokensAhead;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int chunks = int(ceil_div<int64_t>(p.k, SR::kChunk));
  const int c_begin = split * p.k_tiles_per_split * 2;
  // [c_begin, c_end): this split's chunks (empty for a split past K); [c_begin, c_full) lie wholly inside the row
  // (no bounds checks), and c_full < c_end only in the split that holds the row's cut last chunk.
  const int c_end = max(c_begin, min(chunks, c_begin + p.k_tiles_per_split * 2));
  const int c_full = max(c_begin, min(c_end, p.k / SR::kChunk));
  // Rows past N or M read a valid row (row 0 of the block) and are never stored.
  const uint8_t* const b_base = static_cast<const uint8_t*>(p.b) + bz * p.b_batch_stride;
  const uint8_t* const w_row = b_base + int64_t(n0 + g < p.n ? n0 + g : n0) * p.b_row_stride + 16 * t;
  const uint8_t* const v_row = b_base + int64_t(n0 + g + 8 < p.n ? n0 + g + 8 : n0) * p.b_row_stride + 16 * t;
  const TA* const a_base = static_cast<const TA*>(p.a) + bz * p.a_batch_stride;
  const uint8_t* x_row[kTokenTiles];
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j) {
    const int m = m0 + 8 * j + g;
    x_row[j] = reinterpret_cast<const uint8_t*>(a_base + int64_t(m < p.m ? m : m0) * p.a_row_stride) + 32 * t;
  }

#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  // Programmatic dependent launch: nothing of global memory is read or written before the previous kernel finished.
  wait_prerequisites();

  // Rings: weight slot u % kU holds chunk c + u of rows g and g + 8 (loaded kU chunks ahead), token slot u % kX the
  // tokens' chunk c + u (kX ahead). A slot is refilled right after its chunk went through the mma, so a refill
  // writes the registers just read (no copies), and the addresses are pointers advanced a ring at a time, the slots'
  // offsets immediates. The loop this replaced (refills issued before the mma, rows' addresses recomputed a chunk)
  // was 143 SASS instructions a chunk on sm_90a with one token tile, 74 of them expansion, mma, byte permutes and
  // loads, the rest register copies of the ring, address arithmetic and branches; this one is 82 (two tiles: 150
  // -> 97), in a kernel whose ALU pipe ncu read 67% busy. Same mma order, same bits.
  const uint8_t* wp = w_row + int64_t(c_begin) * SR::kChunk;
  const uint8_t* vp = v_row + int64_t(c_begin) * SR::kChunk;
  const uint8_t* xp[kTokenTiles];
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j) xp[j] = x_row[j] + int64_t(c_begin) * 2 * SR::kChunk;
  uint4 ring_w[kU], ring_v[kU], ring_x[kX][kTokenTiles][2];
#pragma unroll
  for (int u = 0; u < kU; ++u)
    if (c_begin + u < c_full) {
      ring_w[u] = ld_weights16(wp + u * SR::kChunk);
      ring_v[u] = ld_weights16(vp + u * SR::kChunk);
      if (u < kX) load_tokens<kTokenTiles>(ring_x[u], xp, u);
    }
  int c = c_begin;
  // Whole rings whose refills all lie inside the row's full chunks: no condition a chunk.
  for (; c + 2 * kU <= c_full; c += kU) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j)
        stream_step<Pair>(acc[j], ring_w[u], ring_v[u], ring_x[u % kX][j][0], ring_x[u % kX][j][1]);
      ring_w[u] = ld_weights16(wp + (u + kU) * SR::kChunk);
      ring_v[u] = ld_weights16(vp + (u + kU) * SR::kChunk);
      load_tokens<kTokenTiles>(ring_x[u % kX], xp, u + kX);
    }
    wp += kU * SR::kChunk;
    vp += kU * SR::kChunk;
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) xp[j] += kU * 2 * SR::kChunk;
  }
  // The last (fewer than 2 kU) full chunks: chunk c + u sits in slot u % kU (c - c_begin is a multiple of kU).
#pragma unroll
  for (int u = 0; u < 2 * kU; ++u) {
    if (c + u < c_full) {
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j)
        stream_step<Pair>(acc[j], ring_w[u % kU], ring_v[u % kU], ring_x[u % kX][j][0], ring_x[u % kX][j][1]);
      if (c + u + kU < c_full) {
        ring_w[u % kU] = ld_weights16(wp + (u + kU) * SR::kChunk);
        ring_v[u % kU] = ld_weights16(vp + (u + kU) * SR::kChunk);
      }
      if (c + u + kX < c_full) load_tokens<kTokenTiles>(ring_x[u % kX], xp, u + kX);
    }
  }
  if (c_full < c_end) {  // the row's last chunk, cut by K: zeros past K on both sides
    const int64_t left = int64_t(p.k) - int64_t(c_full) * SR::kChunk - 16 * t;  // this lane's values inside
    const uint4 w = ld_tail16(w_row + int64_t(c_full) * SR::kChunk, left);
    const uint4 v = ld_tail16(v_row + int64_t(c_full) * SR::kChunk, left);
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
      const uint8_t* const x = x_row[j] + int64_t(c_full) * 2 * SR::kChunk;
      stream_step<Pair>(acc[j], w, v, ld_tail16(x, 2 * left), ld_tail16(x + 16, 2 * left - 16));
    }
  }
}

// Grid: x = blocks of R groups of 16 b rows (n), y = blocks of 16 a rows (m), z = batch * CTAs along K; block
// (32, W, R). A slice is p.k_tiles_per_split K tiles of 128 b bytes, as in the mainloop. kTokenTiles = 1 serves
// M <= 8, 2 every larger M (a last block of <= 8 rows reads row m0 twice). Dynamic shared memory: W > 1 ? R * W *
// kTokenTiles * 32 float4 : 0.
template <class Pair, int kTokenTiles>
__global__ void __launch_bounds__(kTokenTiles == 1 ? StreamRecipe::kBoundThreads1 : StreamRecipe::kBoundThreads2, 1)
    gemm_stream_kernel(const __grid_constant__ GemmParams p) {
  static_assert(Pair::kKind == Kind::kW8A16, "the stream kernel is w8a16's");
  extern __shared__ float4 partials[];  // [R][W][kTokenTiles][32]
  const int lane = threadIdx.x, w = threadIdx.y, group = threadIdx.z, W = blockDim.y;
  const int n0 = (blockIdx.x * blockDim.z + group) * StreamRecipe::kRowsB;
  const int m0 = blockIdx.y * StreamRecipe::kRowsA;
  const int ctas_k = int(gridDim.z) / p.batch;
  const int64_t bz = blockIdx.z / ctas_k;
  const int kcta = blockIdx.z % ctas_k;
  const bool live = n0 < p.n;  // a group past N streams nothing, but keeps the CTA's barrier

  float acc[kTokenTiles][4];
  if (live) {
    stream_slice<Pair, kTokenTiles>(p, n0, m0, kcta * W + w, bz, acc);
  } else {
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  }
  // Past the stream (each warp waited for the previous kernel in stream_slice): the next kernel (the reduction
  // across CTAs, the next call) may be scheduled; it waits for this grid before reading.
  launch_dependents();

  if (W > 1) {  // the group's slices, summed in order by its warp 0
    float4* const mine = partials + (group * W) * (kTokenTiles * 32);
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j)
      mine[(w * kTokenTiles + j) * 32 + lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    __syncthreads();
    if (w != 0) return;
    for (int s = 1; s < W; ++s)
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        const float4 v = mine[(s * kTokenTiles + j) * 32 + lane];
        acc[j][0] += v.x;
        acc[j][1] += v.y;
        acc[j][2] += v.z;
        acc[j][3] += v.w;
      }
  }
  if (!live) return;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = m0 + 8 * j + 2 * t + (e & 1), col = n0 + g + 8 * (e >> 1);
      if (row >= p.m || col >= p.n) continue;
      if (ctas_k > 1) {
        static_cast<float*>(p.workspace)[(int64_t(blockIdx.z) * p.m + row) * p.n + col] = acc[j][e];
      } else {
        store_out<float>(p, bz, row, col, acc[j][e], 0.f, false);
      }
    }
}

// The CTA shape of a launch: W = min(split_k, kMaxWarps) warps along K (the plan's choice: it sets the bits) and R
// groups of rows (free: each group's sums are its own). R keeps the grid one resident wave (resident_warps a SM:
// 32 with one token tile, 24 with two, as the launch bounds allow) and minimises the warps of the busiest SM;
// among equals the largest R wins: fewer CTAs read a's rows (every CTA reads all of a's K range), which matters
// at M > 8.
struct StreamGrid {
  int warps_k, groups, ctas_k;
};
inline StreamGrid stream_grid(const GemmParams& p, int sm_count, int resident_warps) {
  StreamGrid s{};
  s.warps_k = p.split_k < StreamRecipe::kMaxWarps ? p.split_k : StreamRecipe::kMaxWarps;
  s.ctas_k = ceil_div(p.split_k, s.warps_k);
  s.groups = 1;
  const int row_groups = ceil_div(p.n, StreamRecipe::kRowsB);
  int64_t best = -1;
  for (int r = 1; r * s.warps_k <= StreamRecipe::kMaxWarps && r <= row_groups; ++r) {
    const int64_t ctas = ceil_div<int64_t>(row_groups, r) * s.ctas_k, per_sm = resident_warps / (r * s.warps_k);
    if (per_sm == 0 || ctas > per_sm * sm_count) continue;
    const int64_t load = ceil_div<int64_t>(ctas, sm_count) * r * s.warps_k;
    if (best < 0 || load <= best) {
      best = load;
      s.groups = r;
    }
  }
  return s;
}

template <class Pair>
cudaError_t launch_stream(const GemmParams& p, cudaStream_t stream) {
  using SR = StreamRecipe;
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  const int tiles = p.m <= 8 ? 1 : 2;
  const StreamGrid sg = stream_grid(p, facts.sm_count, tiles == 1 ? 32 : 24);
  const dim3 grid(unsigned(ceil_div(ceil_div(p.n, SR::kRowsB), sg.groups)), unsigned(ceil_div(p.m, SR::kRowsA)),
                  unsigned(p.batch * sg.ctas_k));
  const dim3 block(32, unsigned(sg.warps_k), unsigned(sg.groups));
  const size_t smem = sg.warps_k > 1 ? size_t(sg.groups) * sg.warps_k * tiles * 32 * sizeof(float4) : 0;
  auto* kernel = tiles == 1 ? &gemm_stream_kernel<Pair, 1> : &gemm_stream_kernel<Pair, 2>;
  static PdlCodeCache known;  // both kernels are of one image
  bool pdl = false;
  ASTRAI_CUDA_TRY(gemm_pdl(kernel, known, &pdl));
  ASTRAI_CUDA_TRY(launch_maybe_dependent(kernel, grid, block, smem, stream, pdl, p));
  if (sg.ctas_k == 1) return cudaSuccess;
  GemmParams r = p;  // the CTAs' partials along K, one per CTA
  r.split_k = sg.ctas_k;
  return launch_split_reduce<float>(r, stream);
}

}  // namespace gemm
}  // namespace astrai
