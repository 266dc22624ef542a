// Standalone correctness table for the prefill launcher (dense / ragged Q; contiguous dense, contiguous ragged and
// paged KV; causal, masks, GQA) against a float64 CPU reference (no torch), host proofs of the schedule's index
// math, and a --bench mode for the speed goal shapes (which also checks paged == contiguous bitwise there).
// Usage: attn_prefill_test [--small] [--seed N] [--bench [--page-size N] | --host].
// Exit status: 0 all pass, 1 a case failed, 2 a CUDA error.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/attention/attention.h"
#include "kernels/attention/prefill_schedule.h"
#include "kernels/common/swizzle.cuh"
#include "tests/test_utils.cuh"

namespace {

using astrai::PrefillParams;
using namespace astrai_test;
namespace att = astrai::attention;

constexpr uint16_t kPoison = 0xffff;  // a NaN the kernel never writes
constexpr int32_t kMapPoison = 0x7f7f7f7f;

enum class Kv { kDense, kRagged, kPaged };

struct Case {
  int B, Hq, Hkv, D;
  bool ragged_q = false;
  std::vector<int> q_lens;   // dense: one entry (Lq) used by every sequence; ragged: per sequence
  Kv kv = Kv::kDense;
  int L = 0;                 // dense: keys per sequence (k.size(1)); paged: max_pages * page_size
  std::vector<int> kv_lens;  // per sequence; dense: empty = L (kv_lens null); may exceed L or be negative
  int page_size = 16;
  bool causal = false;
  int mask_dims = 0;         // 0: none, 2: [B, M], 3: [B, max_q, M] (row 3 of sequence 0 fully masked)
  bool bad_pages = false;    // paged: some table entries out of range (their keys are dropped)
  bool padded = false;       // gaps between heads / rows (strides multiples of 8 elements)
  int slack_rows = 0;        // ragged: rows past qo_indptr[B] in q/out (must stay poisoned)
  std::vector<int> qo_indptr_override, kv_indptr_override;  // inconsistent indptr (clamped by the kernel)
  bool check_values = true;  // false: overlapping sequences (racy by construction): only safety is checked

  std::string name() const {
    char buf[256];
    std::string ql;
    for (size_t i = 0; i < q_lens.size() && i < 4; ++i) ql += (i ? "," : "") + std::to_string(q_lens[i]);
    if (q_lens.size() > 4) ql += ",...";
    const char* kvs = kv == Kv::kDense ? "kv" : kv == Kv::kRagged ? "kv-ragged" : "paged";
    const std::string len = kv == Kv::kRagged ? "" : " L=" + std::to_string(L);  // ragged: Tkv from kv_lens
    std::snprintf(buf, sizeof buf, "%s B=%d H=%d/%d D=%d q=[%s] %s%s%s%s%s%s%s%s%s", ragged_q ? "ragged" : "dense",
                  B, Hq, Hkv, D, ql.c_str(), kvs, len.c_str(),
                  kv == Kv::kPaged ? (" ps=" + std::to_string(page_size)).c_str() : "", causal ? " causal" : "",
                  mask_dims ? (" mask" + std::to_string(mask_dims) + "d").c_str() : "", bad_pages ? " bad-pages" : "",
                  padded ? " padded" : "",
                  qo_indptr_override.empty() && kv_indptr_override.empty() ? "" : " bad-indptr",
                  check_values ? "" : " (safety only)");
    return buf;
  }
};

int log2_of(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

// ---- host proofs of the index math -----------------------------------------------------------------

// The ragged tile map, brute force: sequences in order, the last tile of each first, truncated / padded to n.
void tile_map_brute(const std::vector<int32_t>& indptr, int32_t total_rows, int rows_log2, int32_t n,
                    std::vector<int32_t>& to_b, std::vector<int32_t>& to_i) {
  to_b.assign(static_cast<size_t>(n), -1);
  to_i.assign(static_cast<size_t>(n), 0);
  int64_t at = 0;
  const int R = 1 << rows_log2;
  for (size_t b = 0; b + 1 < indptr.size(); ++b) {
    const int32_t lo = std::min(std::max(indptr[b], 0), total_rows);
    const int32_t hi = std::min(std::max(indptr[b + 1], 0), total_rows);
    const int32_t len = std::max(hi - lo, 0);
    const int32_t tiles = (len + R - 1) / R;
    for (int32_t k = 0; k < tiles; ++k, ++at) {
      if (at < n) {
        to_b[size_t(at)] = int32_t(b);
        to_i[size_t(at)] = (tiles - 1 - k) * R;
      }
    }
  }
}

// The tile-map kernel's algorithm run on the host: chunks of `chunk` sequences, an exclusive scan, then every
// entry finds its sequence with last_le (the same helpers the kernel calls).
void tile_map_chunked(const std::vector<int32_t>& indptr, int32_t total_rows, int rows_log2, int32_t n, int chunk,
                      std::vector<int32_t>& to_b, std::vector<int32_t>& to_i) {
  to_b.assign(static_cast<size_t>(n), kMapPoison);
  to_i.assign(static_cast<size_t>(n), kMapPoison);
  const int32_t batch = int32_t(indptr.size()) - 1;
  int64_t carry = 0;
  std::vector<int64_t> first(static_cast<size_t>(chunk));
  std::vector<int32_t> tiles(static_cast<size_t>(chunk));
  for (int32_t c0 = 0; c0 < batch; c0 += chunk) {
    int64_t sum = 0;
    for (int t = 0; t < chunk; ++t) {
      const int32_t b = c0 + t;
      tiles[size_t(t)] = b < batch ? att::tiles_of(att::clamp_indptr(indptr[size_t(b)], indptr[size_t(b) + 1],
                                                                     total_rows).len, rows_log2) : 0;
      first[size_t(t)] = sum;
      sum += tiles[size_t(t)];
    }
    const int count = std::min(chunk, batch - c0);
    for (int64_t i = 0; i < sum && carry + i < n; ++i) {
      const int k = att::last_le(first.data(), count, i);
      to_b[size_t(carry + i)] = c0 + k;
      to_i[size_t(carry + i)] = int32_t((tiles[size_t(k)] - 1 - (i - first[size_t(k)])) << rows_log2);
    }
    carry += sum;
  }
  for (int64_t i = carry; i < n; ++i) {
    to_b[size_t(i)] = -1;
    to_i[size_t(i)] = 0;
  }
}

template <int kChunks>
bool check_ldsm_offsets() {
  // ldsm_step(ldsm_*_offset(lane), step, blk) must address exactly swizzle(row, chunk) of the fragment layout.
  for (int lane = 0; lane < 32; ++lane)
    for (int step = 0; step < kChunks / 2; ++step)
      for (int blk = 0; blk < 4; ++blk) {
        const int row0 = 32;  // a warp's first row (a multiple of 16)
        const uint32_t a = astrai::ldsm_step<kChunks>(astrai::ldsm_a_offset<kChunks>(lane, row0), step, blk);
        const uint32_t a_want =
            uint32_t(astrai::swizzle<kChunks>(row0 + blk * 16 + (lane & 15), 2 * step + (lane >> 4))) * 16;
        const uint32_t b = astrai::ldsm_step<kChunks>(astrai::ldsm_b_offset<kChunks>(lane), step, blk);
        const uint32_t b_want = uint32_t(astrai::swizzle<kChunks>(blk * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                               2 * step + ((lane >> 3) & 1))) * 16;
        const uint32_t t = astrai::ldsm_step<kChunks>(astrai::ldsm_bt_offset<kChunks>(lane), step, blk);
        const uint32_t t_want = uint32_t(astrai::swizzle<kChunks>(blk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                               2 * step + (lane >> 4))) * 16;
        if (a != a_want || b != b_want || t != t_want) return false;
      }
  // Swizzle: a bijection within each row, and 8 consecutive rows at one logical chunk hit 8 distinct bank groups.
  for (int r0 = 0; r0 < 16; r0 += 8)
    for (int c = 0; c < kChunks; ++c) {
      unsigned seen = 0;
      for (int r = r0; r < r0 + 8; ++r) seen |= 1u << (astrai::swizzle<kChunks>(r, c) % 8);
      if (seen != 0xffu) return false;
    }
  // The K/V load offsets: row ld_row + r (r a multiple of 4) sits r * kChunks chunks after row ld_row's chunk,
  // corrected by (c0 ^ 4) - c0 when r & 4 (bf16_prefill.cuh, issue_kv).
  for (int ld_row = 0; ld_row < 8; ++ld_row)
    for (int c = 0; c < kChunks; ++c)
      for (int r = 0; r < 64; r += 4) {
        const int c0 = c ^ (ld_row & 7);
        const int at = r * kChunks + ((r & 4) ? ((c0 ^ 4) - c0) : 0);
        if (astrai::swizzle<kChunks>(ld_row + r, c) - astrai::swizzle<kChunks>(ld_row, c) != at) return false;
      }
  return true;
}

// One warp's data path on the host: ldmatrix (plain / .trans) and mma.m16n8k16 emulated from the PTX fragment
// layouts, fed by the kernel's own address functions (ldsm_*_offset, ldsm_step) on swizzled tiles and by its P
// packing, against direct matrix products. Small integers keep every product exact.
namespace emu {

using Tile = std::vector<uint16_t>;  // swizzled [rows][D] bf16, 16-byte chunk c of row r at chunk swizzle(r, c)

template <int kChunks>
Tile store_swizzled(const std::vector<float>& m, int rows) {  // m: [rows][kChunks * 8]
  Tile t(size_t(rows) * kChunks * 8);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < kChunks; ++c)
      for (int e = 0; e < 8; ++e)
        t[size_t(astrai::swizzle<kChunks>(r, c)) * 8 + e] = float_to_bf16(m[size_t(r) * kChunks * 8 + c * 8 + e]);
  return t;
}

// ldmatrix.x4: lane l gives the row address (byte offset) of matrix l / 8, row l % 8; lane l receives, of each
// matrix, row l / 4, columns 2 (l % 4) and + 1 (trans: rows 2 (l % 4) and + 1 of column l / 4), low half first.
void ldmatrix_x4(const Tile& t, const uint32_t (&addr)[32], bool trans, uint32_t (&out)[32][4]) {
  for (int m = 0; m < 4; ++m)
    for (int l = 0; l < 32; ++l) {
      uint16_t v[2];
      for (int e = 0; e < 2; ++e) {
        const int row = trans ? 2 * (l % 4) + e : l / 4;
        const int col = trans ? l / 4 : 2 * (l % 4) + e;
        v[e] = t[addr[8 * m + row] / 2 + col];
      }
      out[l][m] = uint32_t(v[0]) | (uint32_t(v[1]) << 16);
    }
}

float lo(uint32_t w) { return bf16_to_float(uint16_t(w & 0xffff)); }
float hi(uint32_t w) { return bf16_to_float(uint16_t(w >> 16)); }

// d += a b (m16n8k16): a = {A[g][c..], A[g+8][c..], A[g][c+8..], A[g+8][c+8..]}, b = {B[c..][g], B[c+8..][g]},
// d = {D[g][c], D[g][c+1], D[g+8][c], D[g+8][c+1]} with g = lane / 4, c = 2 (lane % 4).
void mma(float (&d)[32][4], const uint32_t (&a)[32][4], const uint32_t (&b)[32][2]) {
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, c = 2 * (l % 4);
    for (int e = 0; e < 2; ++e) {
      A[g][c + e] = e ? hi(a[l][0]) : lo(a[l][0]);
      A[g + 8][c + e] = e ? hi(a[l][1]) : lo(a[l][1]);
      A[g][c + 8 + e] = e ? hi(a[l][2]) : lo(a[l][2]);
      A[g + 8][c + 8 + e] = e ? hi(a[l][3]) : lo(a[l][3]);
      B[c + e][g] = e ? hi(b[l][0]) : lo(b[l][0]);
      B[c + 8 + e][g] = e ? hi(b[l][1]) : lo(b[l][1]);
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, c = 2 * (l % 4);
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e / 2) * 8, col = c + e % 2;
      float acc = 0;
      for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
      d[l][e] += acc;
    }
  }
}

// S = Q K^T then O = P V for one warp of kMTiles m16 tiles (rows warp_row0 ..), BN keys, as the kernel's loops.
template <int kChunks, int kMTiles, int kBN>
bool warp_path(Rng& rng) {
  constexpr int D = kChunks * 8, kRows = 4 * 16 * kMTiles, warp_row0 = 16 * kMTiles;  // warp 1 of 4
  std::vector<float> q(static_cast<size_t>(kRows * D)), k(static_cast<size_t>(kBN * D)),
      v(static_cast<size_t>(kBN * D));
  for (auto& x : q) x = float(rng.integer(-2, 2));
  for (auto& x : k) x = float(rng.integer(-2, 2));
  for (auto& x : v) x = float(rng.integer(-3, 3));
  const Tile sq = store_swizzled<kChunks>(q, kRows), sk = store_swizzled<kChunks>(k, kBN),
             sv = store_swizzled<kChunks>(v, kBN);
  static float s[kMTiles][kBN / 8][32][4], o[kMTiles][D / 8][32][4];
  std::memset(s, 0, sizeof s);
  std::memset(o, 0, sizeof o);
  uint32_t addr[32], frag[32][4], a[kMTiles][32][4], bk[32][2];
  for (int kk = 0; kk < D / 16; ++kk) {
    for (int mt = 0; mt < kMTiles; ++mt) {
      for (int l = 0; l < 32; ++l) addr[l] = astrai::ldsm_step<kChunks>(astrai::ldsm_a_offset<kChunks>(l, warp_row0), kk, mt);
      ldmatrix_x4(sq, addr, false, a[mt]);
    }
    for (int np = 0; np < kBN / 16; ++np) {
      for (int l = 0; l < 32; ++l) addr[l] = astrai::ldsm_step<kChunks>(astrai::ldsm_b_offset<kChunks>(l), kk, np);
      ldmatrix_x4(sk, addr, false, frag);
      for (int half = 0; half < 2; ++half) {
        for (int l = 0; l < 32; ++l) bk[l][0] = frag[l][2 * half], bk[l][1] = frag[l][2 * half + 1];
        for (int mt = 0; mt < kMTiles; ++mt) mma(s[mt][2 * np + half], a[mt], bk);
      }
    }
  }
  // P: the scores themselves (small integers, exact in bf16), packed as the kernel packs its weights.
  static uint32_t pa[kMTiles][kBN / 16][32][4];
  for (int mt = 0; mt < kMTiles; ++mt)
    for (int l = 0; l < 32; ++l)
      for (int h = 0; h < 2; ++h)
        for (int nt = 0; nt < kBN / 8; ++nt)
          pa[mt][nt / 2][l][(nt % 2) * 2 + h] = uint32_t(float_to_bf16(s[mt][nt][l][2 * h])) |
                                               (uint32_t(float_to_bf16(s[mt][nt][l][2 * h + 1])) << 16);
  for (int ks = 0; ks < kBN / 16; ++ks)
    for (int np = 0; np < D / 16; ++np) {
      for (int l = 0; l < 32; ++l) addr[l] = astrai::ldsm_step<kChunks>(astrai::ldsm_bt_offset<kChunks>(l), np, ks);
      ldmatrix_x4(sv, addr, true, frag);
      for (int half = 0; half < 2; ++half) {
        for (int l = 0; l < 32; ++l) bk[l][0] = frag[l][2 * half], bk[l][1] = frag[l][2 * half + 1];
        for (int mt = 0; mt < kMTiles; ++mt) mma(o[mt][2 * np + half], pa[mt][ks], bk);
      }
    }
  // Direct products, compared element by element at the C-fragment positions.
  for (int mt = 0; mt < kMTiles; ++mt)
    for (int l = 0; l < 32; ++l)
      for (int e = 0; e < 4; ++e) {
        const int row = warp_row0 + mt * 16 + l / 4 + (e / 2) * 8, c = 2 * (l % 4) + e % 2;
        for (int nt = 0; nt < kBN / 8; ++nt) {
          float want = 0;
          for (int d = 0; d < D; ++d) want += q[size_t(row) * D + d] * k[size_t(nt * 8 + c) * D + d];
          if (want != s[mt][nt][l][e]) return false;
        }
        for (int nt = 0; nt < D / 8; ++nt) {
          float want = 0;
          for (int t = 0; t < kBN; ++t) {
            float st = 0;
            for (int d = 0; d < D; ++d) st += q[size_t(row) * D + d] * k[size_t(t) * D + d];
            want += st * v[size_t(t) * D + nt * 8 + c];
          }
          if (want != o[mt][nt][l][e]) return false;
        }
      }
  return true;
}

}  // namespace emu

bool host_index_checks(Rng& rng) {
  bool ok = true;
  // last_le against a linear scan on non-decreasing arrays (runs of equal values: sequences without tiles).
  for (int trial = 0; trial < 2000 && ok; ++trial) {
    const int count = int(rng.integer(1, 40));
    std::vector<int64_t> first(static_cast<size_t>(count));
    int64_t acc = 0;
    for (int k = 0; k < count; ++k) {
      first[size_t(k)] = acc;
      acc += rng.integer(0, 1) ? rng.integer(0, 5) : 0;
    }
    for (int64_t i = 0; i < acc + 2; ++i) {
      int want = 0;
      for (int k = 0; k < count; ++k)
        if (first[size_t(k)] <= i) want = k;
      ok = ok && att::last_le(first.data(), count, i) == want;
    }
  }
  // The chunked tile map against brute force: random, empty, over-long, negative and decreasing indptr, batches
  // across several chunks, bounds from the plan (and a smaller n: truncation).
  for (int trial = 0; trial < 300 && ok; ++trial) {
    const int B = int(rng.integer(0, trial % 10 == 0 ? 1500 : 40));
    const int32_t total = int32_t(rng.integer(0, 3000));
    const int rows_log2 = int(rng.integer(4, 7));
    std::vector<int32_t> indptr(static_cast<size_t>(B) + 1);
    int32_t acc = 0;
    for (auto& x : indptr) {
      x = acc;
      acc += int32_t(rng.integer(0, 200));
    }
    if (trial % 3 == 1)
      for (auto& x : indptr) x = int32_t(rng.integer(-50, total + 50));
    const int64_t bound = att::ragged_tile_bound(B, total, rows_log2);
    const int32_t n = int32_t(trial % 4 == 3 ? bound / 2 : bound);
    std::vector<int32_t> bb, bi, cb, ci;
    tile_map_brute(indptr, total, rows_log2, n, bb, bi);
    tile_map_chunked(indptr, total, rows_log2, n, 512, cb, ci);
    ok = ok && bb == cb && bi == ci;
    // The plan's bound holds whenever the sequences do not overlap (monotone indptr within [0, Tq]).
    if (trial % 3 != 1 && acc - 0 <= total) {
      int64_t tiles = 0;
      for (int b = 0; b < B; ++b)
        tiles += att::tiles_of(att::clamp_indptr(indptr[size_t(b)], indptr[size_t(b) + 1], total).len, rows_log2);
      ok = ok && tiles <= bound;
    }
  }
  // GQA packing: HB divides G, is a power of two <= 4, and is the largest such.
  for (int g = 1; g <= 64 && ok; ++g) {
    const int hb = 1 << att::prefill_heads_log2(g);
    ok = ok && g % hb == 0 && hb <= att::kPrefillWarps && (hb == att::kPrefillWarps || g % (2 * hb) != 0);
  }
  // Paged address math: page t >> log2(ps), slot t & (ps - 1) equal t / ps, t % ps for every page size.
  for (int lg = 0; lg <= 7 && ok; ++lg)
    for (int t = 0; t < 5000; ++t) ok = ok && (t >> lg) == t / (1 << lg) && (t & ((1 << lg) - 1)) == t % (1 << lg);
  ok = ok && check_ldsm_offsets<8>() && check_ldsm_offsets<16>() && check_ldsm_offsets<32>();
  // The configurations the kernel instantiates: (D / 8 chunks, m16 tiles per warp, keys per softmax step).
  ok = ok && emu::warp_path<8, 2, 64>(rng) && emu::warp_path<16, 2, 32>(rng) && emu::warp_path<16, 2, 64>(rng) &&
       emu::warp_path<32, 1, 32>(rng);
  std::printf("host proofs (tile map vs brute force, last_le, GQA packing, paged address, swizzle, warp mma "
              "path): %s\n",
              ok ? "PASS" : "FAIL");
  return ok;
}

// ---- one GPU case ------------------------------------------------------------------------------------

struct Layout {
  // q/out: dense (b, i, h, d) at b*bs + i*ss + h*hs + d; ragged (row, h, d) at row*ss + h*hs + d
  int64_t q_bs = 0, q_ss = 0, q_hs = 0, q_count = 0;
  int64_t o_bs = 0, o_ss = 0, o_hs = 0, o_count = 0;
  // k/v: dense (b, t) at b*bs + t*ss; ragged (row) at row*ss; paged (page, slot) at page*bs + slot*ss; + h*hs + d
  int64_t kv_bs = 0, kv_ss = 0, kv_hs = 0, kv_count = 0;
};

// The sm_90a kernel's schedule in run_case: its tile counter from the workspace (the default), or none (fixed order).
bool g_sched_counter = true;
// The policy the test plans its launches with (the passes and --bench's environment knobs set it; the library's
// launchers read no environment).
astrai::AttnPolicy g_policy;

// The launch the policy picks for p on the current device (what the op does).
astrai::PrefillLaunch launch_of(const PrefillParams& p) {
  int device = 0;
  astrai::AttnTarget target{};
  TEST_CUDA_CHECK(cudaGetDevice(&device));
  TEST_CUDA_CHECK(astrai::attn_device_target(device, &target));
  const int64_t page_size = p.paged ? int64_t(1) << p.page_size_log2 : 0;
  return astrai::attn_prefill_choose(p.head_dim, page_size, p.scale_log2 > 0.f, g_policy, target);
}

ErrorStats run_case(const Case& c, Rng& rng) {
  ErrorStats s;
  const int B = c.B, Hq = c.Hq, Hkv = c.Hkv, D = c.D, G = Hq / Hkv;
  const int pad = c.padded ? 8 : 0;

  // Q schedule: rows of each sequence.
  std::vector<int32_t> qo_indptr;
  int32_t Tq = 0, Lq = 0;
  if (c.ragged_q) {
    qo_indptr.push_back(0);
    for (int b = 0; b < B; ++b) qo_indptr.push_back(qo_indptr.back() + c.q_lens[size_t(b)]);
    Tq = qo_indptr.back() + c.slack_rows;
    if (!c.qo_indptr_override.empty()) qo_indptr = c.qo_indptr_override;
  } else {
    Lq = c.q_lens[0];
  }
  auto q_range = [&](int b) -> att::RowRange {
    if (!c.ragged_q) return att::RowRange{0, Lq};
    return att::clamp_indptr(qo_indptr[size_t(b)], qo_indptr[size_t(b) + 1], Tq);
  };

  // KV source.
  const int ps = c.kv == Kv::kPaged ? c.page_size : 1;
  const int max_pages = c.kv == Kv::kPaged ? c.L / ps : 0;
  const int num_pages = c.kv == Kv::kPaged ? B * max_pages + 3 : 0;
  std::vector<int32_t> kv_indptr, kv_lens = c.kv_lens, table;
  int32_t max_kv_len = c.L;
  Layout ly;
  ly.kv_hs = D + pad;
  ly.kv_ss = Hkv * ly.kv_hs + pad;
  if (c.kv == Kv::kRagged) {
    kv_indptr.push_back(0);
    for (int b = 0; b < B; ++b) kv_indptr.push_back(kv_indptr.back() + std::max(c.kv_lens[size_t(b)], 0));
    max_kv_len = kv_indptr.back() + 3;  // Tkv, a few keys past the last sequence
    if (!c.kv_indptr_override.empty()) kv_indptr = c.kv_indptr_override;
    ly.kv_count = int64_t(max_kv_len) * ly.kv_ss + 8;
  } else if (c.kv == Kv::kPaged) {
    ly.kv_bs = ps * ly.kv_ss;
    ly.kv_count = int64_t(num_pages) * ly.kv_bs + 8;
    std::vector<int> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = num_pages - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(rng.integer(0, i))]);
    table.assign(static_cast<size_t>(std::max(B * max_pages, 1)), -1);
    for (int i = 0; i < B * max_pages; ++i) table[size_t(i)] = perm[size_t(i)];
    if (c.bad_pages)
      for (int i = 0; i < B * max_pages; i += 3) table[size_t(i)] = (i % 2) ? -1 - i : num_pages + i;
  } else {
    ly.kv_bs = int64_t(c.L) * ly.kv_ss + pad;
    ly.kv_count = int64_t(B) * ly.kv_bs + 8;
  }
  auto kv_len_of = [&](int b) -> int {
    if (c.kv == Kv::kRagged) return att::clamp_indptr(kv_indptr[size_t(b)], kv_indptr[size_t(b) + 1], max_kv_len).len;
    if (kv_lens.empty()) return max_kv_len;
    return std::min(std::max(kv_lens[size_t(b)], 0), max_kv_len);
  };
  // Element offset of key t of sequence b (head 0), or -1 when its page is invalid.
  auto key_offset = [&](int b, int t) -> int64_t {
    if (c.kv == Kv::kRagged) return int64_t(att::clamp_indptr(kv_indptr[size_t(b)], 0, max_kv_len).lo + t) * ly.kv_ss;
    if (c.kv == Kv::kPaged) {
      const int32_t page = table[size_t(b * max_pages + (t >> log2_of(ps)))];
      if (page < 0 || page >= num_pages) return -1;
      return int64_t(page) * ly.kv_bs + int64_t(t & (ps - 1)) * ly.kv_ss;
    }
    return int64_t(b) * ly.kv_bs + int64_t(t) * ly.kv_ss;
  };

  // q/out layouts.
  ly.q_hs = D + pad;
  ly.q_ss = Hq * ly.q_hs + pad;
  ly.o_hs = D + pad;
  ly.o_ss = Hq * ly.o_hs;
  if (c.ragged_q) {
    ly.q_count = int64_t(Tq) * ly.q_ss + 8;
    ly.o_count = int64_t(Tq) * ly.o_ss + 8;
  } else {
    ly.q_bs = int64_t(Lq) * ly.q_ss + pad;
    ly.o_bs = int64_t(Lq) * ly.o_ss;
    ly.q_count = int64_t(B) * ly.q_bs + 8;
    ly.o_count = int64_t(B) * ly.o_bs + 8;
  }
  auto q_at = [&](int b, int i, int h) -> int64_t {  // row i of sequence b
    if (c.ragged_q) return int64_t(q_range(b).lo + i) * ly.q_ss + int64_t(h) * ly.q_hs;
    return int64_t(b) * ly.q_bs + int64_t(i) * ly.q_ss + int64_t(h) * ly.q_hs;
  };
  auto o_at = [&](int b, int i, int h) -> int64_t {
    if (c.ragged_q) return int64_t(q_range(b).lo + i) * ly.o_ss + int64_t(h) * ly.o_hs;
    return int64_t(b) * ly.o_bs + int64_t(i) * ly.o_ss + int64_t(h) * ly.o_hs;
  };

  std::vector<uint16_t> q(static_cast<size_t>(ly.q_count)), k(static_cast<size_t>(ly.kv_count)),
      v(static_cast<size_t>(ly.kv_count));
  // q in [-1, 1]: scores stay moderate (the decode test's choice); K and V in [-4, 4], never tiny.
  for (auto& x : q) x = float_to_bf16(bf16_to_float(rng.nonzero_bf16()) * 0.25f);
  for (auto& x : k) x = rng.nonzero_bf16();
  for (auto& x : v) x = rng.nonzero_bf16();

  // Masks: keys per mask row M, rows max_q.
  int max_q = c.ragged_q ? 0 : Lq;
  if (c.ragged_q)
    for (int b = 0; b < B; ++b) max_q = std::max(max_q, q_range(b).len);
  const int M = c.kv == Kv::kDense ? c.L : std::max(max_kv_len - 7, 1);  // paged/ragged: M may differ from L
  const int mask_rows = c.mask_dims == 3 ? std::max(max_q, 1) : 1;
  std::vector<uint8_t> mask(static_cast<size_t>(B) * mask_rows * M, 1);
  if (c.mask_dims) {
    for (auto& m : mask) m = rng.integer(0, 3) != 0;
    if (c.mask_dims == 3 && mask_rows > 3)
      for (int t = 0; t < M; ++t) mask[size_t(3) * M + t] = 0;  // sequence 0, row 3: fully masked
  }
  auto keep_mask = [&](int b, int i, int t) -> bool {
    if (!c.mask_dims) return true;
    if (t >= M) return false;
    if (c.mask_dims == 3) return i < mask_rows && mask[(static_cast<size_t>(b) * mask_rows + i) * M + t] != 0;
    return mask[size_t(b) * M + t] != 0;
  };

  const float scale = 1.0f / std::sqrt(float(D));
  // Reference (float64) and the per-element tolerance.
  //   The kernel rounds the softmax weights p to bf16 before P V (relative error <= 2^-9 each) and sums in fp32 with
  //   a 2-ulp exp2; so |got - ref| <= 2^-9 * sum(p |v|) / sum(p) + fp32 noise, plus the final bf16 rounding (half an
  //   ulp of the result, one ulp allowed). Tolerance: bf16_ulp(ref) + 2^-8 * (weighted mean of |v|), twice the
  //   weight-rounding bound, which covers the fp32 terms with margin. The max_ulp column is the error in bf16 ulps of
  //   that weighted mean (the output's natural scale; ulps of a near-zero reference would mean nothing).
  // v_scale: the weighted mean of |v|, the magnitude the output's error is measured against (max_ulp column).
  std::vector<double> ref(static_cast<size_t>(ly.o_count), 0.0), tol(static_cast<size_t>(ly.o_count), 0.0),
      v_scale(static_cast<size_t>(ly.o_count), 0.0);
  std::vector<uint8_t> expect_written(static_cast<size_t>(ly.o_count), 0);
  std::vector<double> sc, wabs;
  std::vector<int64_t> rows;
  for (int b = 0; b < B; ++b) {
    const att::RowRange qr = q_range(b);
    const int kvl = kv_len_of(b);
    for (int i = 0; i < qr.len; ++i) {
      const int64_t pos = int64_t(kvl) - qr.len + i;
      for (int h = 0; h < Hq; ++h) {
        const int kvh = h / G;
        sc.clear();
        rows.clear();
        for (int t = 0; t < kvl; ++t) {
          if (c.causal && t > pos) break;
          if (!keep_mask(b, i, t)) continue;
          const int64_t off = key_offset(b, t);
          if (off < 0) continue;
          const int64_t row = off + int64_t(kvh) * ly.kv_hs;
          double dot = 0;
          const int64_t qa = q_at(b, i, h);
          for (int d = 0; d < D; ++d)
            dot += double(bf16_to_float(q[size_t(qa + d)])) * bf16_to_float(k[size_t(row + d)]);
          sc.push_back(dot * double(scale));
          rows.push_back(row);
        }
        const int64_t oa = o_at(b, i, h);
        for (int d = 0; d < D; ++d) expect_written[size_t(oa + d)] = 1;
        if (sc.empty()) {
          for (int d = 0; d < D; ++d) tol[size_t(oa + d)] = 0.0;  // exact zeros
          continue;
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (auto& x : sc) sum += (x = std::exp(x - mx));
        for (int d = 0; d < D; ++d) {
          double acc = 0, aabs = 0;
          for (size_t n = 0; n < sc.size(); ++n) {
            const double vv = bf16_to_float(v[size_t(rows[n] + d)]);
            acc += sc[n] * vv;
            aabs += sc[n] * std::fabs(vv);
          }
          ref[size_t(oa + d)] = acc / sum;
          tol[size_t(oa + d)] = bf16_ulp(acc / sum) + std::ldexp(aabs / sum, -8);
          v_scale[size_t(oa + d)] = aabs / sum;
        }
      }
    }
  }

  // Device buffers.
  DeviceBuffer<uint16_t> q_d(q.size()), k_d(k.size()), v_d(v.size()), out_d(static_cast<size_t>(ly.o_count));
  q_d.upload(q);
  k_d.upload(k);
  v_d.upload(v);
  TEST_CUDA_CHECK(cudaMemset(out_d.get(), 0xff, out_d.size() * 2));
  DeviceBuffer<int32_t> qo_d(std::max<size_t>(qo_indptr.size(), 1)), kvi_d(std::max<size_t>(kv_indptr.size(), 1)),
      lens_d(std::max<size_t>(kv_lens.size(), 1)), table_d(std::max<size_t>(table.size(), 1));
  if (!qo_indptr.empty()) qo_d.upload(qo_indptr);
  if (!kv_indptr.empty()) kvi_d.upload(kv_indptr);
  if (!kv_lens.empty()) lens_d.upload(kv_lens);
  if (!table.empty()) table_d.upload(table);
  DeviceBuffer<uint8_t> mask_d(mask.size());
  mask_d.upload(mask);

  PrefillParams p{};
  p.q_ptr = q_d.get();
  p.k_ptr = k_d.get();
  p.v_ptr = v_d.get();
  p.out_ptr = out_d.get();
  p.qo_indptr_ptr = c.ragged_q ? qo_d.get() : nullptr;
  p.kv_indptr_ptr = c.kv == Kv::kRagged ? kvi_d.get() : nullptr;
  p.kv_lens_ptr = kv_lens.empty() || c.kv == Kv::kRagged ? nullptr : lens_d.get();
  p.page_table_ptr = c.kv == Kv::kPaged ? table_d.get() : nullptr;
  p.mask_ptr = c.mask_dims ? mask_d.get() : nullptr;
  p.q_batch_stride = ly.q_bs;
  p.q_seq_stride = ly.q_ss;
  p.q_head_stride = ly.q_hs;
  p.k_batch_stride = p.v_batch_stride = ly.kv_bs;
  p.k_seq_stride = p.v_seq_stride = ly.kv_ss;
  p.k_head_stride = p.v_head_stride = ly.kv_hs;
  p.out_batch_stride = ly.o_bs;
  p.out_seq_stride = ly.o_ss;
  p.out_head_stride = ly.o_hs;
  p.page_table_batch_stride = max_pages;
  p.mask_batch_stride = int64_t(mask_rows) * M;
  p.mask_q_stride = c.mask_dims == 3 ? M : 0;
  p.batch = B;
  p.num_q_heads = Hq;
  p.num_kv_heads = Hkv;
  p.head_dim = D;
  p.q_len = c.ragged_q ? Tq : Lq;
  p.max_kv_len = max_kv_len;
  p.mask_len = M;
  p.mask_q_len = c.mask_dims == 3 ? mask_rows : INT32_MAX;
  p.num_pages = num_pages;
  p.page_size_log2 = log2_of(ps);
  p.scale_log2 = float(double(scale) * 1.4426950408889634);
  p.is_causal = c.causal;
  p.paged = c.kv == Kv::kPaged;
  const astrai::PrefillPlan plan = astrai::attn_prefill_plan(p);
  p.num_q_tiles = plan.num_q_tiles;
  DeviceBuffer<int32_t> ws(static_cast<size_t>(std::max<int64_t>(plan.workspace_bytes / 4, 1)));
  // Every tile-map entry must be rewritten, and the launcher must zero the counter (else tiles are skipped and
  // their rows stay poisoned).
  TEST_CUDA_CHECK(cudaMemset(ws.get(), 0x7f, ws.size() * 4));
  if (c.ragged_q) {
    p.q_tile_to_batch = ws.get();
    p.q_tile_to_index = ws.get() + plan.num_q_tiles;
  }
  if (g_sched_counter) p.sched_counter_ptr = ws.get() + (plan.workspace_bytes / 4 - 1);
  const cudaError_t st = astrai::attn_prefill_bf16_launch(p, launch_of(p), nullptr);
  if (st != cudaSuccess) {
    s.fail(std::string("launch returned ") + cudaGetErrorName(st));
    return s;
  }
  TEST_CUDA_CHECK(cudaGetLastError());
  TEST_CUDA_CHECK(cudaDeviceSynchronize());

  char what[320];
  // The device tile map against the brute force.
  if (c.ragged_q && plan.num_q_tiles > 0) {
    std::vector<int32_t> got, want_b, want_i;
    ws.download(got);
    const int rows_log2 = att::prefill_tile_rows_log2(D, G);
    tile_map_brute(qo_indptr, Tq, rows_log2, plan.num_q_tiles, want_b, want_i);
    for (int32_t i = 0; i < plan.num_q_tiles; ++i) {
      if (got[size_t(i)] != want_b[size_t(i)] || got[size_t(plan.num_q_tiles + i)] != want_i[size_t(i)]) {
        std::snprintf(what, sizeof what, "tile map entry %d: (%d, %d), want (%d, %d)", i, got[size_t(i)],
                      got[size_t(plan.num_q_tiles + i)], want_b[size_t(i)], want_i[size_t(i)]);
        s.fail(what);
        break;
      }
    }
  }

  std::vector<uint16_t> out;
  out_d.download(out);
  for (int64_t e = 0; e < ly.o_count; ++e) {
    const uint16_t bits = out[size_t(e)];
    if (!expect_written[size_t(e)]) {  // padding, slack rows, rows of no sequence: still poisoned
      if (bits != kPoison && c.check_values) {
        std::snprintf(what, sizeof what, "out element %" PRId64 " outside the written region was written (0x%04x)",
                      e, bits);
        s.fail(what);
      }
      continue;
    }
    if (!c.check_values) continue;
    const double r = ref[size_t(e)], g = bf16_to_float(bits), tl = tol[size_t(e)];
    const double err = std::fabs(g - r);
    ++s.checked;
    if (bits == kPoison || std::isnan(g) || !(err <= tl)) {
      std::snprintf(what, sizeof what, "out element %" PRId64 ": got %.6g (0x%04x), reference %.6g, tol %.3g", e, g,
                    bits,
                    r, tl);
      s.fail(what);
      continue;
    }
    s.max_abs = std::max(s.max_abs, err);
    if (v_scale[size_t(e)] > 0) s.max_ulp = std::max(s.max_ulp, err / bf16_ulp(v_scale[size_t(e)]));
    if (tl > 0) s.max_tol_ratio = std::max(s.max_tol_ratio, err / tl);
  }
  return s;
}

std::vector<Case> make_cases(bool small, Rng& rng) {
  std::vector<Case> cs;
  const std::vector<std::pair<int, int>> heads = {{4, 4}, {8, 4}, {8, 2}, {16, 2}, {12, 1}, {8, 1}};
  if (!small) {
    // Every head_dim x GQA ratio (1, 2, 4, 8, MQA 12), dense Q and K/V, causal with q_len < kv_len.
    int n = 0;
    for (int D : {64, 128, 256})
      for (auto hk : heads) {
        Case c{2, hk.first, hk.second, D};
        c.q_lens = {70};
        c.L = 100;
        c.causal = (n++ % 2) == 0;
        cs.push_back(c);
      }
  }
  // Ragged Q [70, 0, 10, 130] over contiguous ragged K/V (q_len < kv_len), causal and not, slack rows after.
  for (int D : small ? std::vector<int>{128} : std::vector<int>{64, 128, 256})
    for (bool causal : {false, true}) {
      Case c{4, 8, 2, D};
      c.ragged_q = true;
      c.q_lens = {70, 0, 10, 130};
      c.kv = Kv::kRagged;
      c.kv_lens = {100, 5, 10, 200};
      c.causal = causal;
      c.slack_rows = 5;
      cs.push_back(c);
      if (small) break;
    }
  // Paged: page sizes 1, 16, 128 with invalid page ids; ragged and dense Q.
  for (int ps : small ? std::vector<int>{16} : std::vector<int>{1, 16, 128}) {
    Case c{4, 16, 4, 128};
    c.ragged_q = true;
    c.q_lens = {70, 10, 130, 0};
    c.kv = Kv::kPaged;
    c.page_size = ps;
    c.L = 384;
    c.kv_lens = {150, 10, 300, 20};
    c.causal = ps != 16;
    c.bad_pages = true;
    cs.push_back(c);
    if (!small) {
      Case d = c;
      d.ragged_q = false;
      d.q_lens = {40};
      d.bad_pages = false;
      d.causal = !c.causal;
      d.Hq = 8;
      d.Hkv = 8;
      cs.push_back(d);
    }
  }
  // Masks: 2-D and 3-D (sequence 0 row 3 fully masked), with causal; dense and ragged Q; paged with a mask.
  for (int md : {2, 3}) {
    Case c{2, 8, 2, small ? 64 : 128};
    c.q_lens = {50};
    c.L = 90;
    c.mask_dims = md;
    c.causal = md == 3;
    cs.push_back(c);
    if (!small) {
      Case r{3, 8, 4, 64};
      r.ragged_q = true;
      r.q_lens = {20, 45, 7};
      r.kv = Kv::kPaged;
      r.page_size = 8;
      r.L = 128;
      r.kv_lens = {60, 100, 7};
      r.mask_dims = md;
      r.causal = md == 2;
      cs.push_back(r);
    }
  }
  // Causal with q_len > kv_len (early rows keep nothing: zeros), dense kv_lens (0 and over-long clamp), D = 256.
  {
    Case c{3, 8, 2, small ? 256 : 128};
    c.q_lens = {50};
    c.L = 64;
    c.kv_lens = {30, 0, 100};
    c.causal = true;
    cs.push_back(c);
  }
  // Strided views.
  if (!small) {
    Case c{2, 8, 4, 64};
    c.q_lens = {33};
    c.L = 77;
    c.padded = true;
    c.causal = true;
    cs.push_back(c);
    Case r = c;
    r.ragged_q = true;
    r.q_lens = {33, 17};
    r.kv = Kv::kRagged;
    r.kv_lens = {40, 77};
    r.D = 256;
    cs.push_back(r);
  }
  // Inconsistent indptr: decreasing and past Tq / Tkv (clamped: sequence 2 is empty, 1 runs to the end).
  {
    Case c{3, 8, 2, 128};
    c.ragged_q = true;
    c.q_lens = {40, 60, 0};
    c.kv = Kv::kRagged;
    c.kv_lens = {50, 70, 0};
    c.causal = true;
    c.qo_indptr_override = {0, 40, 1000, 30};       // Tq = 100
    c.kv_indptr_override = {-5, 50, 5000, 10};      // Tkv = 123
    cs.push_back(c);
    // Overlapping sequences (racy values, more tiles than the plan's bound): safety only.
    Case o = c;
    o.qo_indptr_override = {0, 100, 0, 100};
    o.kv_indptr_override = {0, 120, 0, 120};
    o.check_values = false;
    cs.push_back(o);
  }
  // Many sequences: the tile-map kernel's chunks (512 sequences each).
  if (!small) {
    Case c{1100, 4, 4, 64};
    c.ragged_q = true;
    for (int b = 0; b < c.B; ++b) c.q_lens.push_back(int(rng.integer(0, 3)));
    c.kv = Kv::kRagged;
    for (int b = 0; b < c.B; ++b) c.kv_lens.push_back(int(rng.integer(0, 5)));
    c.causal = true;
    cs.push_back(c);
  }
  // Random shapes.
  const int n_random = small ? 1 : 8;
  for (int i = 0; i < n_random; ++i) {
    const int hkv = int(rng.integer(1, 3)), g = std::vector<int>{1, 2, 4, 8, 3, 6}[size_t(rng.integer(0, 5))];
    const int D = std::vector<int>{64, 128, 256}[size_t(rng.integer(0, 2))];
    Case c{int(rng.integer(1, 4)), hkv * g, hkv, D};
    c.ragged_q = rng.integer(0, 1) == 1;
    const int kvk = int(rng.integer(0, 2));
    c.kv = kvk == 0 ? Kv::kDense : kvk == 1 ? Kv::kRagged : Kv::kPaged;
    c.page_size = 1 << rng.integer(0, 7);
    c.L = int((rng.integer(1, 300) + c.page_size - 1) / c.page_size * c.page_size);
    if (c.ragged_q) {
      for (int b = 0; b < c.B; ++b) c.q_lens.push_back(int(rng.integer(0, 150)));
    } else {
      c.q_lens = {int(rng.integer(1, 150))};
    }
    if (c.kv != Kv::kDense || rng.integer(0, 1))
      for (int b = 0; b < c.B; ++b) c.kv_lens.push_back(int(rng.integer(0, c.L)));
    c.causal = rng.integer(0, 1) == 1;
    c.mask_dims = std::vector<int>{0, 0, 2, 3}[size_t(rng.integer(0, 3))];
    c.bad_pages = c.kv == Kv::kPaged && rng.integer(0, 1);
    cs.push_back(c);
  }
  return cs;
}

bool check_rejections() {
  PrefillParams p{};
  void* dummy = nullptr;
  TEST_CUDA_CHECK(cudaMalloc(&dummy, 4096));
  p.q_ptr = p.k_ptr = p.v_ptr = p.out_ptr = dummy;
  p.batch = 1;
  p.num_q_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.q_len = 8;
  p.max_kv_len = 8;
  p.q_seq_stride = p.k_seq_stride = p.v_seq_stride = p.out_seq_stride = 512;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.out_head_stride = 128;
  p.num_q_tiles = astrai::attn_prefill_plan(p).num_q_tiles;
  bool ok = p.num_q_tiles == 1;
  auto rejects = [&](PrefillParams bad) {
    return astrai::attn_prefill_bf16_launch(bad, astrai::PrefillLaunch{astrai::PrefillKernel::kMma, false}, nullptr) ==
           cudaErrorInvalidValue;
  };
  PrefillParams b = p;
  b.head_dim = 96;
  ok = ok && rejects(b);  // unsupported head_dim
  b = p;
  b.num_q_heads = 3;
  ok = ok && rejects(b);  // not a multiple of Hkv
  b = p;
  b.num_q_tiles = 7;
  ok = ok && rejects(b);  // not the plan's
  b = p;
  b.qo_indptr_ptr = static_cast<const int32_t*>(dummy);
  b.num_q_tiles = astrai::attn_prefill_plan(b).num_q_tiles;
  ok = ok && rejects(b);  // ragged without the tile-map workspace
  b = p;
  b.q_ptr = static_cast<const char*>(dummy) + 2;
  ok = ok && rejects(b);  // misaligned
  b = p;
  b.k_seq_stride = 100;
  ok = ok && rejects(b);  // stride not a multiple of 8
  b = p;
  b.paged = true;
  ok = ok && rejects(b);  // paged without a page table
  b = p;
  b.scale_log2 = -1.f;  // the sm_90a kernel takes a positive scale only: a launch that names it is refused
  ok = ok && astrai::attn_prefill_bf16_launch(b, astrai::PrefillLaunch{astrai::PrefillKernel::kSm90, true}, nullptr) ==
                 cudaErrorInvalidValue;
  b = p;
  b.head_dim = 64;  // and head_dim 128 only
  b.num_q_tiles = astrai::attn_prefill_plan(b).num_q_tiles;
  b.q_head_stride = b.k_head_stride = b.v_head_stride = b.out_head_stride = 64;
  b.scale_log2 = 1.f;
  ok = ok && astrai::attn_prefill_bf16_launch(b, astrai::PrefillLaunch{astrai::PrefillKernel::kSm90, true}, nullptr) ==
                 cudaErrorInvalidValue;
  b = p;
  b.batch = 0;
  ok = ok && astrai::attn_prefill_bf16_launch(b, astrai::PrefillLaunch{astrai::PrefillKernel::kMma, false}, nullptr) ==
                 cudaSuccess;  // nothing to do
  TEST_CUDA_CHECK(cudaGetLastError());
  TEST_CUDA_CHECK(cudaFree(dummy));
  std::printf("launcher rejects inconsistent params with cudaErrorInvalidValue: %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

// ---- --bench ---------------------------------------------------------------------------------------------

__global__ void fill_random_bf16(uint16_t* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float f = (float(h & 0xffffu) / 65535.f) * 2.f - 1.f;  // [-1, 1], never all zeros
    x[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}

// Logical page i of sequence i / pages_per_seq (page_elems contiguous elements) -> physical page table[i].
__global__ void scatter_pages(const uint4* src, uint4* dst, const int32_t* table, int64_t page_chunks) {
  const uint4* s = src + int64_t(blockIdx.x) * page_chunks;
  uint4* d = dst + int64_t(table[blockIdx.x]) * page_chunks;
  for (int64_t i = threadIdx.x; i < page_chunks; i += blockDim.x) d[i] = s[i];
}

__global__ void count_diff_u16(const uint16_t* a, const uint16_t* b, int64_t n, unsigned long long* diff) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(diff, local);
}

// Per shape: contiguous K/V, then the same keys on shuffled pages of ps keys (16 unless --page-size); the paged
// output must equal the contiguous one bitwise ("bitwise" column, on the paged row).
int run_bench(const cudaDeviceProp& prop, int ps) {
  const char* knob = std::getenv("ASTRAI_PREFILL_SM90");
  const char* tma_knob = std::getenv("ASTRAI_PREFILL_SM90_TMA");
  g_policy.prefill_sm90 = !(knob && std::strcmp(knob, "0") == 0);
  g_policy.prefill_tma = !(tma_knob && std::strcmp(tma_knob, "0") == 0);
  std::printf("bench: %s, GQA 32/8, D=128, dense Q, CUDA events, median of repeats after warm-up\n", prop.name);
  std::printf("ASTRAI_PREFILL_SM90=%s (unset or 1: the sm_90a kernel where it applies; 0: mma.sync)\n",
              knob ? knob : "unset");
  std::printf("ASTRAI_PREFILL_SM90_TMA=%s (unset or 1: whole K/V tiles by TMA; 0: cp.async only)\n",
              tma_knob ? tma_knob : "unset");
  std::printf("%-3s %-6s %-7s %-11s %-8s %12s %10s %8s\n", "B", "L", "causal", "kv", "sched", "us", "TFLOP/s",
              "bitwise");
  const int Hq = 32, Hkv = 8, D = 128;
  int status = 0;
  for (int B : {1, 8})
    for (int L : {2048, 8192})
      for (int causal = 0; causal < 2; ++causal) {
        const int64_t q_count = int64_t(B) * L * Hq * D, kv_count = int64_t(B) * L * Hkv * D;
        DeviceBuffer<uint16_t> q(static_cast<size_t>(q_count)), k(static_cast<size_t>(kv_count)),
            v(static_cast<size_t>(kv_count)), o(static_cast<size_t>(q_count)), o_contig(static_cast<size_t>(q_count));
        DeviceBuffer<uint16_t> kp(static_cast<size_t>(kv_count)), vp(static_cast<size_t>(kv_count));
        fill_random_bf16<<<1024, 256>>>(q.get(), q_count, 1u);
        fill_random_bf16<<<1024, 256>>>(k.get(), kv_count, 2u);
        fill_random_bf16<<<1024, 256>>>(v.get(), kv_count, 3u);
        const int max_pages = L / ps, num_pages = B * max_pages;
        std::vector<int32_t> table(static_cast<size_t>(num_pages)), lens(static_cast<size_t>(B), L);
        std::iota(table.begin(), table.end(), 0);
        Rng rng(7);
        for (int i = num_pages - 1; i > 0; --i) std::swap(table[size_t(i)], table[size_t(rng.integer(0, i))]);
        DeviceBuffer<int32_t> table_d(table.size()), lens_d(lens.size());
        table_d.upload(table);
        lens_d.upload(lens);
        const int64_t page_chunks = int64_t(ps) * Hkv * D / 8;  // (ps, Hkv, D) in 16-byte chunks
        scatter_pages<<<num_pages, 256>>>(reinterpret_cast<const uint4*>(k.get()), reinterpret_cast<uint4*>(kp.get()),
                                          table_d.get(), page_chunks);
        scatter_pages<<<num_pages, 256>>>(reinterpret_cast<const uint4*>(v.get()), reinterpret_cast<uint4*>(vp.get()),
                                          table_d.get(), page_chunks);
        TEST_CUDA_CHECK(cudaGetLastError());
        for (int paged = 0; paged < 2; ++paged) {
          PrefillParams p{};
          p.q_ptr = q.get();
          p.k_ptr = paged ? kp.get() : k.get();
          p.v_ptr = paged ? vp.get() : v.get();
          p.out_ptr = o.get();
          p.q_batch_stride = p.out_batch_stride = int64_t(L) * Hq * D;
          p.q_seq_stride = p.out_seq_stride = int64_t(Hq) * D;
          p.q_head_stride = p.out_head_stride = D;
          p.k_seq_stride = p.v_seq_stride = int64_t(Hkv) * D;
          p.k_head_stride = p.v_head_stride = D;
          p.k_batch_stride = p.v_batch_stride = paged ? int64_t(ps) * Hkv * D : int64_t(L) * Hkv * D;
          if (paged) {
            p.page_table_ptr = table_d.get();
            p.kv_lens_ptr = lens_d.get();
            p.page_table_batch_stride = max_pages;
            p.num_pages = num_pages;
            p.page_size_log2 = log2_of(ps);
            p.paged = true;
          }
          p.batch = B;
          p.num_q_heads = Hq;
          p.num_kv_heads = Hkv;
          p.head_dim = D;
          p.q_len = L;
          p.max_kv_len = L;
          p.scale_log2 = float(1.0 / std::sqrt(double(D)) * 1.4426950408889634);
          p.is_causal = causal != 0;
          const astrai::PrefillPlan plan = astrai::attn_prefill_plan(p);
          p.num_q_tiles = plan.num_q_tiles;
          DeviceBuffer<int32_t> ws(static_cast<size_t>(plan.workspace_bytes / 4));
          // sched 0: the tile counter (what the op passes); 1: none, the sm_90a kernel's fixed order. Both must
          // give the bits of the first contiguous row.
          for (int sched = 0; sched < 2; ++sched) {
            p.sched_counter_ptr = sched == 0 ? ws.get() + (ws.size() - 1) : nullptr;
            GpuTimer timer;
            std::vector<float> ms;
            const int reps = L >= 8192 && B == 8 ? 10 : 30;
            for (int r = 0; r < reps + 3; ++r) {
              timer.start();
              const cudaError_t st = astrai::attn_prefill_bf16_launch(p, launch_of(p), nullptr);
              const float t = timer.stop();
              if (st != cudaSuccess) {
                std::fprintf(stderr, "launch returned %s\n", cudaGetErrorName(st));
                return 2;
              }
              if (r >= 3) ms.push_back(t);
            }
            TEST_CUDA_CHECK(cudaDeviceSynchronize());
            const char* bitwise = "-";
            if (!paged && sched == 0) {
              TEST_CUDA_CHECK(cudaMemcpy(o_contig.get(), o.get(), size_t(q_count) * 2, cudaMemcpyDeviceToDevice));
            } else {
              DeviceBuffer<unsigned long long> diff(1);
              TEST_CUDA_CHECK(cudaMemset(diff.get(), 0, sizeof(unsigned long long)));
              count_diff_u16<<<1024, 256>>>(o.get(), o_contig.get(), q_count, diff.get());
              std::vector<unsigned long long> h;
              diff.download(h);
              // Pages of 16 are copied in page groups, which take the contiguous kernel's softmax steps: the same
              // tiles in the same order, so the bits must agree (per-row page offsets, pages of 1..4 keys, take
              // their own steps at D = 128: prefill_schedule.h); the schedule never changes a tile's arithmetic.
              bitwise = h[0] == 0 ? "yes" : "NO";
              if (h[0] != 0) status = 1;
            }
            std::sort(ms.begin(), ms.end());
            const double med = ms[ms.size() / 2] * 1e-3;
            const double pairs = causal ? double(L) * (L + 1) / 2 : double(L) * L;  // (row, key) pairs kept
            const double flops = 4.0 * B * Hq * D * pairs;
            const std::string kv = paged ? "paged-" + std::to_string(ps) : "contiguous";
            std::printf("%-3d %-6d %-7d %-11s %-8s %12.1f %10.1f %8s\n", B, L, causal, kv.c_str(),
                        sched == 0 ? "counter" : "fixed", med * 1e6, flops / med * 1e-12, bitwise);
          }
        }
      }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  // --bench, --page-size and --host are this test's own flags; the rest are the house options.
  bool bench = false, host_only = false;
  int bench_page_size = 16;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--bench") == 0) {
      bench = true;
    } else if (i > 0 && i + 1 < argc && std::strcmp(argv[i], "--page-size") == 0) {
      bench_page_size = std::atoi(argv[++i]);
      // Pages of 1..4 keys take other softmax steps than contiguous K/V: the bench's bitwise check needs >= 8.
      if (bench_page_size < 8 || bench_page_size > 128 || (bench_page_size & (bench_page_size - 1)) != 0) {
        std::fprintf(stderr, "--page-size: expected a power of two from 8 to 128, got %s\n", argv[i]);
        return 2;
      }
    } else if (i > 0 && std::strcmp(argv[i], "--host") == 0) {
      host_only = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  const TestOptions opts = parse_test_options(int(args.size()), args.data());
  if (!opts.ok) {
    std::fprintf(stderr,
                 "       %s --bench [--page-size N]: time the goal shapes (paged: pages of N keys, 16 by default); "
                 "--host: the host index proofs only (no GPU)\n",
                 argv[0]);
    return 2;
  }
  if (host_only) {
    Rng rng(opts.seed);
    std::printf("attn_prefill_test --host: seed %llu\n", static_cast<unsigned long long>(opts.seed));
    return host_index_checks(rng) ? 0 : 1;
  }
  const cudaDeviceProp prop = print_test_banner("attn_prefill_test", opts);
  if (bench) return run_bench(prop, bench_page_size);
  Rng rng(opts.seed);
  const bool host_ok = host_index_checks(rng);
  const std::vector<Case> cases = make_cases(opts.small, rng);
  int failed = 0, index = 0;
  // On compute capability 9.0 the launcher takes the sm_90a wgmma kernel at head_dim 128 (where the image has its
  // code): a second pass runs it without the tile counter (its fixed order) and with every K/V tile copied by
  // cp.async (policy prefill_tma off; the first pass copies whole contiguous tiles by TMA), a third with the policy's
  // prefill_sm90 off runs the table on the mma.sync kernel too.
  const int passes = prop.major == 9 && prop.minor == 0 ? 3 : 1;
  for (int pass = 0; pass < passes; ++pass) {
    if (pass == 1) {
      g_sched_counter = false;
      g_policy.prefill_tma = false;
      std::printf("second pass, no tile counter (the sm_90a kernel's fixed order), K/V by cp.async only\n");
    } else if (pass == 2) {
      g_sched_counter = true;
      g_policy.prefill_tma = true;
      g_policy.prefill_sm90 = false;
      std::printf("third pass, policy prefill_sm90 off (head_dim 128 on the mma.sync kernel)\n");
    }
    print_table_header();
    for (const Case& c : cases) {
      const ErrorStats s = run_case(c, rng);
      print_table_row(index++, c.name(), s);
      failed += s.failures > 0;
    }
  }
  const bool rejections_ok = check_rejections();
  const int total = passes * int(cases.size()) + 2;
  return test_exit_status(failed + (host_ok ? 0 : 1) + (rejections_ok ? 0 : 1), total, opts.seed);
}
