// Developer sweep of split-KV decode plans (GQA 32 q / 8 kv heads, D = 128, bf16): for each shape, block tile and
// split count (one wave at 1, 2 or 4 blocks per SM), the decode kernel timed with
//   combine       the combine kernel after it,
//   combine_pdl   the combine as a programmatic dependent launch,
//   none          no merge at all (partials only: the floor a merge adds to),
// CUDA-graph timed (median of replays, inputs rotated past the L2). The decode_split_kv tiles and split counts
// of the production plan (DecodeDefaultTile, attention_launch.cu) come from it (docs/benchmarks.md, decode section).
// Not built by CMake; on a GPU:
//   nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Icsrc -o decode_merge_sweep csrc/tools/decode_merge_sweep.cu
//   ./decode_merge_sweep [--paged] [BxL ...]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/attention/attention.h"
#include "kernels/attention/bf16_decode_combine.cuh"
#include "kernels/attention/decode_launch.cuh"

using namespace astrai;
using namespace astrai::attention;

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      std::printf("CUDA %s at line %d: %s\n", cudaGetErrorString(e_), __LINE__, #x); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

constexpr int kHq = 32, kHkv = 8, kD = 128, kPage = 16;

__global__ void fill_bf16(uint16_t* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    const float f = (float(h & 0xffffu) / 65535.f) * 2.f - 1.f;  // [-1, 1]
    x[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}

struct Set {
  void *q, *k, *v, *out;
  float *po, *plse;
  int32_t *lens, *table;
};

float time_graph(const std::function<void(const Set&, cudaStream_t)>& f, const std::vector<Set>& sets, int calls,
                 int replays) {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int c = 0; c < calls; ++c) f(sets[c % sets.size()], st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int w = 0; w < 2; ++w) CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < replays; ++r) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f / calls);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
  return t[t.size() / 2];
}

DecodeParams params_of(const Set& s, int batch, int len, bool paged, int splits) {
  DecodeParams p{};
  p.q_ptr = s.q; p.k_ptr = s.k; p.v_ptr = s.v; p.out_ptr = s.out;
  p.partial_o_ptr = splits > 1 ? s.po : nullptr;
  p.partial_lse_ptr = splits > 1 ? s.plse : nullptr;
  p.q_batch_stride = kHq * kD; p.q_head_stride = kD;
  if (paged) {
    p.k_batch_stride = p.v_batch_stride = int64_t(kPage) * kHkv * kD;
    p.kv_lens_ptr = s.lens; p.page_table_ptr = s.table;
    p.page_table_batch_stride = len / kPage; p.num_pages = batch * (len / kPage); p.page_size_log2 = 4;
  } else {
    p.k_batch_stride = p.v_batch_stride = int64_t(len) * kHkv * kD;
  }
  p.k_seq_stride = p.v_seq_stride = kHkv * kD;
  p.k_head_stride = p.v_head_stride = kD;
  p.out_batch_stride = kHq * kD; p.out_head_stride = kD;
  p.batch = batch; p.num_q_heads = kHq; p.num_kv_heads = kHkv; p.head_dim = kD; p.max_kv_len = len;
  p.num_splits = splits;
  p.split_len = ((len + splits - 1) / splits + kDecodeSplitAlign - 1) / kDecodeSplitAlign * kDecodeSplitAlign;
  p.num_splits = (len + p.split_len - 1) / p.split_len;
  p.scale_log2 = float(1.4426950408889634 / std::sqrt(double(kD)));
  p.paged = paged;
  return p;
}

enum Mode { kCombine, kCombinePdl, kNone, kModes };
const char* kModeNames[kModes] = {"combine", "combine_pdl", "none"};

template <class Tile>
void run(const Set& s, int batch, int len, bool paged, int splits, Mode mode, cudaStream_t st) {
  DecodeParams p = params_of(s, batch, len, paged, splits);
  CK((launch_decode_tile<kD, Tile>(p, st)));
  if (p.num_splits > 1 && (mode == kCombine || mode == kCombinePdl)) CK(launch_decode_combine(p, st, mode == kCombinePdl));
}

struct Config {
  const char* tile;
  int per_sm;  // blocks per SM of the wave the split count fills
  void (*fn)(const Set&, int, int, bool, int, Mode, cudaStream_t);
};

int main(int argc, char** argv) {
  bool paged = false;
  std::vector<std::pair<int, int>> shapes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--paged")) { paged = true; continue; }
    int b, l;
    if (std::sscanf(argv[i], "%dx%d", &b, &l) == 2) shapes.push_back({b, l});
  }
  if (shapes.empty()) shapes = {{1, 512}, {1, 4096}, {1, 16384}, {1, 32768}, {4, 4096}, {8, 2048}, {16, 1024}, {16, 4096}, {16, 16384}, {32, 4096}, {64, 4096}};
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int l2 = 0;
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  const std::vector<Config> configs = {
      {"2w16k3s", 2, run<DecodeTile<2, 16, 3>>}, {"2w16k3s", 4, run<DecodeTile<2, 16, 3>>},
      {"4w16k3s", 1, run<DecodeTile<4, 16, 3>>}, {"6w16k3s", 1, run<DecodeTile<6, 16, 3>>},
      {"8w16k2s", 1, run<DecodeTile<8, 16, 2>>}, {"8w16k2s", 2, run<DecodeTile<8, 16, 2>>},
      {"4w32k3s", 1, run<DecodeTile<4, 32, 3>>},
  };
  std::printf("%s K/V, GQA %d/%d, D %d, %d SMs; us per call\n", paged ? "paged (page 16)" : "contiguous", kHq, kHkv,
              kD, sms);
  for (const auto& shape : shapes) {
    const int batch = shape.first, len = shape.second;
    const int64_t kv_elems = int64_t(batch) * len * kHkv * kD;
    const int n_sets = int(std::max<int64_t>(1, std::min<int64_t>(8, (3 * int64_t(l2) + 4 * kv_elems - 1) / (4 * kv_elems))));
    const int max_splits = kDecodeMaxSplits;
    std::vector<Set> sets(n_sets);
    std::mt19937 rng(1234);
    for (int i = 0; i < n_sets; ++i) {
      Set& s = sets[i];
      CK(cudaMalloc(&s.q, size_t(batch) * kHq * kD * 2));
      CK(cudaMalloc(&s.k, size_t(kv_elems) * 2));
      CK(cudaMalloc(&s.v, size_t(kv_elems) * 2));
      CK(cudaMalloc(&s.out, size_t(batch) * kHq * kD * 2));
      CK(cudaMalloc(&s.po, size_t(std::min(max_splits, 4 * sms)) * batch * kHq * kD * 4));
      CK(cudaMalloc(&s.plse, size_t(std::min(max_splits, 4 * sms)) * batch * kHq * 4));
      fill_bf16<<<1024, 256>>>(static_cast<uint16_t*>(s.q), int64_t(batch) * kHq * kD, 11u + i);
      fill_bf16<<<1024, 256>>>(static_cast<uint16_t*>(s.k), kv_elems, 22u + i);
      fill_bf16<<<1024, 256>>>(static_cast<uint16_t*>(s.v), kv_elems, 33u + i);
      std::vector<int32_t> lens(batch, len), table(size_t(batch) * (len / kPage));
      for (size_t j = 0; j < table.size(); ++j) table[j] = int32_t(j);
      std::shuffle(table.begin(), table.end(), rng);
      CK(cudaMalloc(&s.lens, batch * 4));
      CK(cudaMalloc(&s.table, table.size() * 4));
      CK(cudaMemcpy(s.lens, lens.data(), batch * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(s.table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaDeviceSynchronize());
    const int calls = n_sets * std::max(1, (24 + n_sets - 1) / n_sets);
    std::printf("\nB=%d L=%d (%d input sets)\n%-8s %6s %6s", batch, len, n_sets, "tile", "per_sm", "splits");
    for (int m = 0; m < kModes; ++m) std::printf(" %12s", kModeNames[m]);
    std::printf("\n");
    for (const Config& c : configs) {
      const int64_t blocks = int64_t(batch) * kHkv;
      const int want = int(std::max<int64_t>(1, std::min<int64_t>(int64_t(sms) * c.per_sm / blocks, (len + 63) / 64)));
      const int splits = params_of(sets[0], batch, len, paged, want).num_splits;
      std::printf("%-8s %6d %6d", c.tile, c.per_sm, splits);
      for (int m = 0; m < kModes; ++m) {
        const float us = time_graph([&](const Set& s, cudaStream_t st) { c.fn(s, batch, len, paged, splits, Mode(m), st); },
                                    sets, calls, 15);
        std::printf(" %12.2f", us);
      }
      std::printf("\n");
    }
    for (Set& s : sets) {
      for (void* ptr : {s.q, s.k, s.v, s.out, static_cast<void*>(s.po), static_cast<void*>(s.plse),
                        static_cast<void*>(s.lens), static_cast<void*>(s.table)}) {
        CK(cudaFree(ptr));
      }
    }
  }
  return 0;
}
