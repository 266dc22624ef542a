// Developer timeline of the sm_90a prefill kernel (bf16_prefill_sm90.cuh, head_dim 128): where a work item's cycles
// go. The tool's own kernel runs the production body (prefill_bf16_sm90) with TraceHooks, which stamp clock64 at its
// timeline points (PrefillSm90Point) for the first 64 work items per block; this driver launches dense contiguous
// GQA 32/8 calls, times the production kernel (CUDA events, median of 20) and the traced one once, and prints
// per-item phase means for each consumer warpgroup, the first tiles' cycles by whether they took the masked path,
// and the spread of the blocks' busy spans (the schedule's tail). Clocks are SM cycles; the stamps cost a little.
// Not built by CMake; on an sm_90a GPU:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//        -o /tmp/prefill_trace csrc/tools/prefill_sm90_trace.cu
//   /tmp/prefill_trace [BxLc ...]     (e.g. 8x2048c 1x8192: B x L, a trailing c for causal)
#include "kernels/attention/prefill_bf16_hd128_sm90.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace astrai;
using namespace astrai::attention;

namespace prefill_trace {

// The trace buffer: stamps [block][item n < kItems][role][slot]. Roles: 0 the producer's thread 0, 1 + c consumer
// c's first thread, 3 consumer 0's per-tile stamps (slot j: tile j < 8 done).
struct Trace {
  static constexpr int kItems = 64, kRoles = 4, kSlots = 8;
  // role 0
  static constexpr int kProdItem = 0, kProdQ = 1, kProdIssued = 2, kMaskBits = 6, kTiles = 7;
  // roles 1, 2
  static constexpr int kItem = 0, kQReady = 1, kFirstS = 2, kLoopEnd = 3, kLastPV = 4, kStored = 5, kK0Ready = 6,
                       kTurn0 = 7;
};
using Tr = Trace;

__device__ unsigned long long* g_trace;  // null: no stamps

__device__ __forceinline__ void record(int role, int item, int slot, unsigned long long value) {
  if (g_trace != nullptr && item < Tr::kItems) {
    g_trace[((int64_t(blockIdx.x) * Tr::kItems + item) * Tr::kRoles + role) * Tr::kSlots + slot] = value;
  }
}

// The kernel's hooks policy (PrefillSm90NoHooks's members): the first thread of each warpgroup stamps its points.
struct TraceHooks {
  unsigned long long masked_tiles = 0;  // consumer: bit j, tile j of the current item took the mask

  __device__ __forceinline__ void at(PrefillSm90Point point, int item) {
    const int tid = threadIdx.x;
    if ((tid & 127) != 0) return;
    const int role = tid >> 7;
    int slot = 0;
    switch (point) {
      case PrefillSm90Point::kProducerItem: slot = Tr::kProdItem; break;
      case PrefillSm90Point::kProducerQ: slot = Tr::kProdQ; break;
      case PrefillSm90Point::kProducerIssued: slot = Tr::kProdIssued; break;
      case PrefillSm90Point::kItem: slot = Tr::kItem; masked_tiles = 0; break;
      case PrefillSm90Point::kQReady: slot = Tr::kQReady; break;
      case PrefillSm90Point::kK0Ready: slot = Tr::kK0Ready; break;
      case PrefillSm90Point::kTurn0: slot = Tr::kTurn0; break;
      case PrefillSm90Point::kFirstS: slot = Tr::kFirstS; break;
      case PrefillSm90Point::kLoopEnd: slot = Tr::kLoopEnd; break;
      case PrefillSm90Point::kLastPV: slot = Tr::kLastPV; break;
      case PrefillSm90Point::kStored: slot = Tr::kStored; break;
    }
    record(role, item, slot, clock64());
    if (point == PrefillSm90Point::kLoopEnd && tid == 128) record(0, item, Tr::kMaskBits, masked_tiles);
  }
  __device__ __forceinline__ void tiles(int item, int n_tiles) {
    if (threadIdx.x == 0) record(0, item, Tr::kTiles, (unsigned long long)n_tiles);
  }
  __device__ __forceinline__ void tile_done(int item, int j, bool masked) {
    if (threadIdx.x != 128) return;
    if (masked && j < 64) masked_tiles |= 1ull << j;
    if (j < Tr::kSlots) record(3, item, j, clock64());
  }
};

// The production kernel's body with TraceHooks (same launch bounds and shared memory).
template <bool kRaggedQ, bool kPaged>
__global__ void __launch_bounds__(PrefillSm90Traits::kThreads, 1)
    traced_kernel(const __grid_constant__ PrefillParams p, const __grid_constant__ PrefillSm90KvMaps maps) {
#if ASTRAI_WGMMA
  TraceHooks hooks;
  prefill_bf16_sm90<kRaggedQ, kPaged>(p, maps, hooks);
#else
  (void)p;
#endif
}

// One traced call of the dense contiguous variant: a block per SM (blocks past the items exit at their first).
cudaError_t launch_traced(const PrefillParams& p, int sms) {
  using K = PrefillSm90Traits;
  const cudaError_t e = cudaFuncSetAttribute(traced_kernel<false, false>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, K::kSmemBytes);
  if (e != cudaSuccess) return e;
  if (p.sched_counter_ptr != nullptr) cudaMemset(p.sched_counter_ptr, 0, sizeof(int32_t));
  traced_kernel<false, false><<<unsigned(sms), K::kThreads, K::kSmemBytes>>>(p, kv_maps(p, true));
  return cudaGetLastError();
}

}  // namespace prefill_trace

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("CUDA %s at line %d: %s\n", cudaGetErrorString(e_), __LINE__, #x); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

namespace prefill_trace {

constexpr int kHq = 32, kHkv = 8, kD = 128;

__global__ void fill_bf16(uint16_t* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = uint16_t(__float_as_uint((float(h & 0xffffu) / 65535.f) * 2.f - 1.f) >> 16);
  }
}

int trace_shape(int batch, int len, bool causal, int sms) {
  const int64_t q_elems = int64_t(batch) * len * kHq * kD, kv_elems = int64_t(batch) * len * kHkv * kD;
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  int32_t* counter = nullptr;
  unsigned long long* trace = nullptr;
  const size_t trace_words = size_t(sms) * Tr::kItems * Tr::kRoles * Tr::kSlots;
  CK(cudaMalloc(&q, q_elems * 2));
  CK(cudaMalloc(&k, kv_elems * 2));
  CK(cudaMalloc(&v, kv_elems * 2));
  CK(cudaMalloc(&o, q_elems * 2));
  CK(cudaMalloc(&counter, 4));
  CK(cudaMalloc(&trace, trace_words * 8));
  fill_bf16<<<1024, 256>>>(q, q_elems, 1u);
  fill_bf16<<<1024, 256>>>(k, kv_elems, 2u);
  fill_bf16<<<1024, 256>>>(v, kv_elems, 3u);

  PrefillParams p{};
  p.q_ptr = q;
  p.k_ptr = k;
  p.v_ptr = v;
  p.out_ptr = o;
  p.q_batch_stride = p.out_batch_stride = int64_t(len) * kHq * kD;
  p.q_seq_stride = p.out_seq_stride = int64_t(kHq) * kD;
  p.q_head_stride = p.out_head_stride = kD;
  p.k_seq_stride = p.v_seq_stride = int64_t(kHkv) * kD;
  p.k_head_stride = p.v_head_stride = kD;
  p.k_batch_stride = p.v_batch_stride = int64_t(len) * kHkv * kD;
  p.batch = batch;
  p.num_q_heads = kHq;
  p.num_kv_heads = kHkv;
  p.head_dim = kD;
  p.q_len = len;
  p.max_kv_len = len;
  p.scale_log2 = float(1.0 / std::sqrt(double(kD)) * 1.4426950408889634);
  p.is_causal = causal;
  p.num_q_tiles = batch * ((len + 31) / 32);  // GQA 4: 32 sequence rows per 128-row Q tile
  p.sched_counter_ptr = counter;

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < 23; ++r) {
    CK(cudaEventRecord(e0));
    CK(launch_prefill_sm90(p, true, sms, nullptr));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0.f;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (r >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double sec = ms[ms.size() / 2] * 1e-3;
  const double pairs = causal ? double(len) * (len + 1) / 2 : double(len) * len;
  std::printf("\nB=%d L=%d %s: untraced %.1f us, %.1f TFLOP/s\n", batch, len, causal ? "causal" : "full", sec * 1e6,
              4.0 * batch * kHq * kD * pairs / sec * 1e-12);

  CK(cudaMemset(trace, 0, trace_words * 8));
  CK(cudaMemcpyToSymbol(g_trace, &trace, sizeof(trace)));
  CK(launch_traced(p, sms));
  CK(cudaDeviceSynchronize());
  std::vector<unsigned long long> h(trace_words);
  CK(cudaMemcpy(h.data(), trace, trace_words * 8, cudaMemcpyDeviceToHost));
  auto at = [&](int block, int n, int role, int slot) -> long long {
    return static_cast<long long>(h[((size_t(block) * Tr::kItems + n) * Tr::kRoles + role) * Tr::kSlots + slot]);
  };

  // Per item and consumer: phases between consecutive stamps (the loop per tile after the first).
  const char* names[] = {"previous item stored -> item read", "item read -> Q landed", "Q landed -> K_0 landed",
                         "K_0 landed -> tensor-core turn", "turn -> S_0 done", "loop, per tile after the first",
                         "loop end -> last P V done", "last P V -> O stored", "item, read to stored"};
  double sum[2][9] = {}, count[2] = {}, tiles = 0;
  double q_issue_to_landed = 0, q_count = 0;  // producer's Q copies start (after q_empty) -> consumer 0 sees Q
  double tile_sum[8][2] = {}, tile_count[8][2] = {};
  long long span_min = -1, span_max = 0;
  for (int block = 0; block < sms; ++block) {
    long long first = 0, last = 0;
    for (int n = 0; n < Tr::kItems; ++n) {
      if (at(block, n, 1, Tr::kItem) == 0) break;
      const long long nt = at(block, n, 0, Tr::kTiles);
      if (nt <= 0) continue;
      tiles += double(nt);
      for (int c = 0; c < 2; ++c) {
        const int role = 1 + c;
        if (at(block, n, role, Tr::kStored) == 0) continue;
        const long long prev = n > 0 && at(block, n - 1, role, Tr::kStored) != 0 ? at(block, n - 1, role, Tr::kStored)
                                                                                 : at(block, n, role, Tr::kItem);
        const double d[9] = {
            double(at(block, n, role, Tr::kItem) - prev),
            double(at(block, n, role, Tr::kQReady) - at(block, n, role, Tr::kItem)),
            double(at(block, n, role, Tr::kK0Ready) - at(block, n, role, Tr::kQReady)),
            double(at(block, n, role, Tr::kTurn0) - at(block, n, role, Tr::kK0Ready)),
            double(at(block, n, role, Tr::kFirstS) - at(block, n, role, Tr::kTurn0)),
            double(at(block, n, role, Tr::kLoopEnd) - at(block, n, role, Tr::kFirstS)) / double(std::max(1LL, nt - 1)),
            double(at(block, n, role, Tr::kLastPV) - at(block, n, role, Tr::kLoopEnd)),
            double(at(block, n, role, Tr::kStored) - at(block, n, role, Tr::kLastPV)),
            double(at(block, n, role, Tr::kStored) - at(block, n, role, Tr::kItem))};
        for (int i = 0; i < 9; ++i) sum[c][i] += d[i];
        count[c] += 1;
        if (c == 0) {
          if (first == 0) first = at(block, n, role, Tr::kItem);
          last = at(block, n, role, Tr::kStored);
        }
      }
      if (n > 0 && at(block, n, 0, Tr::kProdQ) != 0 && at(block, n, 1, Tr::kQReady) != 0) {
        q_issue_to_landed += double(at(block, n, 1, Tr::kQReady) - at(block, n, 0, Tr::kProdQ));
        q_count += 1;
      }
      const unsigned long long masked = static_cast<unsigned long long>(at(block, n, 0, Tr::kMaskBits));
      for (int j = 1; j < Tr::kSlots && j < nt; ++j) {
        const int m = int((masked >> j) & 1u);
        tile_sum[j][m] += double(at(block, n, 3, j) - at(block, n, 3, j - 1));
        tile_count[j][m] += 1;
      }
    }
    if (first != 0) {
      span_min = span_min < 0 ? last - first : std::min(span_min, last - first);
      span_max = std::max(span_max, last - first);
    }
  }
  if (count[0] == 0 || count[1] == 0) {
    std::printf("no traced item\n");
    return 1;
  }
  std::printf("items traced %.0f (the first %d per block), mean tiles per item %.2f; blocks' busy spans %lld .. %lld "
              "cycles\n", count[0], Tr::kItems, tiles / count[0], span_min, span_max);
  std::printf("%-36s %10s %10s   (cycles, mean per item)\n", "phase", "consumer 0", "consumer 1");
  for (int i = 0; i < 9; ++i) {
    std::printf("%-36s %10.0f %10.0f\n", names[i], sum[0][i] / count[0], sum[1][i] / count[1]);
  }
  std::printf("%-36s %10.0f   (producer's Q copies start -> consumer 0 sees Q, items after the first)\n",
              "Q copied -> Q landed", q_count > 0 ? q_issue_to_landed / q_count : 0.0);
  std::printf("%-36s", "tile j of consumer 0:");
  for (int j = 1; j < Tr::kSlots; ++j) std::printf(" %6d", j);
  for (int m = 0; m < 2; ++m) {
    std::printf("\n  %-34s", m ? "masked tiles, cycles (count)" : "unmasked tiles, cycles (count)");
    for (int j = 1; j < Tr::kSlots; ++j) {
      if (tile_count[j][m] > 0) {
        std::printf(" %6.0f", tile_sum[j][m] / tile_count[j][m]);
      } else {
        std::printf(" %6s", "-");
      }
    }
    std::printf("  (%.0f)", tile_count[1][m]);
  }
  std::printf("\n");
  for (void* ptr : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
                    static_cast<void*>(counter), static_cast<void*>(trace)}) {
    CK(cudaFree(ptr));
  }
  return 0;
}

}  // namespace prefill_trace

int main(int argc, char** argv) {
  cudaDeviceProp prop{};
  cudaFuncAttributes attr{};
  const bool sm90a = cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0 &&
                     cudaFuncGetAttributes(&attr, prefill_bf16_sm90_kernel<false, false>) == cudaSuccess &&
                     attr.binaryVersion == 90;
  const int sms = sm90a ? prop.multiProcessorCount : 0;
  if (sms <= 0) {
    std::printf("this device does not run the sm_90a prefill kernel (compute capability 9.0 with sm_90a code)\n");
    return 1;
  }
  std::vector<std::string> shapes;
  for (int i = 1; i < argc; ++i) shapes.push_back(argv[i]);
  if (shapes.empty()) shapes = {"8x2048c", "1x2048", "8x2048", "1x8192", "1x2048c"};
  int status = 0;
  for (const std::string& shape : shapes) {
    int batch = 0, len = 0;
    char tail = 0;
    const int got = std::sscanf(shape.c_str(), "%dx%d%c", &batch, &len, &tail);
    if (got < 2 || batch < 1 || len < 1 || (got == 3 && tail != 'c')) {
      std::printf("shape %s: expected BxL or BxLc\n", shape.c_str());
      return 2;
    }
    status |= prefill_trace::trace_shape(batch, len, got == 3, sms);
  }
  return status;
}
