// Developer sweep of quantize launch shapes (bf16 -> e4m3 at 4096x4096 and 65536x4096): each variant of the row
// kernels (threads per row, cached steps, register cap) and of the register transpose (rows per thread, lanes per
// row, warps, register cap, tile order) CUDA-graph timed beside copy kernels of the same bytes, inputs rotated past
// the L2; the variants' outputs are compared bitwise with the production choice. Not built by CMake; on a GPU:
//   nvcc -arch=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Icsrc -o quantize_launch_sweep csrc/tools/quantize_launch_sweep.cu
//   ./quantize_launch_sweep
// The launch choices of quantize_rows.cuh, quantize_rows_launch.cu and quantize_transpose.cuh come from it.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <functional>
#include <string>
#include <cuda_runtime.h>
#include "kernels/quantize/quantize_rows.cuh"
#include "kernels/quantize/quantize_transpose.cuh"

using namespace astrai;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

struct Set { void* x; void* out; void* out_t; float* sinv; void* csrc; void* cdst; };

__global__ void copy_vec(const uint4* __restrict__ s, uint4* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) d[i] = s[i];
}
template <int kU>
__global__ void copy_unroll(const uint4* __restrict__ s, uint4* __restrict__ d, int64_t n) {
  int64_t base = (blockIdx.x * int64_t(blockDim.x)) * kU + threadIdx.x;
  uint4 v[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) if (base + u * blockDim.x < n) v[u] = s[base + u * blockDim.x];
#pragma unroll
  for (int u = 0; u < kU; ++u) if (base + u * blockDim.x < n) d[base + u * blockDim.x] = v[u];
}

static int sms = 0;
float time_graph(std::function<void(const Set&, cudaStream_t)> f, std::vector<Set>& sets, int calls, int replays) {
  cudaStream_t st; CK(cudaStreamCreate(&st));
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int c = 0; c < calls; ++c) f(sets[c % sets.size()], st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < replays; ++r) {
    CK(cudaEventRecord(a, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(b, st)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms * 1000.f / calls);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g)); CK(cudaStreamDestroy(st));
  return t[t.size() / 2];
}

QuantizeParams base(const Set& s, int64_t m, int64_t n) {
  QuantizeParams p{};
  p.x_ptr = s.x; p.out_ptr = s.out; p.out_t_ptr = nullptr; p.scale_inv_ptr = s.sinv;
  p.x_row_stride = n; p.rows = m; p.cols = n; p.qmax = 448.f; p.group_cols = 128;
  p.in_type = QuantIn::kBF16; p.out_type = QuantOut::kE4M3; p.amax_kind = QuantAmax::kNone;
  return p;
}

template <int kMinB, int kCache>
void dyn_rows(const Set& s, int64_t m, int64_t n, int tpr, cudaStream_t st) {
  QuantizeParams p = base(s, m, n); p.scale_kind = QuantScale::kDynamicRow;
  const int rpb = 256 / tpr;
  int64_t grid = (m + rpb - 1) / rpb;
  quantize::quantize_rows_kernel<QuantIn::kBF16, QuantOut::kE4M3, true, quantize::RowsMode::kDynamicRow, kMinB, false, kCache>
      <<<dim3(unsigned(grid)), dim3(tpr, rpb), 0, st>>>(p);
}
static float* g_scale;
void static_rows(const Set& s, int64_t m, int64_t n, int tpr, cudaStream_t st) {
  QuantizeParams p = base(s, m, n); p.scale_kind = QuantScale::kTensor; p.scale_ptr = g_scale; p.scale_inv_ptr = nullptr;
  const int rpb = 256 / tpr;
  int64_t grid = std::min<int64_t>((m + rpb - 1) / rpb, int64_t(sms) * 8 * 16);
  quantize::quantize_rows_kernel<QuantIn::kBF16, QuantOut::kE4M3, true, quantize::RowsMode::kStatic>
      <<<dim3(unsigned(grid)), dim3(tpr, rpb), 0, st>>>(p);
}
template <int kR, bool kTm, int kWarps = 4, int kMinB = astrai::quantize::reg_min_blocks<QuantIn::kBF16, kR>(), int kL = 2>
void regs_t(const Set& s, int64_t m, int64_t n, int grid_cap, cudaStream_t st) {
  QuantizeParams p = base(s, m, n); p.out_ptr = nullptr; p.out_t_ptr = s.out_t; p.scale_kind = QuantScale::kTensor;
  p.scale_ptr = g_scale; p.scale_inv_ptr = nullptr;
  const int tm_rows = (32 / kL) * kR, tn_cols = kWarps * 8 * kL;
  int64_t tiles = ((m + tm_rows - 1) / tm_rows) * ((n + tn_cols - 1) / tn_cols);
  int64_t grid = grid_cap > 0 ? std::min<int64_t>(tiles, grid_cap) : tiles;
  quantize::quantize_transpose_regs_kernel<QuantIn::kBF16, QuantOut::kE4M3, true, kR, kTm, kWarps, kMinB, kL><<<dim3(unsigned(grid)), 32 * kWarps, 0, st>>>(p);
}

int main(int argc, char** argv) {
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaMalloc(&g_scale, 4)); float one = 0.5f; CK(cudaMemcpy(g_scale, &one, 4, cudaMemcpyHostToDevice));
  int64_t shapes[2][2] = {{4096, 4096}, {65536, 4096}};
  for (auto& sh : shapes) {
    const int64_t m = sh[0], n = sh[1];
    const int64_t xb = m * n * 2, ob = m * n;
    const int64_t cb = (xb + ob) / 2;  // copy: half read, half written
    const int nsets = std::max<int64_t>(1, (int64_t(200) << 20) / (xb + 2 * ob + 2 * cb) + 1);
    std::vector<Set> sets(nsets);
    for (auto& s : sets) {
      CK(cudaMalloc(&s.x, xb)); CK(cudaMalloc(&s.out, ob)); CK(cudaMalloc(&s.out_t, ob)); CK(cudaMalloc(&s.sinv, m * 4 + 4096));
      CK(cudaMalloc(&s.csrc, cb)); CK(cudaMalloc(&s.cdst, cb));
      // random bf16 (finite): low 15 bits random, exponent limited
      std::vector<uint16_t> h(m * n);
      uint32_t r = 12345;
      for (auto& v : h) { r = r * 1664525u + 1013904223u; v = uint16_t(((r >> 8) & 0x3fff) ^ ((r >> 24) & 0x8000) | 0x3000); }
      CK(cudaMemcpy(s.x, h.data(), xb, cudaMemcpyHostToDevice));
      CK(cudaMemset(s.csrc, 1, cb));
    }
    const int calls = m == 4096 ? 64 : 16, replays = 20;
    auto run = [&](const char* name, std::function<void(const Set&, cudaStream_t)> f, double bytes) {
      float us = time_graph(f, sets, calls, replays);
      printf("%5ldx%ld %-34s %8.2f us %6.2f TB/s\n", m, n, name, us, bytes / us / 1e6);
      return us;
    };
    const double kb = double(xb + ob + (m * 4));
    float c1 = run("copy torch-like (copy_vec grid-stride)", [&](const Set& s, cudaStream_t st) {
      int64_t nv = cb / 16; copy_vec<<<std::min<int64_t>((nv + 255) / 256, sms * 8 * 16), 256, 0, st>>>((const uint4*)s.csrc, (uint4*)s.cdst, nv); }, 2.0 * cb);
    run("copy unroll4 128thr", [&](const Set& s, cudaStream_t st) {
      int64_t nv = cb / 16; copy_unroll<4><<<(nv + 511) / 512, 128, 0, st>>>((const uint4*)s.csrc, (uint4*)s.cdst, nv); }, 2.0 * cb);
    run("cudaMemcpyAsync", [&](const Set& s, cudaStream_t st) { CK(cudaMemcpyAsync(s.cdst, s.csrc, cb, cudaMemcpyDeviceToDevice, st)); }, 2.0 * cb);
    for (int tpr : {32, 64, 128, 256})
      run((std::string("static tpr ") + std::to_string(tpr)).c_str(), [&](const Set& s, cudaStream_t st) { static_rows(s, m, n, tpr, st); }, kb);
    run("dyn tpr32 c8 b2 (former default)", [&](const Set& s, cudaStream_t st) { dyn_rows<2, 8>(s, m, n, 32, st); }, kb);
    run("dyn tpr64 c4 b4 (production)", [&](const Set& s, cudaStream_t st) { dyn_rows<4, 4>(s, m, n, 64, st); }, kb);
    run("dyn tpr128 c2 b4", [&](const Set& s, cudaStream_t st) { dyn_rows<4, 2>(s, m, n, 128, st); }, kb);
    const double tb = double(xb + ob);
    run("T r16 L2 (former default)", [&](const Set& s, cudaStream_t st) { regs_t<16, false>(s, m, n, 0, st); }, tb);
    run("T r8 L2", [&](const Set& s, cudaStream_t st) { regs_t<8, false>(s, m, n, 0, st); }, tb);
    run("T r16 L4", [&](const Set& s, cudaStream_t st) { regs_t<16, false, 4, 4, 4>(s, m, n, 0, st); }, tb);
    run("T r16 L8 (production, large grids)", [&](const Set& s, cudaStream_t st) { regs_t<16, false, 4, 4, 8>(s, m, n, 0, st); }, tb);
    run("T r8 L4", [&](const Set& s, cudaStream_t st) { regs_t<8, false, 4, 6, 4>(s, m, n, 0, st); }, tb);
    run("T r8 L8 (production, small grids)", [&](const Set& s, cudaStream_t st) { regs_t<8, false, 4, 6, 8>(s, m, n, 0, st); }, tb);
    run("T r16 L4 w2 b8", [&](const Set& s, cudaStream_t st) { regs_t<16, false, 2, 8, 4>(s, m, n, 0, st); }, tb);
    run("T r16 L4 tm", [&](const Set& s, cudaStream_t st) { regs_t<16, true, 4, 4, 4>(s, m, n, 0, st); }, tb);
    run("T r16 L8 tm", [&](const Set& s, cudaStream_t st) { regs_t<16, true, 4, 4, 8>(s, m, n, 0, st); }, tb);
    run("T r8 L8 w8 b3", [&](const Set& s, cudaStream_t st) { regs_t<8, false, 8, 3, 8>(s, m, n, 0, st); }, tb);
    run("T r16 L2 resident grid (528 blocks)", [&](const Set& s, cudaStream_t st) { regs_t<16, false>(s, m, n, 4 * sms, st); }, tb);
    (void)c1;
    // check: variants agree bitwise with the production choice (dynamic rows, transposed)
    {
      const Set& s = sets[0];
      std::vector<uint8_t> ref(ob), got(ob);
      auto cmp = [&](const char* name, std::function<void(const Set&, cudaStream_t)> f, bool t) {
        CK(cudaMemset(t ? s.out_t : s.out, 0x7f, ob)); f(s, 0); CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got.data(), t ? s.out_t : s.out, ob, cudaMemcpyDeviceToHost));
        return got;
      };
      ref = cmp("dyn prod", [&](const Set& s2, cudaStream_t st) { dyn_rows<2, 8>(s2, m, n, 32, st); }, false);
      auto a = cmp("dyn 64", [&](const Set& s2, cudaStream_t st) { dyn_rows<4, 4>(s2, m, n, 64, st); }, false);
      auto b = cmp("dyn 128", [&](const Set& s2, cudaStream_t st) { dyn_rows<4, 2>(s2, m, n, 128, st); }, false);
      printf("check dyn tpr64==prod %d tpr128==prod %d\n", int(a == ref), int(b == ref));
      ref = cmp("T prod", [&](const Set& s2, cudaStream_t st) { regs_t<16, false>(s2, m, n, 0, st); }, true);
      auto c = cmp("T tm", [&](const Set& s2, cudaStream_t st) { regs_t<16, true>(s2, m, n, 0, st); }, true);
      auto d = cmp("T 8", [&](const Set& s2, cudaStream_t st) { regs_t<8, false>(s2, m, n, 0, st); }, true);
      auto e = cmp("T L4", [&](const Set& s2, cudaStream_t st) { regs_t<16, false, 4, 4, 4>(s2, m, n, 0, st); }, true);
      auto f = cmp("T L8", [&](const Set& s2, cudaStream_t st) { regs_t<8, false, 8, 3, 8>(s2, m, n, 0, st); }, true);
      printf("check T tm==prod %d r8==prod %d r4==prod %d r8w8==prod %d\n", int(c == ref), int(d == ref), int(e == ref), int(f == ref));
    }
    for (auto& s : sets) { cudaFree(s.x); cudaFree(s.out); cudaFree(s.out_t); cudaFree(s.sinv); cudaFree(s.csrc); cudaFree(s.cdst); }
  }
  return 0;
}
