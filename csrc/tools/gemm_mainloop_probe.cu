// Developer probe of the portable GEMM mainloop on the GPU in hand: (1) the mma.sync ceiling (bf16 m16n8k16 and
// s8 m16n8k32 from registers, by warps per SM and independent accumulators per warp); (2) gemm_sm80_kernel under
// tile recipes that the library does not ship (CTA and warp tiles, stages, resident CTAs), w16a16 and w8a8 at
// prefill sizes, each checked bitwise against the shipped recipe 0 (the K order does not depend on the recipe);
// (3) a register-pipelined form of the same mainloop (P variants: double fragment sets, the barrier mid-tile), not
// shipped: slower than recipe 0 on its own tile (H100, thirty-second session). Not built by CMake; on a GPU:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -DNDEBUG -Icsrc \
//        -o gemm_mainloop_probe csrc/tools/gemm_mainloop_probe.cu
//   ./gemm_mainloop_probe            # the recipe tables
//   ./gemm_mainloop_probe peak       # the mma.sync ceiling first
//   ./gemm_mainloop_probe one V      # variant V once at 4096^3 after one warm-up launch (for ncu)
// docs/benchmarks.md ("GEMM, the mainloop probed") records what it measured and what the library took from it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <atomic>

#include "kernels/gemm/sm80_gemm_launch.cuh"

using namespace astrai;
using namespace astrai::gemm;

// The library's PDL switch lives in gemm_launch.cu (not linked here): the probe launches plainly.
bool astrai::gemm_pdl_allowed() { return false; }

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      printf("CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__);         \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

// ---- (1) the mma.sync ceiling --------------------------------------------------------------------------
template <int kAcc, bool kS8>
__global__ void mma_peak_kernel(float* out, int iters, uint32_t seed) {
  uint32_t a[4], b0 = seed * 3u + threadIdx.x, b1 = seed ^ threadIdx.x;
  for (int i = 0; i < 4; ++i) a[i] = seed * (i + 7) + threadIdx.x;
  float facc[kAcc][4];
  int32_t iacc[kAcc][4];
#pragma unroll
  for (int j = 0; j < kAcc; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) facc[j][e] = 0.f, iacc[j][e] = 0;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < kAcc; ++j) {
      if constexpr (kS8) {
        mma_s8_16832(iacc[j], a, b0, b1);
      } else {
        mma_bf16_16816(facc[j], a, b0, b1);
      }
    }
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kAcc; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s += kS8 ? float(iacc[j][e]) : facc[j][e];
  if (s == 1234.5f) out[threadIdx.x] = s;  // keeps the work alive
}

template <int kAcc, bool kS8>
double mma_peak(int sms, int warps_per_block, int blocks_per_sm) {
  const int iters = 4096;
  float* out = nullptr;
  CK(cudaMalloc(&out, 4096));
  const dim3 grid(sms * blocks_per_sm), block(32 * warps_per_block);
  mma_peak_kernel<kAcc, kS8><<<grid, block>>>(out, 16, 1);
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(e0));
    mma_peak_kernel<kAcc, kS8><<<grid, block>>>(out, iters, r + 2);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  const double flop = double(grid.x) * warps_per_block * iters * kAcc * (kS8 ? 2.0 * 16 * 8 * 32 : 2.0 * 16 * 8 * 16);
  CK(cudaFree(out));
  return flop / (ms[2] * 1e-3) / 1e12;
}

// ---- (3) a register-pipelined mainloop (experiment) ------------------------------------------------------
// gemm_sm80_kernel's tiles, copies and K order, with the fragments of the next 32-byte step loaded before the
// current step's mma (two fragment sets), the barrier moved to the third step of a tile (so the tensor pipe holds
// queued mma while the warps meet), the next tile's copies issued across steps 0 and 1, and the K-tile loop kept
// rolled. nt, 16-bit and 8-bit pairs (not w8a16).
template <class Pair, class R>
__global__ void __launch_bounds__(R::kThreads, R::kMinBlocks) gemm_pipelined_kernel(const __grid_constant__ GemmParams p) {
  static_assert(Pair::kKind != Kind::kW8A16, "w8a16 keeps its own a fragments");
  using S = Shape<Pair, R>;
  using Acc = typename Pair::Acc;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / R::kWarpsN, warp_n = warp % R::kWarpsN;
  const int m0 = blockIdx.y * R::kBM, n0 = blockIdx.x * R::kBN;
  const int split = blockIdx.z % p.split_k;
  const int64_t bz = blockIdx.z / p.split_k;
  const int k_tiles = ceil_div(p.k, Pair::kKTile);
  const int kt_begin = split * p.k_tiles_per_split;
  const int kt_end = min(k_tiles, kt_begin + p.k_tiles_per_split);
  const int nk = max(0, kt_end - kt_begin);
  const uint8_t* a_base = static_cast<const uint8_t*>(p.a) + bz * p.a_batch_stride * Pair::kABytes;
  const uint8_t* b_base = static_cast<const uint8_t*>(p.b) + bz * p.b_batch_stride * Pair::kBBytes;
  const int64_t a_row_bytes = p.a_row_stride * Pair::kABytes, b_row_bytes = p.b_row_stride * Pair::kBBytes;
  const int64_t a_k_bytes = int64_t(p.k) * Pair::kABytes, b_k_bytes = int64_t(p.k) * Pair::kBBytes;
  const uint32_t smem_base = smem_addr(smem);
  constexpr int kACpr = S::kAPanels * 8, kARowStep = R::kThreads / kACpr;
  constexpr int kAIters = (R::kBM * kACpr + R::kThreads - 1) / R::kThreads;
  constexpr int kBRowStep = R::kThreads / 8, kBIters = (R::kBN * 8 + R::kThreads - 1) / R::kThreads;
  const int a_row0 = tid / kACpr, a_chunk = tid % kACpr, b_row0 = tid >> 3, b_chunk = tid & 7;
  const uint8_t* const a_src0 = a_base + int64_t(m0 + a_row0) * a_row_bytes + a_chunk * 16;
  const uint8_t* const b_src0 = b_base + int64_t(n0 + b_row0) * b_row_bytes + b_chunk * 16;
  const uint32_t a_off0 = tile_offset<R::kBM>(a_row0, a_chunk), b_off0 = tile_offset<R::kBN>(b_row0, b_chunk);
  const bool a_inside = m0 + R::kBM <= p.m, b_inside = n0 + R::kBN <= p.n;
  const int kt_inside = p.k / Pair::kKTile;
  const int64_t a_row_step = kARowStep * a_row_bytes, b_row_step = kBRowStep * b_row_bytes;
  constexpr bool kAEven = kAIters * kARowStep == R::kBM, kBEven = kBIters * kBRowStep == R::kBN;
  auto load_a = [&](int stage, int kt) {
    const uint32_t a_dst = smem_base + stage * S::kStageBytes + a_off0;
    const int64_t a_kb = int64_t(kt) * S::kARowBytes;
    if (a_inside && kt < kt_inside) {
#pragma unroll
      for (int r = 0; r < kAIters; ++r)
        if (kAEven || a_row0 + r * kARowStep < R::kBM)
          cp_async16_zfill_bytes(a_dst + r * kARowStep * 128, a_src0 + a_kb + r * a_row_step, 16);
    } else {
      const int a_bytes = chunk_bytes(a_k_bytes - a_kb - a_chunk * 16);
#pragma unroll
      for (int r = 0; r < kAIters; ++r) {
        const int row = a_row0 + r * kARowStep;
        if (row < R::kBM) {
          const bool in = m0 + row < p.m && a_bytes > 0;
          cp_async16_zfill_bytes(a_dst + r * kARowStep * 128,
                                 in ? a_src0 + r * kARowStep * a_row_bytes + a_kb : a_base, in ? a_bytes : 0);
        }
      }
    }
  };
  auto load_b = [&](int stage, int kt) {
    const uint32_t b_dst = smem_base + stage * S::kStageBytes + S::kAStageBytes + b_off0;
    const int64_t b_kb = int64_t(kt) * 128;
    if (b_inside && kt < kt_inside) {
#pragma unroll
      for (int r = 0; r < kBIters; ++r)
        if (kBEven || b_row0 + r * kBRowStep < R::kBN)
          cp_async16_zfill_bytes(b_dst + r * kBRowStep * 128, b_src0 + b_kb + r * b_row_step, 16);
    } else {
      const int b_bytes = chunk_bytes(b_k_bytes - b_kb - b_chunk * 16);
#pragma unroll
      for (int r = 0; r < kBIters; ++r) {
        const int row = b_row0 + r * kBRowStep;
        if (row < R::kBN) {
          const bool in = n0 + row < p.n && b_bytes > 0;
          cp_async16_zfill_bytes(b_dst + r * kBRowStep * 128,
                                 in ? b_src0 + r * kBRowStep * b_row_bytes + b_kb : b_base, in ? b_bytes : 0);
        }
      }
    }
  };

  Acc acc[S::kMI][S::kNI][4];
#pragma unroll
  for (int i = 0; i < S::kMI; ++i)
#pragma unroll
    for (int j = 0; j < S::kNI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = Acc(0);
  wait_prerequisites();
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < nk) {
      load_a(s, kt_begin + s);
      load_b(s, kt_begin + s);
    }
    cp_async_commit();
  }
  uint32_t a_frag_off[4], b_frag_off[4];
  {
    const int b_row = warp_n * R::kWN + (lane & 7) + ((lane >> 4) << 3);
    const int a_row = warp_m * R::kWM + (lane & 15);
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      b_frag_off[step] = S::kAStageBytes + tile_offset<R::kBN>(b_row, step * 2 + ((lane >> 3) & 1));
      a_frag_off[step] = tile_offset<R::kBM>(a_row, step * 2 + (lane >> 4));
    }
  }
  uint32_t fa[2][S::kMI][4], fb[2][S::kNI][2];
  auto load_frags = [&](int buf, uint32_t st, int step) {
#pragma unroll
    for (int j = 0; j < S::kNI; j += 2) {
      uint32_t r[4];
      ldmatrix_x4(r, st + b_frag_off[step] + j * 8 * 128);
      fb[buf][j][0] = r[0];
      fb[buf][j][1] = r[1];
      fb[buf][j + 1][0] = r[2];
      fb[buf][j + 1][1] = r[3];
    }
#pragma unroll
    for (int i = 0; i < S::kMI; ++i) ldmatrix_x4(fa[buf][i], st + a_frag_off[step] + i * 16 * 128);
  };
  cp_async_wait<S::kStages - 2>();
  __syncthreads();
  int read_stage = 0, write_stage = S::kStages - 1;
  load_frags(0, smem_base, 0);
#pragma unroll 1
  for (int it = 0; it < nk; ++it) {
    const uint32_t st = smem_base + read_stage * S::kStageBytes;
    const int next_stage = read_stage + 1 == S::kStages ? 0 : read_stage + 1;
    const bool refill = it + S::kStages - 1 < nk;
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      load_frags((step + 1) & 1, step < 3 ? st : smem_base + next_stage * S::kStageBytes, (step + 1) & 3);
      if (step == 0 && refill) load_a(write_stage, kt_begin + it + S::kStages - 1);
      if (step == 1) {
        if (refill) load_b(write_stage, kt_begin + it + S::kStages - 1);
        cp_async_commit();
      }
#pragma unroll
      for (int i = 0; i < S::kMI; ++i)
#pragma unroll
        for (int j = 0; j < S::kNI; ++j) Pair::mma(acc[i][j], fa[step & 1][i], fb[step & 1][j][0], fb[step & 1][j][1]);
      if (step == 2) {
        cp_async_wait<S::kStages - 2>();  // tile it + 1 landed (step 3 reads its first fragments)
        __syncthreads();                   // and every warp is done with stage it - 1 (refilled next tile)
      }
    }
    read_stage = next_stage;
    write_stage = write_stage + 1 == S::kStages ? 0 : write_stage + 1;
  }
  cp_async_wait<0>();
  launch_dependents();
  const int g = lane >> 2, t = lane & 3;
  const bool partial = p.split_k > 1;
#pragma unroll
  for (int i = 0; i < S::kMI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + warp_m * R::kWM + i * 16 + g + 8 * h;
      if (row >= p.m) continue;
#pragma unroll
      for (int j = 0; j < S::kNI; ++j) {
        const int col = n0 + warp_n * R::kWN + j * 8 + 2 * t;
        if (col >= p.n) continue;
        const bool two = col + 1 < p.n;
        const Acc v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
        if (partial) {
          Acc* w = static_cast<Acc*>(p.workspace) + (int64_t(blockIdx.z) * p.m + row) * p.n + col;
          w[0] = v0;
          if (two) w[1] = v1;
        } else {
          store_out<Acc>(p, bz, row, col, v0, v1, two);
        }
      }
    }
  }
}

template <class Pair, class R>
cudaError_t launch_pipelined(const GemmParams& p, cudaStream_t stream) {
  using S = Shape<Pair, R>;
  static std::atomic<uint64_t> smem_set{0};
  auto* kernel = &gemm_pipelined_kernel<Pair, R>;
  ASTRAI_CUDA_TRY(allow_smem(kernel, S::kSmemBytes, smem_set));
  const dim3 grid(unsigned(ceil_div(p.n, R::kBN)), unsigned(ceil_div(p.m, R::kBM)), unsigned(p.batch * p.split_k));
  kernel<<<grid, R::kThreads, S::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

// ---- (2) recipes ---------------------------------------------------------------------------------------
// Recipe<BM, BN, WM, WN, max stages, min CTAs per SM, shared-memory budget KB>
using V0 = RecipeM128N128;                          // shipped recipe 0: 8 warps of 64x32, 3 stages, 2 CTAs/SM
using V1 = Recipe<128, 256, 64, 64, 4, 1, 227>;     // 8 warps of 64x64, 4 stages, 1 CTA/SM
using V2 = Recipe<256, 128, 64, 64, 4, 1, 227>;     // the same, M-wide
using V3 = Recipe<128, 256, 64, 32, 4, 1, 227>;     // 16 warps of 64x32, 4 stages, 1 CTA/SM
using V4 = Recipe<256, 128, 64, 32, 4, 1, 227>;     // 16 warps of 64x32, M-wide
using V5 = Recipe<128, 128, 64, 64, 3, 2, 113>;     // 4 warps of 64x64, 3 stages, 2 CTAs/SM
using V6 = Recipe<128, 128, 32, 64, 3, 2, 113>;     // 8 warps of 32x64, 2 CTAs/SM
using V7 = Recipe<128, 256, 64, 64, 3, 1, 227>;     // V1 with 3 stages
using V8 = Recipe<128, 128, 64, 32, 6, 1, 227>;     // recipe 0's tile, 6 stages, 1 CTA/SM
using V9 = Recipe<64, 128, 32, 32, 4, 3, 75>;       // 8 warps of 32x32, 3 CTAs/SM (24 warps)
using V10 = Recipe<128, 64, 32, 32, 4, 3, 75>;      // the same, M-wide
using V11 = Recipe<256, 128, 64, 64, 3, 1, 227>;    // V2 with 3 stages
using V12 = Recipe<128, 256, 64, 64, 2, 2, 113>;    // 64x64 warps, 2 stages, 2 CTAs/SM (96 KB each)

struct Variant {
  const char* name;
  std::function<cudaError_t(const GemmParams&, cudaStream_t)> w16, s8;
};

#define VARIANT(R) \
  Variant { #R, [](const GemmParams& p, cudaStream_t s) { return launch_recipe<PairBf16Bf16, R>(p, s); }, \
            [](const GemmParams& p, cudaStream_t s) { return launch_recipe<PairS8S8, R>(p, s); } }

#define PIPELINED(NAME, R) \
  Variant { NAME, [](const GemmParams& p, cudaStream_t s) { return launch_pipelined<PairBf16Bf16, R>(p, s); }, \
            [](const GemmParams& p, cudaStream_t s) { return launch_pipelined<PairS8S8, R>(p, s); } }

// P*: the register-pipelined mainloop (section 3) on the V recipe of the same number.
static std::vector<Variant> variants() {
  return {VARIANT(V0), VARIANT(V1), VARIANT(V5), VARIANT(V8), PIPELINED("P0", V0), PIPELINED("P1", V1),
          PIPELINED("P2", V2), PIPELINED("P5", V5), PIPELINED("P7", V7), PIPELINED("P8", V8)};
}

__global__ void fill_kernel(uint16_t* bf, int8_t* s8, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const float f = (float(h & 0xFFFF) / 32768.f) - 1.f;  // [-1, 1)
    uint32_t u;
    memcpy(&u, &f, 4);
    bf[i] = uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    s8[i] = int8_t(int(h >> 16) % 255 - 127);
  }
}

struct Problem {
  int m, n, k;
};

static GemmParams params_for(const Problem& pr, bool s8, const void* a, const void* b, void* out) {
  GemmParams p{};
  p.a = a;
  p.b = b;
  p.out = out;
  p.a_row_stride = pr.k;
  p.b_row_stride = pr.k;
  p.out_row_stride = pr.n;
  p.m = pr.m;
  p.n = pr.n;
  p.k = pr.k;
  p.batch = 1;
  p.split_k = 1;
  p.k_tiles_per_split = ceil_div(pr.k, s8 ? PairS8S8::kKTile : PairBf16Bf16::kKTile);
  p.out_dtype = s8 ? GemmOut::kS32 : GemmOut::kBf16;
  p.bias_dtype = GemmBias::kNone;
  p.layout = GemmLayout::kNT;
  return p;
}

static double time_ms(const std::function<cudaError_t(const GemmParams&, cudaStream_t)>& f, const GemmParams& p,
                      int reps) {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  CK(f(p, s));
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < reps; ++i) CK(f(p, s));
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / reps);
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(s));
  std::sort(ms.begin(), ms.end());
  return ms[3];
}

int main(int argc, char** argv) {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const auto vs = variants();
  const int64_t max_elems = int64_t(14336) * 4096;
  uint16_t *a16, *b16;
  int8_t *a8, *b8;
  void *out, *ref;
  CK(cudaMalloc(&a16, max_elems * 2));
  CK(cudaMalloc(&b16, max_elems * 2));
  CK(cudaMalloc(&a8, max_elems));
  CK(cudaMalloc(&b8, max_elems));
  CK(cudaMalloc(&out, int64_t(4096) * 14336 * 4));
  CK(cudaMalloc(&ref, int64_t(4096) * 14336 * 4));
  fill_kernel<<<1024, 256>>>(a16, a8, max_elems, 17u);
  fill_kernel<<<1024, 256>>>(b16, b8, max_elems, 99u);
  CK(cudaDeviceSynchronize());

  if (argc >= 3 && !strcmp(argv[1], "one")) {
    const int v = atoi(argv[2]);
    const bool s8 = argc >= 4 && !strcmp(argv[3], "s8");
    const Problem pr{4096, 4096, 4096};
    const GemmParams p = s8 ? params_for(pr, true, a8, b8, out) : params_for(pr, false, a16, b16, out);
    const auto& f = s8 ? vs[v].s8 : vs[v].w16;
    CK(f(p, 0));
    CK(f(p, 0));
    CK(cudaDeviceSynchronize());
    printf("ran %s %s once after a warm-up\n", vs[v].name, s8 ? "s8" : "bf16");
    return 0;
  }

  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  printf("device %s, %d SMs, clock %d MHz\n", prop.name, sms, clock_khz / 1000);
  if (argc >= 2 && !strcmp(argv[1], "peak")) {
  printf("\n== mma.sync ceiling (TFLOP/s or TOP/s), from registers ==\n");
  printf("%-28s %10s %10s\n", "config", "bf16", "s8");
  struct PeakCfg { int warps, blocks; };
  for (PeakCfg c : {PeakCfg{4, 1}, PeakCfg{8, 1}, PeakCfg{4, 4}, PeakCfg{8, 2}, PeakCfg{8, 4}}) {
    printf("warps/SM %2d, acc  4         %10.1f %10.1f\n", c.warps * c.blocks, mma_peak<4, false>(sms, c.warps, c.blocks),
           mma_peak<4, true>(sms, c.warps, c.blocks));
    printf("warps/SM %2d, acc  8         %10.1f %10.1f\n", c.warps * c.blocks, mma_peak<8, false>(sms, c.warps, c.blocks),
           mma_peak<8, true>(sms, c.warps, c.blocks));
    printf("warps/SM %2d, acc 16         %10.1f %10.1f\n", c.warps * c.blocks,
           mma_peak<16, false>(sms, c.warps, c.blocks), mma_peak<16, true>(sms, c.warps, c.blocks));
    printf("warps/SM %2d, acc 32         %10.1f %10.1f\n", c.warps * c.blocks,
           mma_peak<32, false>(sms, c.warps, c.blocks), mma_peak<32, true>(sms, c.warps, c.blocks));
  }

  }

  const std::vector<Problem> probs = {{4096, 4096, 4096}, {4096, 14336, 4096}, {4096, 4096, 14336},
                                      {1024, 4096, 4096}, {1024, 14336, 4096}, {4096, 2112, 7168}};
  for (int s8 = 0; s8 < 2; ++s8) {
    printf("\n== gemm_sm80_kernel %s, TFLOP/s (bitwise vs V0) ==\n", s8 ? "s8 x s8 -> s32" : "bf16 x bf16 -> bf16");
    printf("%-6s", "var");
    for (auto& pr : probs) printf("  %5dx%5dx%5d", pr.m, pr.n, pr.k);
    printf("\n");
    for (size_t v = 0; v < vs.size(); ++v) {
      printf("%-6s", vs[v].name);
      for (auto& pr : probs) {
        const GemmParams p = s8 ? params_for(pr, true, a8, b8, out) : params_for(pr, false, a16, b16, out);
        GemmParams pref = p;
        pref.out = ref;
        const auto& f = s8 ? vs[v].s8 : vs[v].w16;
        const size_t bytes = size_t(pr.m) * pr.n * (s8 ? 4 : 2);
        CK(cudaMemset(out, 0xFF, bytes));
        cudaError_t e = f(p, 0);
        if (e != cudaSuccess) {
          printf("  %17s", cudaGetErrorString(e));
          cudaGetLastError();
          continue;
        }
        CK((s8 ? vs[0].s8 : vs[0].w16)(pref, 0));
        CK(cudaDeviceSynchronize());
        std::vector<uint8_t> h1(bytes), h2(bytes);
        CK(cudaMemcpy(h1.data(), out, bytes, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h2.data(), ref, bytes, cudaMemcpyDeviceToHost));
        const bool same = memcmp(h1.data(), h2.data(), bytes) == 0;
        const double ms = time_ms(f, p, 10);
        printf("  %8.1f %s     ", 2.0 * pr.m * pr.n * pr.k / (ms * 1e-3) / 1e12, same ? "==" : "!=");
      }
      printf("\n");
      fflush(stdout);
    }
  }
  return 0;
}
