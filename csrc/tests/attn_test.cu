// Standalone correctness table for the split-KV decode launcher (contiguous KV; attn_paged_test.cu builds
// this file with paged KV and the append kernel) against a float64 CPU reference (no torch).
// Usage: attn_test [--small] [--seed N]. Exit status: 0 all pass, 1 a case failed, 2 a CUDA error.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/attention/attention.h"
#include "kernels/attention/decode_dispatch.h"  // the combine after the small-smem tile
#include "kernels/attention/decode_launch.cuh"  // the small-smem tile, launched directly
#include "tests/test_utils.cuh"

#ifndef ASTRAI_ATTN_TEST_PAGED
#define ASTRAI_ATTN_TEST_PAGED 0
#endif

namespace {

using astrai::DecodeParams;
using namespace astrai_test;

constexpr bool kPaged = ASTRAI_ATTN_TEST_PAGED != 0;

// The launch the default policy picks for a planned p on the current device (what the op does).
astrai::DecodeLaunch launch_of(const DecodeParams& p) {
  int device = 0;
  astrai::AttnTarget target{};
  TEST_CUDA_CHECK(cudaGetDevice(&device));
  TEST_CUDA_CHECK(astrai::attn_device_target(device, &target));
  return astrai::attn_decode_choose(p, astrai::AttnPolicy{}, target);
}
constexpr uint16_t kPoison = 0xffff;  // a NaN the kernels never write

struct Case {
  int B, Hq, Hkv, D;
  int L;                   // contiguous: keys per sequence; paged: max_pages * page_size
  std::vector<int> lens;   // per sequence (may exceed L or be negative: the kernel clamps)
  int page_size = 16;      // paged only
  bool mask = false;       // random 2-D keep mask
  int64_t split = 0;       // kv_split_size; 0: automatic
  bool bad_pages = false;  // paged: some table entries out of range (their keys are dropped)
  bool padded = false;     // strided q/K/V (gaps between heads/tokens, multiples of 8 elements)
  bool graph = false;      // also capture the launch in a CUDA graph and replay it: same bits

  std::string name() const {
    char buf[200];
    std::string l;
    for (size_t i = 0; i < lens.size() && i < 4; ++i) l += (i ? "," : "") + std::to_string(lens[i]);
    if (lens.size() > 4) l += ",...";
    std::snprintf(buf, sizeof buf, "%s B=%d H=%d/%d D=%d L=%d lens=[%s]%s%s%s%s%s%s",
                  kPaged ? "paged" : "contig", B, Hq, Hkv, D, L, l.c_str(),
                  kPaged ? (" ps=" + std::to_string(page_size)).c_str() : "", mask ? " mask" : "",
                  split ? (" split=" + std::to_string(split)).c_str() : "", bad_pages ? " bad-pages" : "",
                  padded ? " padded" : "", graph ? " graph" : "");
    return buf;
  }
};

int log2_of(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

ErrorStats run_case(const Case& c, Rng& rng, int sm_count) {
  ErrorStats s;
  const int B = c.B, Hq = c.Hq, Hkv = c.Hkv, D = c.D, G = Hq / Hkv;
  const int pad = c.padded ? 8 : 0;
  // q [B, Hq, D] with head stride D + pad
  const int64_t q_hs = D + pad, q_bs = Hq * q_hs + pad;
  std::vector<uint16_t> q(static_cast<size_t>(B) * q_bs + 8, kPoison);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int d = 0; d < D; ++d) {
        // [-1, 1]: scores stay moderate, so the float32 softmax error stays far below a bf16 ulp
        const float v = bf16_to_float(rng.nonzero_bf16()) * 0.25f;
        q[size_t(b * q_bs + h * q_hs + d)] = float_to_bf16(v);
      }

  // KV storage. Contiguous: [B, L, Hkv, D]. Paged: [num_pages, page_size, Hkv, D] with shuffled pages.
  const int ps = kPaged ? c.page_size : 1;
  const int max_pages = kPaged ? c.L / ps : 0;
  const int num_pages = kPaged ? B * max_pages + 3 : 0;
  const int64_t kv_hs = D + pad, kv_ss = Hkv * kv_hs + pad;
  const int64_t kv_bs = kPaged ? ps * kv_ss : c.L * kv_ss + pad;  // per page or per sequence
  const int64_t kv_count = (kPaged ? num_pages : B) * kv_bs + 8;
  std::vector<uint16_t> k(static_cast<size_t>(kv_count)), v(static_cast<size_t>(kv_count));
  for (auto& x : k) x = rng.nonzero_bf16();
  for (auto& x : v) x = rng.nonzero_bf16();
  std::vector<int32_t> table(static_cast<size_t>(std::max(B * max_pages, 1)), -1);
  if (kPaged) {
    std::vector<int> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = num_pages - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(rng.integer(0, i))]);
    for (int i = 0; i < B * max_pages; ++i) table[size_t(i)] = perm[size_t(i)];
    if (c.bad_pages) {
      for (int i = 0; i < B * max_pages; i += 3) table[size_t(i)] = (i % 2) ? -1 : num_pages + i;
    }
  }
  std::vector<uint8_t> mask(static_cast<size_t>(B) * std::max(c.L, 1), 1);
  if (c.mask)
    for (auto& m : mask) m = rng.integer(0, 3) != 0;

  const float scale = 1.0f / std::sqrt(float(D));
  // Reference, float64: key t of sequence b is kept iff t < clamp(len) and mask and its page is valid.
  std::vector<double> ref(static_cast<size_t>(B) * Hq * D, 0.0);
  for (int b = 0; b < B; ++b) {
    const int n = std::min(std::max(c.lens[size_t(b)], 0), c.L);
    for (int h = 0; h < Hq; ++h) {
      const int kvh = h / G;
      std::vector<double> sc;
      std::vector<int64_t> rows;
      for (int t = 0; t < n; ++t) {
        if (c.mask && !mask[size_t(b) * c.L + t]) continue;
        int64_t row;
        if (kPaged) {
          const int page = table[size_t(b * max_pages + t / ps)];
          if (page < 0 || page >= num_pages) continue;
          row = page * kv_bs + (t % ps) * kv_ss + kvh * kv_hs;
        } else {
          row = b * kv_bs + t * kv_ss + kvh * kv_hs;
        }
        double dot = 0;
        for (int d = 0; d < D; ++d) {
          dot += double(bf16_to_float(q[size_t(b * q_bs + h * q_hs + d)])) * bf16_to_float(k[size_t(row + d)]);
        }
        sc.push_back(dot * double(scale));
        rows.push_back(row);
      }
      if (sc.empty()) continue;  // no key kept: zeros
      const double mx = *std::max_element(sc.begin(), sc.end());
      double sum = 0;
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      for (size_t i = 0; i < sc.size(); ++i)
        for (int d = 0; d < D; ++d) ref[size_t((b * Hq + h) * D + d)] += sc[i] / sum * bf16_to_float(v[size_t(rows[i] + d)]);
    }
  }

  DeviceBuffer<uint16_t> q_d(q.size()), k_d(k.size()), v_d(v.size());
  q_d.upload(q);
  k_d.upload(k);
  v_d.upload(v);
  const int64_t o_hs = D + pad, o_bs = Hq * o_hs;
  DeviceBuffer<uint16_t> out_d(static_cast<size_t>(B) * o_bs + 8);
  TEST_CUDA_CHECK(cudaMemset(out_d.get(), 0xff, out_d.size() * 2));
  DeviceBuffer<int32_t> lens_d(static_cast<size_t>(B)), table_d(table.size());
  lens_d.upload(std::vector<int32_t>(c.lens.begin(), c.lens.end()));
  table_d.upload(table);
  DeviceBuffer<uint8_t> mask_d(mask.size());
  mask_d.upload(mask);

  DecodeParams p{};
  p.q_ptr = q_d.get();
  p.k_ptr = k_d.get();
  p.v_ptr = v_d.get();
  p.out_ptr = out_d.get();
  p.kv_lens_ptr = lens_d.get();
  p.page_table_ptr = kPaged ? table_d.get() : nullptr;
  p.mask_ptr = c.mask ? mask_d.get() : nullptr;
  p.q_batch_stride = q_bs;
  p.q_head_stride = q_hs;
  p.k_batch_stride = p.v_batch_stride = kv_bs;
  p.k_seq_stride = p.v_seq_stride = kv_ss;
  p.k_head_stride = p.v_head_stride = kv_hs;
  p.out_batch_stride = o_bs;
  p.out_head_stride = o_hs;
  p.page_table_batch_stride = max_pages;
  p.mask_batch_stride = c.L;
  p.batch = B;
  p.num_q_heads = Hq;
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  p.max_kv_len = c.L;
  p.mask_len = c.L;
  p.num_pages = num_pages;
  p.page_size_log2 = log2_of(ps);
  p.scale_log2 = float(double(scale) * 1.4426950408889634);
  p.paged = kPaged;
  const astrai::DecodePlan plan = astrai::attn_decode_plan(B, Hkv, G, c.L, D, kPaged, sm_count, c.split);
  p.num_splits = plan.num_splits;
  p.split_len = plan.split_len;
  DeviceBuffer<float> po(static_cast<size_t>(plan.num_splits) * B * Hq * D), plse(static_cast<size_t>(plan.num_splits) * B * Hq);
  if (plan.num_splits > 1) {
    p.partial_o_ptr = po.get();
    p.partial_lse_ptr = plse.get();
  }
  const cudaError_t st = astrai::attn_decode_bf16_launch(p, launch_of(p), nullptr);
  if (st != cudaSuccess) {
    s.fail(std::string("launch returned ") + cudaGetErrorName(st));
    return s;
  }
  TEST_CUDA_CHECK(cudaGetLastError());
  TEST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> out;
  out_d.download(out);
  if (c.graph) {
    // Captured once, replayed twice over a poisoned output: the decode and the combine replay as recorded.
    cudaStream_t stream;
    TEST_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    TEST_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t cst = astrai::attn_decode_bf16_launch(p, launch_of(p), stream);
    TEST_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    if (cst != cudaSuccess) s.fail(std::string("captured launch returned ") + cudaGetErrorName(cst));
    TEST_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 2 && cst == cudaSuccess; ++r) {
      TEST_CUDA_CHECK(cudaMemsetAsync(out_d.get(), 0xff, out_d.size() * 2, stream));
      TEST_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      TEST_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<uint16_t> replay;
      out_d.download(replay);
      if (replay != out) s.fail("graph replay " + std::to_string(r) + " differs from the eager launch");
    }
    TEST_CUDA_CHECK(cudaGraphExecDestroy(exec));
    TEST_CUDA_CHECK(cudaGraphDestroy(graph));
    TEST_CUDA_CHECK(cudaStreamDestroy(stream));
  }
  char what[256];
  auto check = [&](const std::vector<uint16_t>& out, const char* tile) {
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < Hq; ++h)
        for (int64_t d = 0; d < o_hs; ++d) {
          const uint16_t bits = out[size_t(b * o_bs + h * o_hs + d)];
          if (d >= D) {  // padding must stay poisoned
            if (bits != kPoison) s.fail(std::string(tile) + "padding between output heads was written");
            continue;
          }
          const double r = ref[size_t((b * Hq + h) * D + d)];
          const double g = bf16_to_float(bits);
          const double tol = bf16_ulp(r) + 2e-3;  // rounding once plus the float32 softmax error
          const double err = std::fabs(g - r);
          ++s.checked;
          if (bits == kPoison || std::isnan(g) || !(err <= tol)) {
            std::snprintf(what, sizeof what, "%sout[%d,%d,%" PRId64 "]: got %.6g (0x%04x), reference %.6g, tol %.3g",
                          tile, b, h, d, g, bits, r, tol);
            s.fail(what);
            continue;
          }
          s.max_abs = std::max(s.max_abs, err);
          s.max_ulp = std::max(s.max_ulp, err / bf16_ulp(r));
          s.max_tol_ratio = std::max(s.max_tol_ratio, err / tol);
        }
  };
  check(out, "");
  if (D == 128) {
    // The 99 KB-class tile (sm_89, sm_120) the launcher takes where a block may not have the default's 128 KB:
    // launched directly here so that every GPU runs it, on the same plan (then the combine, for splits).
    TEST_CUDA_CHECK(cudaMemset(out_d.get(), 0xff, out_d.size() * 2));
    using SmallTile = astrai::attention::DecodeSmallSmemTile<128>::type;
    cudaError_t sst = astrai::attention::launch_decode_tile<128, SmallTile>(p, nullptr);
    if (sst == cudaSuccess && plan.num_splits > 1) sst = astrai::attention::launch_decode_combine(p, nullptr, false);
    if (sst != cudaSuccess) {
      s.fail(std::string("small-smem tile launch returned ") + cudaGetErrorName(sst));
    } else {
      TEST_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint16_t> small_out;
      out_d.download(small_out);
      check(small_out, "small-smem tile: ");
    }
  }
  return s;
}

#if ASTRAI_ATTN_TEST_PAGED
// paged_kv_append against the host copy: bitwise, out-of-range tokens not written, nothing else touched.
ErrorStats run_append_case(int N, int Hkv, int D, int ps, Rng& rng) {
  ErrorStats s;
  const int B = 3, max_pages = 4, num_pages = 16;
  const int64_t cache_count = int64_t(num_pages) * ps * Hkv * D;
  std::vector<uint16_t> kc(static_cast<size_t>(cache_count)), vc(static_cast<size_t>(cache_count)), kn(static_cast<size_t>(N) * Hkv * D), vn(kn.size());
  for (auto& x : kc) x = rng.nonzero_bf16();
  for (auto& x : vc) x = rng.nonzero_bf16();
  for (auto& x : kn) x = rng.nonzero_bf16();
  for (auto& x : vn) x = rng.nonzero_bf16();
  std::vector<int32_t> table(static_cast<size_t>(B * max_pages));
  for (int i = 0; i < B * max_pages; ++i) table[size_t(i)] = (i * 5 + 1) % num_pages;
  table[5] = -1;
  table[6] = num_pages;
  std::vector<int32_t> seq(static_cast<size_t>(N)), pos(static_cast<size_t>(N));
  std::vector<int> used(static_cast<size_t>(B * max_pages * ps), 0);
  for (int n = 0; n < N; ++n) {
    for (;;) {  // distinct (seq, pos) so no two tokens race for a slot; a few deliberately out of range
      seq[size_t(n)] = int32_t(rng.integer(-1, B));
      pos[size_t(n)] = int32_t(rng.integer(-2, max_pages * ps + 1));
      const bool in = seq[size_t(n)] >= 0 && seq[size_t(n)] < B && pos[size_t(n)] >= 0 && pos[size_t(n)] < max_pages * ps;
      if (!in) break;
      int& u = used[size_t(seq[size_t(n)] * max_pages * ps + pos[size_t(n)])];
      if (!u) { u = 1; break; }
    }
  }
  std::vector<uint16_t> kw = kc, vw = vc;  // expected
  for (int n = 0; n < N; ++n) {
    const int b = seq[size_t(n)], t = pos[size_t(n)];
    if (b < 0 || b >= B || t < 0 || t >= max_pages * ps) continue;
    const int page = table[size_t(b * max_pages + t / ps)];
    if (page < 0 || page >= num_pages) continue;
    for (int h = 0; h < Hkv; ++h)
      for (int d = 0; d < D; ++d) {
        const size_t dst = size_t(((int64_t(page) * ps + t % ps) * Hkv + h) * D + d);
        kw[dst] = kn[size_t((int64_t(n) * Hkv + h) * D + d)];
        vw[dst] = vn[size_t((int64_t(n) * Hkv + h) * D + d)];
      }
  }
  DeviceBuffer<uint16_t> kc_d(kc.size()), vc_d(vc.size()), kn_d(std::max<size_t>(kn.size(), 1)),
      vn_d(std::max<size_t>(vn.size(), 1));
  kc_d.upload(kc);
  vc_d.upload(vc);
  if (N) { kn_d.upload(kn); vn_d.upload(vn); }
  DeviceBuffer<int32_t> table_d(table.size()), seq_d(std::max(N, 1)), pos_d(std::max(N, 1));
  table_d.upload(table);
  if (N) { seq_d.upload(seq); pos_d.upload(pos); }
  astrai::AppendParams p{};
  p.k_cache_ptr = kc_d.get();
  p.v_cache_ptr = vc_d.get();
  p.k_new_ptr = kn_d.get();
  p.v_new_ptr = vn_d.get();
  p.page_table_ptr = table_d.get();
  p.seq_ids_ptr = seq_d.get();
  p.positions_ptr = pos_d.get();
  p.k_cache_page_stride = p.v_cache_page_stride = int64_t(ps) * Hkv * D;
  p.k_cache_seq_stride = p.v_cache_seq_stride = int64_t(Hkv) * D;
  p.k_cache_head_stride = p.v_cache_head_stride = D;
  p.k_new_token_stride = p.v_new_token_stride = int64_t(Hkv) * D;
  p.k_new_head_stride = p.v_new_head_stride = D;
  p.page_table_batch_stride = max_pages;
  p.seq_ids_stride = p.positions_stride = 1;
  p.num_tokens = N;
  p.batch = B;
  p.max_pages = max_pages;
  p.num_pages = num_pages;
  p.page_size_log2 = log2_of(ps);
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  const cudaError_t st = astrai::paged_kv_append_bf16_launch(p, nullptr);
  if (st != cudaSuccess) {
    s.fail(std::string("launch returned ") + cudaGetErrorName(st));
    return s;
  }
  TEST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> kg, vg;
  kc_d.download(kg);
  vc_d.download(vg);
  for (size_t i = 0; i < kg.size(); ++i) {
    ++s.checked;
    if (kg[i] != kw[i] || vg[i] != vw[i]) {
      char what[128];
      std::snprintf(what, sizeof what, "cache element %zu: k 0x%04x (want 0x%04x), v 0x%04x (want 0x%04x)", i, kg[i],
                    kw[i], vg[i], vw[i]);
      s.fail(what);
    }
  }
  return s;
}
#endif

std::vector<Case> make_cases(bool small, Rng& rng) {
  std::vector<Case> cases;
  const std::vector<int> dims = small ? std::vector<int>{128} : std::vector<int>{64, 128, 256};
  const std::vector<std::pair<int, int>> heads = small ? std::vector<std::pair<int, int>>{{8, 2}, {4, 1}}
                                                       : std::vector<std::pair<int, int>>{
                                                             {4, 4}, {8, 4}, {8, 2}, {32, 8}, {16, 2}, {12, 1}, {32, 1}};
  const int ps_default = kPaged ? 16 : 1;
  for (int D : dims)
    for (auto hk : heads) cases.push_back(Case{3, hk.first, hk.second, D, 160, {160, 1, 77}, ps_default});
  // Ragged lengths incl. 0, 1, over-long and negative (clamped), lengths not a multiple of the page size.
  cases.push_back(Case{5, 8, 2, 128, 256, {0, 1, 255, 300, -4}, ps_default});
  // Masks, forced splits (batch-invariant mode) and many splits.
  {
    Case c{2, 8, 2, 128, 512, {512, 333}, ps_default};
    c.mask = true;
    cases.push_back(c);
    c.mask = false;
    c.split = 64;
    cases.push_back(c);
    c.mask = true;
    c.split = 100;
    cases.push_back(c);
  }
  // Many splits per combine lane, most of them empty for the short sequence.
  {
    Case c{2, 8, 2, 128, 2048, {2048, 100}, ps_default};
    c.split = 64;
    cases.push_back(c);
  }
  // Batch 1, long sequence: the auto planner splits, also replayed from a CUDA graph.
  if (!small) {
    Case c{1, 32, 8, 128, 8192, {8191}, ps_default};
    c.graph = true;
    cases.push_back(c);
  }
  // Batch 1, 256 splits: the combine over many splits, graph replay.
  {
    Case c{1, 32, 8, 128, 16384, {16384}, ps_default};
    c.split = 64;
    c.graph = true;
    cases.push_back(c);
  }
  // Eight q heads per block (the largest merge) with splits.
  if (!small) {
    Case c{2, 64, 8, 256, 4096, {4096, 3000}, ps_default};
    c.split = 64;
    cases.push_back(c);
  }
  // More splits than combine threads (the combine's lse pass loops), D 64 and 128.
  if (!small) {
    for (int D : {64, 128}) {
      Case c{2, 8, 2, D, 20480, {20480, 20000}, ps_default};
      c.split = 64;  // 320 splits
      cases.push_back(c);
    }
  }
  // Strided views.
  {
    Case c{2, 8, 4, 64, 96, {96, 50}, ps_default};
    c.padded = true;
    cases.push_back(c);
  }
  if (kPaged) {
    for (int ps : {1, 2, 16, 64, 128}) {
      Case c{3, 8, 2, 128, 256, {256, 17, 129}, ps};
      cases.push_back(c);
    }
    Case c{3, 8, 2, 128, 256, {256, 200, 100}, 16};
    c.bad_pages = true;
    cases.push_back(c);
  }
  // Random shapes.
  const int n_random = small ? 2 : 6;
  for (int i = 0; i < n_random; ++i) {
    const int hkv = int(rng.integer(1, 4)), g = 1 << rng.integer(0, 3);
    const int B = int(rng.integer(1, 6));
    const int ps = kPaged ? (1 << rng.integer(0, 7)) : 1;
    const int L = int((rng.integer(1, 700) + ps - 1) / ps * ps);
    Case c{B, hkv * g, hkv, dims[size_t(rng.integer(0, int64_t(dims.size()) - 1))], L, {}, kPaged ? ps : 16};
    for (int b = 0; b < B; ++b) c.lens.push_back(int(rng.integer(0, L)));
    c.mask = rng.integer(0, 1) == 1;
    cases.push_back(c);
  }
  return cases;
}

bool check_rejections() {
  DecodeParams p{};
  void* dummy = nullptr;
  TEST_CUDA_CHECK(cudaMalloc(&dummy, 4096));
  p.q_ptr = p.k_ptr = p.v_ptr = p.out_ptr = dummy;
  p.batch = 1;
  p.num_q_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 96;  // unsupported
  p.max_kv_len = 8;
  p.num_splits = 1;
  p.split_len = 64;
  bool ok = astrai::attn_decode_bf16_launch(p, launch_of(p), nullptr) == cudaErrorInvalidValue;
  p.head_dim = 128;
  p.num_q_heads = 3;  // not a multiple of Hkv
  ok = ok && astrai::attn_decode_bf16_launch(p, launch_of(p), nullptr) == cudaErrorInvalidValue;
  p.num_q_heads = 4;
  p.num_splits = 2;  // workspace missing
  ok = ok && astrai::attn_decode_bf16_launch(p, launch_of(p), nullptr) == cudaErrorInvalidValue;
  TEST_CUDA_CHECK(cudaGetLastError());
  TEST_CUDA_CHECK(cudaFree(dummy));
  std::printf("launcher rejects inconsistent params with cudaErrorInvalidValue: %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const TestOptions opts = parse_test_options(argc, argv);
  if (!opts.ok) return 2;
  const bool small = opts.small;
  const uint64_t seed = opts.seed;
  const cudaDeviceProp prop = print_test_banner(kPaged ? "attn_paged_test" : "attn_test", opts);
  Rng rng(seed);
  const std::vector<Case> cases = make_cases(small, rng);
  int failed = 0, index = 0;
  print_table_header();
  for (const Case& c : cases) {
    const ErrorStats s = run_case(c, rng, prop.multiProcessorCount);
    print_table_row(index++, c.name(), s);
    failed += s.failures > 0;
  }
  int total = int(cases.size());
#if ASTRAI_ATTN_TEST_PAGED
  for (int ps : {1, 16, 128}) {
    for (int N : {0, 1, 37}) {
      const ErrorStats s = run_append_case(N, 2, 128, ps, rng);
      print_table_row(index++, "append N=" + std::to_string(N) + " Hkv=2 D=128 ps=" + std::to_string(ps), s);
      failed += s.failures > 0;
      ++total;
    }
  }
#endif
  const bool rejections_ok = check_rejections();
  std::printf("%d cases, %d failed (seed %" PRIu64 ")\n", total, failed, seed);
  return (failed == 0 && rejections_ok) ? 0 : 1;
}
