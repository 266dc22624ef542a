// Developer probe of the portable GEMM mainloop on the GPU in hand: (1) the mma.sync ceiling (bf16 m16n8k16 and
// s8 m16n8k32 from registers, by warps per SM and independent accumulators per warp); (2) gemm_sm80_kernel under
// tile recipes that the library does not ship (CTA and warp tiles, stages, resident CTAs), w16a16 and w8a8 at
// prefill sizes, each checked bitwise against the shipped recipe 0 (the K order does not depend on the recipe).
// A register-pipelined form of the mainloop was probed here too and dropped (slower than recipe 0, H100, thirty-second
// session; its variants are in this file at commit 1cc4e1e). Not built by CMake; on a GPU:
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

static std::vector<Variant> variants() {
  return {VARIANT(V0), VARIANT(V1), VARIANT(V2), VARIANT(V3), VARIANT(V4), VARIANT(V5), VARIANT(V6),
          VARIANT(V7), VARIANT(V8), VARIANT(V9), VARIANT(V10), VARIANT(V11), VARIANT(V12)};
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
