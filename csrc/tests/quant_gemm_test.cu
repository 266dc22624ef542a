// Standalone correctness table for the GEMM launcher (kernels/gemm/gemm.h) against a float64 host reference (no
// torch): every pair x layout x recipe x awkward shape, with scales, bias and output dtypes; outputs and workspace
// poisoned first, padding checked untouched, a negative control on every row; --bench times Llama-size shapes.
// Usage: quant_gemm_test [--small] [--seed N] | --bench. Exit status: 0 all pass, 1 a case failed, 2 a CUDA error.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "kernels/common/host/align.h"
#include "kernels/gemm/gemm.h"
#include "tests/test_utils.cuh"

namespace {

using namespace astrai;
using namespace astrai_test;

// ---- element types and pairs ------------------------------------------------------------------------------

enum class Elem { kBf16, kF16, kS8, kE4m3, kE5m2 };
enum class Group { kW16A16, kW8A16, kW8A8, kFp8 };

int elem_bytes(Elem e) { return e == Elem::kBf16 || e == Elem::kF16 ? 2 : 1; }

struct PairInfo {
  GemmPair pair;
  const char* name;
  Elem a, b;
  Group group;
};
constexpr PairInfo kPairs[] = {
    {GemmPair::kBf16Bf16, "bf16xbf16", Elem::kBf16, Elem::kBf16, Group::kW16A16},
    {GemmPair::kF16F16, "f16xf16", Elem::kF16, Elem::kF16, Group::kW16A16},
    {GemmPair::kBf16S8, "bf16xs8", Elem::kBf16, Elem::kS8, Group::kW8A16},
    {GemmPair::kF16S8, "f16xs8", Elem::kF16, Elem::kS8, Group::kW8A16},
    {GemmPair::kS8S8, "s8xs8", Elem::kS8, Elem::kS8, Group::kW8A8},
    {GemmPair::kE4m3E4m3, "e4m3xe4m3", Elem::kE4m3, Elem::kE4m3, Group::kFp8},
    {GemmPair::kE5m2E4m3, "e5m2xe4m3", Elem::kE5m2, Elem::kE4m3, Group::kFp8},
    {GemmPair::kE4m3E5m2, "e4m3xe5m2", Elem::kE4m3, Elem::kE5m2, Group::kFp8},
};
constexpr int kNumPairs = int(sizeof(kPairs) / sizeof(kPairs[0]));

// The smallest K whose rows are whole 16-byte chunks in both operands: 8 for 16-bit pairs, 16 with an 8-bit operand.
int min_aligned_k(const PairInfo& pi) { return 16 / std::min(elem_bytes(pi.a), elem_bytes(pi.b)); }

uint16_t float_to_f16_bits(float f) {
  const __half_raw r = __float2half_rn(f);
  return r.x;
}
float f16_bits_to_float(uint16_t bits) {
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}

double elem_value(Elem e, uint16_t code) {
  switch (e) {
    case Elem::kBf16: return bf16_to_float(code);
    case Elem::kF16: return f16_bits_to_float(code);
    case Elem::kS8: return double(int8_t(uint8_t(code)));
    case Elem::kE4m3: return e4m3_to_float(uint8_t(code));
    default: return e5m2_to_float(uint8_t(code));
  }
}

// A random element: integers in [lo, hi] when `integers` (exact in every type used with it), else bf16 / fp16 in
// [-2, 2], any int8, fp8 of magnitude 2^-4 .. 7.5 (random sign and mantissa: products stay in range of fp16 outputs).
uint16_t random_code(Elem e, bool integers, int lo, int hi, Rng& rng) {
  if (e == Elem::kS8) return uint16_t(uint8_t(int8_t(rng.integer(integers ? lo : -128, integers ? hi : 127))));
  if (e == Elem::kE4m3 || e == Elem::kE5m2) {
    const int mbits = e == Elem::kE4m3 ? 3 : 2, bias = e == Elem::kE4m3 ? 7 : 15;
    const int exp = int(rng.integer(bias - 4, bias + 2)), man = int(rng.integer(0, (1 << mbits) - 1));
    return uint16_t((rng.integer(0, 1) << 7) | (exp << mbits) | man);
  }
  const float v = integers ? float(rng.integer(lo, hi)) : float(rng.uniform(-2.0, 2.0));
  return e == Elem::kBf16 ? float_to_bf16(v) : float_to_f16_bits(v);
}

// ---- layouts ---------------------------------------------------------------------------------------------

// Operand layouts, named as the op's `layout` argument: first letter a, second b; "n" stores a as [M, K] and b as
// [K, N], "t" stores a as [K, M] and b as [N, K].
struct Layout {
  const char* name;
  int code;             // the op's layout int
  bool a_k_contiguous;  // a stored [M, K] (else [K, M])
  bool b_k_contiguous;  // b stored [N, K] (else [K, N])
};
constexpr Layout kLayouts[] = {
    {"nt", 0, true, true},
    {"nn", 1, true, false},
    {"tn", 2, false, false},
    {"tt", 3, false, true},
};

// ---- cases -----------------------------------------------------------------------------------------------

enum class Scale { kNone, kTensor, kVector };  // kVector: one value per row of a / per column of b

struct Epilogue {
  Scale a_scale = Scale::kNone, b_scale = Scale::kNone;
  GemmBias bias = GemmBias::kNone;
  GemmOut out = GemmOut::kBf16;
  // Small-integer operands, fp32 (or raw s32) out, no scales, integer bias: the result must be bit exact.
  bool exact = false;
};

const char* scale_name(Scale s, bool col) {
  return s == Scale::kNone ? "-" : s == Scale::kTensor ? "t" : col ? "col" : "row";
}
const char* bias_name(GemmBias b) {
  return b == GemmBias::kNone ? "-" : b == GemmBias::kBf16 ? "bf16" : b == GemmBias::kF16 ? "f16" : "f32";
}
const char* out_name(GemmOut o) {
  return o == GemmOut::kBf16 ? "bf16" : o == GemmOut::kF16 ? "f16" : o == GemmOut::kF32 ? "f32" : "s32";
}
int out_bytes(GemmOut o) { return o == GemmOut::kBf16 || o == GemmOut::kF16 ? 2 : 4; }

struct Case {
  int pair = 0, layout = 0, recipe = 0;
  int m = 1, n = 1, k = 1;
  int split_k = 1;
  int batch = 1;
  bool a_batched = true, b_batched = true;  // an unbatched operand broadcasts (batch stride 0)
  bool padded = false;  // 16 bytes more per stored operand row and between batches (poisoned)
  int out_pad = 0;      // elements past n in each output row (must stay poison)
  Epilogue epi;

  const PairInfo& info() const { return kPairs[pair]; }
  std::string name() const {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s %s r%d %dx%dx%d s%d%s%s a:%s b:%s bias:%s ->%s%s", info().name,
                  kLayouts[layout].name, recipe, m, n, k, split_k,
                  batch > 1
                      ? (" B" + std::to_string(batch) + (a_batched ? "" : "/a1") + (b_batched ? "" : "/b1")).c_str()
                      : "",
                  padded ? " pad" : "", scale_name(epi.a_scale, false), scale_name(epi.b_scale, true),
                  bias_name(epi.bias), out_name(epi.out), epi.exact ? " exact" : "");
    return buf;
  }
};

// Every epilogue the op's contract allows for the pair (docs/contracts.md, GEMM ops), exact ones aside.
std::vector<Epilogue> epilogues_of(const PairInfo& pi) {
  std::vector<Scale> as{Scale::kNone}, bs{Scale::kNone};
  if (pi.group == Group::kW8A16) bs = {Scale::kTensor, Scale::kVector};
  if (pi.group == Group::kW8A8) as = bs = {Scale::kTensor, Scale::kVector};
  if (pi.group == Group::kFp8) as = bs = {Scale::kNone, Scale::kTensor, Scale::kVector};
  std::vector<Epilogue> out;
  for (Scale a : as)
    for (Scale b : bs)
      for (GemmBias bias : {GemmBias::kNone, GemmBias::kBf16, GemmBias::kF16, GemmBias::kF32})
        for (GemmOut o : {GemmOut::kBf16, GemmOut::kF16, GemmOut::kF32}) out.push_back(Epilogue{a, b, bias, o, false});
  return out;
}

bool has_exact(const PairInfo& pi) { return pi.group != Group::kFp8; }

// s8 x s8: the raw s32 accumulators. Otherwise fp32 out of small integers, bias none or an integer bf16 vector.
Epilogue exact_epilogue(const PairInfo& pi, int variant) {
  Epilogue e;
  e.exact = true;
  e.out = pi.group == Group::kW8A8 ? GemmOut::kS32 : GemmOut::kF32;
  if (pi.group != Group::kW8A8 && variant % 2 == 1) e.bias = GemmBias::kBf16;
  return e;
}

// ---- operands as stored ----------------------------------------------------------------------------------

// One operand: `count` matrices of logical [rows][K] (rows = M for a, N for b), stored K-contiguous ([rows][ld])
// or K-outer ([K][ld]). Row stride and batch stride keep every row on a 16-byte boundary, as the op requires.
struct Operand {
  std::vector<double> value;  // [count][rows][K] logical values
  std::vector<uint8_t> bytes; // the allocation
  int64_t ld = 0, batch_stride = 0;
};

Operand make_operand(Elem e, int count, int rows, int k, bool k_contiguous, bool padded, bool integers, int lo,
                     int hi, Rng& rng) {
  Operand op;
  const int eb = elem_bytes(e);
  const int64_t align = 16 / eb;
  const int64_t stored_rows = k_contiguous ? rows : k, stored_cols = k_contiguous ? k : rows;
  op.ld = ceil_div<int64_t>(std::max<int64_t>(stored_cols, 1), align) * align + (padded ? align : 0);
  op.batch_stride = stored_rows * op.ld + (padded ? align : 0);
  // Padding poison: NaN in bf16 / fp16 / e4m3 / e5m2, 127 in int8: a read past K shows in the sum.
  const uint8_t poison = eb == 2 ? 0xff : 0x7f;
  op.bytes.assign(size_t(std::max<int64_t>(count * op.batch_stride * eb, 16)), poison);
  op.value.resize(size_t(count) * rows * k);
  for (int c = 0; c < count; ++c)
    for (int r = 0; r < rows; ++r)
      for (int kk = 0; kk < k; ++kk) {
        const uint16_t code = random_code(e, integers, lo, hi, rng);
        const int64_t at = c * op.batch_stride + (k_contiguous ? r * op.ld + kk : kk * op.ld + r);
        std::memcpy(op.bytes.data() + at * eb, &code, size_t(eb));  // little endian: the low byte for 8-bit
        op.value[(size_t(c) * rows + r) * k + kk] = elem_value(e, code);
      }
  return op;
}

// ---- reference and checks --------------------------------------------------------------------------------

// Spacing of the output type's values at magnitude |x| (1 for s32).
double out_ulp(GemmOut o, double x) {
  x = std::fabs(x);
  int e = 0;
  switch (o) {
    case GemmOut::kBf16: return bf16_ulp(x);
    case GemmOut::kF16:
      if (x < std::ldexp(1.0, -14)) return std::ldexp(1.0, -24);
      std::frexp(x, &e);
      return std::ldexp(1.0, e - 11);
    case GemmOut::kF32:
      if (x < std::ldexp(1.0, -126)) return std::ldexp(1.0, -149);
      std::frexp(x, &e);
      return std::ldexp(1.0, e - 24);
    default: return 1.0;
  }
}

// The output element at `p` as a number, and its bits (16 or 32).
double out_value(GemmOut o, const uint8_t* p) {
  uint16_t h;
  uint32_t w;
  switch (o) {
    case GemmOut::kBf16: std::memcpy(&h, p, 2); return bf16_to_float(h);
    case GemmOut::kF16: std::memcpy(&h, p, 2); return f16_bits_to_float(h);
    case GemmOut::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    default: std::memcpy(&w, p, 4); return double(int32_t(w));
  }
}
uint32_t out_bits(GemmOut o, const uint8_t* p) {
  uint32_t w = 0;
  std::memcpy(&w, p, size_t(out_bytes(o)));
  return w;
}
// The output type's encoding of v (round to nearest even; s32 truncates an integer-valued v).
uint32_t encode_out(GemmOut o, double v) {
  switch (o) {
    case GemmOut::kBf16: return float_to_bf16(float(v));
    case GemmOut::kF16: return float_to_f16_bits(float(v));
    case GemmOut::kF32: {
      const float f = float(v);
      uint32_t w;
      std::memcpy(&w, &f, 4);
      return w;
    }
    default: return uint32_t(int32_t(v));
  }
}

// Poison bytes: 0xff is NaN in every float output; s32 gets 0x80808080 (about -2^31), beyond any sum here
// (|acc| <= 2^14 K).
uint8_t out_poison(GemmOut o) { return o == GemmOut::kS32 ? 0x80 : 0xff; }

constexpr int64_t kGuard = 64;  // output elements past the last row, poisoned

// Dot products of every output element, exact for the integer pairs (|acc| < 2^53), and sum |a b| for the tolerance.
struct Dots {
  std::vector<double> acc, mag;  // [batch][m][n]
};

Dots dot_products(const Case& c, const Operand& a, const Operand& b) {
  Dots d;
  const size_t total = size_t(c.batch) * c.m * c.n;
  d.acc.resize(total);
  d.mag.resize(total);
  for (int bz = 0; bz < c.batch; ++bz) {
    const double* A = a.value.data() + size_t(c.a_batched ? bz : 0) * c.m * c.k;
    const double* B = b.value.data() + size_t(c.b_batched ? bz : 0) * c.n * c.k;
    for (int i = 0; i < c.m; ++i) {
      const double* ar = A + size_t(i) * c.k;
      for (int j = 0; j < c.n; ++j) {
        const double* br = B + size_t(j) * c.k;
        double acc = 0.0, mag = 0.0;
        for (int kk = 0; kk < c.k; ++kk) {
          const double p = ar[kk] * br[kk];
          acc += p;
          mag += std::fabs(p);
        }
        d.acc[(size_t(bz) * c.m + i) * c.n + j] = acc;
        d.mag[(size_t(bz) * c.m + i) * c.n + j] = mag;
      }
    }
  }
  return d;
}

// The expected result of every logical output element and its tolerance (0: bit exact).
struct Expected {
  std::vector<double> y, tol;  // [batch][m][n]
};

// Tolerance rule. The reference reads the stored codes, so the inputs are exact and the input precision enters only
// through the accumulator: with S = |sa sb| sum_k |a b| + |bias| and u = 2^-24 (fp32),
//   tol = ulp_out(|y|) + (K + 8) u S.
// The first term is the one output rounding (a full ulp: the value rounded is itself off by the second term). The
// second is the recursive-summation bound over K fp32 additions, which covers the mma's own sums (a few roundings
// or truncations per 16 or 32 products), the split-K reduction and the epilogue's scale and bias roundings. A dropped
// product or a misplaced K tile moves y by about S / K, above the second term for every K here (K^2 u << 1); the
// err/tol column shows how close a run came.
Expected expected(const Case& c, const Dots& d, const std::vector<float>& sa, const std::vector<float>& sb,
                  const std::vector<double>& bias) {
  Expected e;
  e.y.resize(d.acc.size());
  e.tol.resize(d.acc.size());
  const double u = std::ldexp(1.0, -24);
  // The sm_90a recipes' fp8 wgmma sums a stage's 128 products of K in 4 steps at ~14 bits (the kernel then adds
  // each stage's sum to fp32 accumulators): a bound of 2^-12 of S a step, one bit looser than those 14 bits (at
  // 2^-13 one element of e5m2 x e4m3 on recipe 10, 600 x 771 x 272, came 1.004x over it: seed 2810686838, fortieth
  // session). A dropped product (~S / K) still exceeds it below K ~ 1000 (the K of most fp8 cases here); a misplaced
  // or dropped K tile (128 products) at every K here.
  const bool fp8_wgmma = kPairs[c.pair].group == Group::kFp8 && c.recipe >= kGemmFirstSm90Recipe &&
                         c.recipe != kGemmSm90StreamRecipe;  // the weight stream's mma.sync sums in fp32
  for (size_t at = 0; at < d.acc.size(); ++at) {
    const int i = int(at / size_t(c.n) % size_t(c.m)), j = int(at % size_t(c.n));
    const double s = (sa.empty() ? 1.0 : sa[sa.size() == 1 ? 0 : size_t(i)]) *
                     (sb.empty() ? 1.0 : sb[sb.size() == 1 ? 0 : size_t(j)]);
    const double bj = bias.empty() ? 0.0 : bias[size_t(j)];
    e.y[at] = d.acc[at] * s + bj;
    double sum_bound = (c.k + 8) * u * (d.mag[at] * std::fabs(s) + std::fabs(bj));
    if (fp8_wgmma) sum_bound += 4 * std::ldexp(1.0, -12) * d.mag[at] * std::fabs(s);
    e.tol[at] = c.epi.exact ? 0.0 : out_ulp(c.epi.out, e.y[at]) + sum_bound;
  }
  return e;
}

// Compares the whole output allocation `got` with the expectation: every logical element written and within its
// tolerance (bit equal where exact), every other element (row padding, the guard) still poison.
ErrorStats check_output(const Case& c, const Expected& e, const std::vector<uint8_t>& got) {
  ErrorStats s;
  const GemmOut o = c.epi.out;
  const int ob = out_bytes(o);
  const int64_t ldo = c.n + c.out_pad;
  uint32_t poison_bits = 0;
  std::memset(&poison_bits, out_poison(o), size_t(ob));
  char what[320];
  for (int bz = 0; bz < c.batch; ++bz)
    for (int i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < ldo; ++j) {
        const uint8_t* p = got.data() + ((int64_t(bz) * c.m + i) * ldo + j) * ob;
        const uint32_t bits = out_bits(o, p);
        if (j >= c.n) {
          if (bits != poison_bits) {
            std::snprintf(what, sizeof what, "[%d,%d,%" PRId64 "]: row padding written (bits 0x%x)", bz, i, j, bits);
            s.fail(what);
          }
          continue;
        }
        ++s.checked;
        const size_t at = (size_t(bz) * c.m + i) * c.n + size_t(j);
        const double y = e.y[at], tol = e.tol[at], g = out_value(o, p);
        if (bits == poison_bits) {
          std::snprintf(what, sizeof what, "[%d,%d,%" PRId64 "]: not written (poison bits 0x%x), want %.9g", bz, i, j,
                        bits, y);
          s.fail(what);
          continue;
        }
        const double err = std::fabs(g - y);
        const bool ok = c.epi.exact ? bits == encode_out(o, y) : (std::isfinite(g) && err <= tol);
        if (!ok) {
          std::snprintf(what, sizeof what,
                        "[%d,%d,%" PRId64 "]: got %.9g (bits 0x%x), want %.17g, |error| %.3g %s %.3g", bz, i, j, g,
                        bits, y, err, c.epi.exact ? "(exact), tolerance" : ">", tol);
          s.fail(what);
          continue;
        }
        s.max_abs = std::max(s.max_abs, err);
        s.max_ulp = std::max(s.max_ulp, err / out_ulp(o, y));  // ulps of the output type
        if (tol > 0) s.max_tol_ratio = std::max(s.max_tol_ratio, err / tol);
      }
  const size_t end = size_t(int64_t(c.batch) * c.m * ldo * ob);
  for (size_t i = end; i < got.size(); ++i) {
    if (got[i] != out_poison(o)) {
      s.fail("a byte past the last output row was written");
      break;
    }
  }
  return s;
}

// The checker must reject a copy of the output with one element moved past its tolerance (one unit where exact),
// one element reset to the poison, and one padding or guard element written: else a passing row proves nothing.
// Returns what it failed to catch, empty when it caught all three.
std::string negative_controls(const Case& c, const Expected& e, const std::vector<uint8_t>& got, Rng& rng) {
  const GemmOut o = c.epi.out;
  const int ob = out_bytes(o);
  const int64_t ldo = c.n + c.out_pad;
  const int bz = int(rng.integer(0, c.batch - 1)), i = int(rng.integer(0, c.m - 1)), j = int(rng.integer(0, c.n - 1));
  const size_t off = size_t(((int64_t(bz) * c.m + i) * ldo + j) * ob);
  const double y = e.y[(size_t(bz) * c.m + i) * c.n + size_t(j)];
  const double tol = e.tol[(size_t(bz) * c.m + i) * c.n + size_t(j)];
  std::string missed;
  auto expect_caught = [&](const char* what, const std::vector<uint8_t>& bad) {
    if (check_output(c, e, bad).failures == 0) missed += std::string(missed.empty() ? "" : ", ") + what;
  };
  std::vector<uint8_t> bad = got;
  uint32_t moved = encode_out(o, y);
  if (c.epi.exact) {
    moved += 1;  // the next integer (s32) or the next float up (fp32)
  } else {
    moved = encode_out(o, y + 3.0 * tol * (y < 0 ? -1.0 : 1.0));  // >= 2.5 tol off after the output rounding
  }
  std::memcpy(bad.data() + off, &moved, size_t(ob));
  expect_caught("an element off by 3x its tolerance", bad);
  bad = got;
  std::memset(bad.data() + off, out_poison(o), size_t(ob));
  expect_caught("an unwritten element", bad);
  bad = got;
  const int64_t pad_at = c.out_pad > 0 ? (int64_t(bz) * c.m + i) * ldo + c.n + rng.integer(0, c.out_pad - 1)
                                       : int64_t(c.batch) * c.m * ldo + rng.integer(0, kGuard - 1);
  std::memcpy(bad.data() + pad_at * ob, got.data() + off, size_t(ob));
  expect_caught("a write past the row or the tensor", bad);
  return missed;
}

// ---- one case --------------------------------------------------------------------------------------------

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> d(host.size());
  d.upload(host);
  return d;
}

// Passes the stored layout to the launcher. GemmParams knows K-contiguous operands only (nt), by their row strides;
// a launcher that takes the other layouts gets Layout::code here.
void set_layout(GemmParams& p, const Layout& l, const Operand& a, const Operand& b) {
  p.layout = GemmLayout(l.code);
  p.transpose_out = 0;  // the launcher's to set where it swaps the operands
  p.a_row_stride = a.ld;
  p.b_row_stride = b.ld;
}

ErrorStats run_case(const Case& c, Rng& rng) {
  const PairInfo& pi = c.info();
  const Layout& l = kLayouts[c.layout];
  // Exact cases: |a| <= 8 and int8-range b keep every partial sum below 2^24 (exact in fp32) while K * 8 * 128 does.
  const bool ints = c.epi.exact;
  if (ints && pi.group != Group::kW8A8 && int64_t(c.k) * 8 * 128 > (int64_t(1) << 24)) {
    ErrorStats s;
    s.fail("an exact case needs K * 8 * 128 <= 2^24 (fp32 sums of integers)");
    return s;
  }
  const int a_lo = pi.group == Group::kW8A8 ? -128 : -8, a_hi = pi.group == Group::kW8A8 ? 127 : 8;
  const Operand a = make_operand(pi.a, c.a_batched ? c.batch : 1, c.m, c.k, l.a_k_contiguous, c.padded, ints, a_lo,
                                 a_hi, rng);
  const Operand b = make_operand(pi.b, c.b_batched ? c.batch : 1, c.n, c.k, l.b_k_contiguous, c.padded, ints, -128,
                                 127, rng);

  // Scales: positive, varied, sized so that |y| stays well inside fp16 (int8 products reach 2^14, fp8 ones 56).
  const double scale_base = pi.group == Group::kW8A8 ? 1.0 / 128 : pi.group == Group::kW8A16 ? 1.0 / 64 : 0.5;
  auto make_scale = [&](Scale kind, int count) {
    std::vector<float> v(kind == Scale::kNone ? 0 : kind == Scale::kTensor ? 1 : size_t(count));
    for (float& x : v) x = float(scale_base * rng.uniform(0.5, 2.0));
    return v;
  };
  const std::vector<float> sa = make_scale(c.epi.a_scale, c.m), sb = make_scale(c.epi.b_scale, c.n);

  // Bias: as large as a typical result (from the reference without it), so a dropped bias shows; integers if exact.
  const Dots dots = dot_products(c, a, b);
  std::vector<double> bias;
  std::vector<uint8_t> bias_bytes;
  if (c.epi.bias != GemmBias::kNone) {
    const Expected plain = expected(c, dots, sa, sb, {});
    double rms = 0.0;
    for (double v : plain.y) rms += v * v;
    rms = std::sqrt(rms / double(std::max<size_t>(plain.y.size(), 1))) + 1.0;
    const int eb = c.epi.bias == GemmBias::kF32 ? 4 : 2;
    bias.resize(size_t(c.n));
    bias_bytes.resize(size_t(c.n) * eb);
    for (int j = 0; j < c.n; ++j) {
      const double v = ints ? double(rng.integer(-64, 64)) : rng.uniform(-1.0, 1.0) * rms;
      if (c.epi.bias == GemmBias::kF32) {
        const float f = float(v);
        std::memcpy(&bias_bytes[size_t(j) * 4], &f, 4);
        bias[size_t(j)] = f;
      } else {
        const uint16_t h = c.epi.bias == GemmBias::kBf16 ? float_to_bf16(float(v)) : float_to_f16_bits(float(v));
        std::memcpy(&bias_bytes[size_t(j) * 2], &h, 2);
        bias[size_t(j)] = c.epi.bias == GemmBias::kBf16 ? bf16_to_float(h) : f16_bits_to_float(h);
      }
    }
  }
  const Expected want = expected(c, dots, sa, sb, bias);

  const DeviceBuffer<uint8_t> a_d = upload(a.bytes), b_d = upload(b.bytes), bias_d = upload(bias_bytes);
  const DeviceBuffer<float> sa_d = upload(sa), sb_d = upload(sb);
  const int ob = out_bytes(c.epi.out);
  const int64_t ldo = c.n + c.out_pad;
  DeviceBuffer<uint8_t> out_d(size_t((int64_t(c.batch) * c.m * ldo + kGuard) * ob));
  TEST_CUDA_CHECK(cudaMemset(out_d.get(), out_poison(c.epi.out), out_d.size()));

  GemmParams p{};
  p.a = a_d.get();
  p.b = b_d.get();
  p.out = out_d.get();
  p.a_scale = sa.empty() ? nullptr : sa_d.get();
  p.b_scale = sb.empty() ? nullptr : sb_d.get();
  p.bias = bias.empty() ? nullptr : bias_d.get();
  set_layout(p, l, a, b);
  p.a_batch_stride = c.a_batched && c.batch > 1 ? a.batch_stride : 0;
  p.b_batch_stride = c.b_batched && c.batch > 1 ? b.batch_stride : 0;
  p.out_row_stride = ldo;
  p.out_batch_stride = int64_t(c.m) * ldo;
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.batch = c.batch;
  p.split_k = c.split_k;
  p.a_scale_per_row = c.epi.a_scale == Scale::kVector ? 1 : 0;
  p.b_scale_per_col = c.epi.b_scale == Scale::kVector ? 1 : 0;
  p.out_dtype = c.epi.out;
  p.bias_dtype = c.epi.bias;
  // Workspace poisoned too: NaN partials (fp32), or sums far off (s32), if a split leaves a slice unwritten.
  DeviceBuffer<uint8_t> ws(size_t(gemm_workspace_bytes(p, pi.pair, c.recipe)));
  if (ws.size()) TEST_CUDA_CHECK(cudaMemset(ws.get(), pi.group == Group::kW8A8 ? 0x80 : 0xff, ws.size()));
  p.workspace = ws.size() ? ws.get() : nullptr;

  ErrorStats s;
  const cudaError_t st = gemm_launch(p, pi.pair, c.recipe, nullptr);
  if (st != cudaSuccess) {
    s.fail(std::string("gemm_launch returned ") + cudaGetErrorName(st));
    return s;
  }
  TEST_CUDA_CHECK(cudaGetLastError());
  TEST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> got;
  out_d.download(got);
  s = check_output(c, want, got);
  const std::string missed = negative_controls(c, want, got, rng);
  if (!missed.empty()) s.fail("negative control not caught: " + missed);
  return s;
}

// ---- the table -------------------------------------------------------------------------------------------

// Shapes by the recipe's tile and the pair's K tile, so that a new recipe gets its own awkward sizes: M of 1, 7,
// 129 and ~1000; N and K off the tiles; K the smallest aligned value and odd (a partial 16-byte chunk); split-K
// with more splits than K tiles (empty slices); batches with either operand broadcast.
std::vector<Case> shapes_for(int pair, int layout, int recipe) {
  const PairInfo& pi = kPairs[pair];
  const int tn = gemm_recipe_tile_n(recipe), tm = gemm_recipe_tile_m(recipe), kt = gemm_k_tile(pi.pair);
  const int kmin = min_aligned_k(pi);
  auto shape = [&](int m, int n, int k, int split) {
    Case c;
    c.pair = pair;
    c.layout = layout;
    c.recipe = recipe;
    c.m = m;
    c.n = std::max(n, 1);
    c.k = k;
    c.split_k = split;
    return c;
  };
  std::vector<Case> v;
  v.push_back(shape(1, 2 * tn + 5, 3 * kt + kmin, 1));
  v.push_back(shape(7, tn - 3, kmin, 1));
  v.push_back(shape(129, tn + 17, 4 * kt + kmin, 3));
  v.back().out_pad = 3;
  v.push_back(shape(997, tn + 9, 2 * kt + 3 * kmin, 1));
  v.back().padded = true;
  v.push_back(shape(33, tn / 2 + 1, 2 * kt + 1, 2));
  v.back().padded = true;
  v.back().batch = 3;
  v.back().b_batched = false;
  v.push_back(shape(tm + 1, 3, kmin, 4));
  v.back().batch = 2;
  v.back().a_batched = false;
  v.back().out_pad = 1;
  if (recipe >= kGemmFirstSm90Recipe) {  // the persistent kernel: more units than SMs, so CTAs walk several
    v.push_back(shape(600, 4 * tn + 3, 2 * kt + kmin, 2));
    v.back().batch = 3;
    // Rows 16-byte aligned (tn + 8 elements apart) but N off 8: TMA, which stores whole 16-byte chunks, must not
    // write the padding's 3 columns.
    v.push_back(shape(129, tn + 5, 2 * kt + kmin, 1));
    v.back().out_pad = 3;
  }
  if (gemm_is_sm90_mainloop(recipe) || gemm_is_sm90_w8a16(recipe)) {
    // split_k 0, the last wave split along K: every tile split (a broadcast a), then 136 tiles (one wave of 132
    // whole, 4 split on an H100 / H200) with a padded output.
    v.push_back(shape(129, 3 * tn + 5, 40 * kt + kmin, 0));
    v.back().batch = 2;
    v.back().a_batched = false;
    v.push_back(shape(65, tn + 1, 16 * kt + kmin, 0));
    v.back().batch = 68;
    v.back().out_pad = 2;
  }
  return v;
}

// w8a16's weight-stream kernel (layout nt, recipe 2) by its own geometry: split_k slices run as the warps of one
// CTA up to kGemmStreamMaxWarpsK (summed in order inside it), more add CTAs along K and the reduction; the launcher
// packs 1..24 groups of 16 weight rows a CTA, some past N. Splits odd and past the K tiles (empty slices), N off
// 16, M on both token-tile kernels and past one block of 16 rows, a broadcast batch.
std::vector<Case> stream_shapes(int pair) {
  const int kt = gemm_k_tile(kPairs[pair].pair);
  auto shape = [&](int m, int n, int k, int split) {
    Case c;
    c.pair = pair;
    c.recipe = 2;
    c.m = m;
    c.n = n;
    c.k = k;
    c.split_k = split;
    return c;
  };
  std::vector<Case> v;
  v.push_back(shape(1, 117, 3 * kt + 16, 5));
  v.push_back(shape(9, 200, 40 * kt + 16, 19));
  v.push_back(shape(16, 77, 30 * kt + 48, kGemmStreamMaxWarpsK + 6));
  v.push_back(shape(17, 333, 60 * kt + 16, 2 * kGemmStreamMaxWarpsK + 5));
  v.back().padded = true;
  v.push_back(shape(3, 50, 8 * kt + 16, 7));
  v.back().batch = 2;
  v.back().b_batched = false;
  v.push_back(shape(5, 4099, 2 * kt, 1));
  return v;
}

// A rotation's recipe `r % kGemmRecipes`, or where this device or image cannot run it (the sm_90a recipes 4-11 off
// an H100 / H200, in layouts other than nt, for the pairs they do not run) the portable recipe r % 4, so the
// rotation still runs.
int rotated_recipe(int pi, int li, int r) {
  const int recipe = r % kGemmRecipes;
  if (recipe >= kGemmFirstSm90Recipe &&
      gemm_unsupported(kPairs[pi].pair, GemmLayout(kLayouts[li].code), recipe) != nullptr)
    return recipe % kGemmFirstSm90Recipe;
  return recipe;
}

std::vector<Case> make_cases(bool small) {
  std::vector<Case> cases;
  if (small) {
    // The sanitizer's table: every pair once on a rotating recipe, split-K, the exact paths, an odd K with a
    // broadcast batch, K = 0. Small grids: racecheck and initcheck run each access through the tool.
    for (int pi = 0; pi < kNumPairs; ++pi) {
      const int recipe = rotated_recipe(pi, 0, pi);
      Case c = shapes_for(pi, 0, recipe)[1];  // M = 7, the smallest aligned K
      c.k = 2 * gemm_k_tile(kPairs[pi].pair) + min_aligned_k(kPairs[pi]);
      c.split_k = 1 + pi % 2;
      c.out_pad = pi % 3;
      const std::vector<Epilogue> epis = epilogues_of(kPairs[pi]);
      c.epi = epis[size_t(pi * 7) % epis.size()];
      cases.push_back(c);
      if (has_exact(kPairs[pi]) && pi % 2 == 0) {
        c.epi = exact_epilogue(kPairs[pi], pi / 2);
        c.split_k = 3;
        cases.push_back(c);
      }
    }
    for (const Case& base : {stream_shapes(2)[2], stream_shapes(3)[0]}) {  // CTAs along K; groups past N
      Case c = base;
      c.epi = epilogues_of(kPairs[c.pair])[3];
      cases.push_back(c);
    }
    // The sm_90a w8a16 kernels (skipped off an H100 / H200): split-K with a padded output; M = 1.
    for (int recipe : {kGemmSm90W8a16Recipe, kGemmSm90W8a16WideRecipe, kGemmSm90W8a16NarrowRecipe,
                       kGemmSm90W8a16Tokens192Recipe})
      for (int pi : {2, 3}) {
        Case c = shapes_for(pi, 0, recipe)[pi == 2 ? 2 : 0];
        c.epi = epilogues_of(kPairs[pi])[size_t(pi + recipe)];
        cases.push_back(c);
      }
    // The last wave split (split_k 0) on recipes 4 and 10 (fp8), 5 (bf16) and w8a16's 8 and 11, skipped off an H100 /
    // H200: every tile in 2 K slices, a broadcast.
    for (const auto& [pi, recipe] : {std::pair<int, int>{0, kGemmFirstSm90Recipe + 1}, {5, kGemmFirstSm90Recipe},
                                     {5, kGemmSm90N192Recipe}, {2, kGemmSm90W8a16WideRecipe},
                                     {3, kGemmSm90W8a16Tokens192Recipe}}) {
      const std::vector<Case> tail = shapes_for(pi, 0, recipe);
      Case c = tail[tail.size() - 2];
      c.k = 16 * gemm_k_tile(kPairs[pi].pair) + min_aligned_k(kPairs[pi]);
      c.epi = epilogues_of(kPairs[pi])[size_t(3 + pi)];
      cases.push_back(c);
    }
    Case odd = shapes_for(2, 0, 2)[4];  // bf16 x s8 on the stream kernel, odd K, b broadcast over 3 batches
    odd.m = 9;
    odd.epi = epilogues_of(kPairs[2])[5];
    cases.push_back(odd);
    Case empty = shapes_for(0, 0, 0)[1];  // K = 0: the bias alone
    empty.k = 0;
    empty.split_k = 2;
    empty.epi.bias = GemmBias::kF32;
    cases.push_back(empty);
    return cases;
  }
  std::vector<size_t> turn(kNumPairs, 0);  // per pair: the next epilogue of its rotation
  for (int li = 0; li < int(sizeof(kLayouts) / sizeof(kLayouts[0])); ++li) {
    for (int recipe = 0; recipe < kGemmRecipes; ++recipe)
      for (int pi = 0; pi < kNumPairs; ++pi) {
        const std::vector<Epilogue> epis = epilogues_of(kPairs[pi]);
        int shape_index = 0;
        for (Case c : shapes_for(pi, li, recipe)) {
          c.epi = epis[turn[size_t(pi)]++ * 5 % epis.size()];  // stride 5: scales, bias and out all move
          cases.push_back(c);
          if (has_exact(kPairs[pi])) {
            c.epi = exact_epilogue(kPairs[pi], shape_index);
            cases.push_back(c);
          }
          ++shape_index;
        }
      }
    if (li == 0)
      for (int pi : {2, 3}) {
        const std::vector<Epilogue> epis = epilogues_of(kPairs[pi]);
        int shape_index = 0;
        for (Case c : stream_shapes(pi)) {
          c.epi = epis[turn[size_t(pi)]++ * 5 % epis.size()];
          cases.push_back(c);
          c.epi = exact_epilogue(kPairs[pi], shape_index++);
          cases.push_back(c);
        }
      }
    // Every epilogue of every pair on one small shape (fp8: every scale pair and out dtype, bias rotating), the
    // recipe and the split rotating; then K = 0 (the bias alone) and K = 1.
    for (int pi = 0; pi < kNumPairs; ++pi) {
      std::vector<Epilogue> epis = epilogues_of(kPairs[pi]);
      if (kPairs[pi].group == Group::kFp8) {
        std::vector<Epilogue> fewer;
        for (size_t i = 0; i < epis.size(); i += 4) {
          fewer.push_back(epis[i]);
          fewer.back().bias = GemmBias(fewer.size() % 4);
        }
        epis = fewer;
      }
      if (has_exact(kPairs[pi])) epis.push_back(exact_epilogue(kPairs[pi], 1));
      for (size_t e = 0; e < epis.size(); ++e) {
        const int recipe = rotated_recipe(pi, li, int(e));
        Case c = shapes_for(pi, li, recipe)[1];
        c.m = 19;
        c.n = gemm_recipe_tile_n(recipe) + 7;
        c.k = gemm_k_tile(kPairs[pi].pair) + 2 * min_aligned_k(kPairs[pi]);
        c.split_k = 1 + int(e / kGemmRecipes) % 2;
        c.epi = epis[e];
        cases.push_back(c);
      }
      for (int k : {0, 1}) {
        Case c = shapes_for(pi, li, rotated_recipe(pi, li, pi))[1];
        c.k = k;
        c.split_k = 1 + k;
        c.padded = true;
        c.epi = has_exact(kPairs[pi]) ? exact_epilogue(kPairs[pi], 1) : epilogues_of(kPairs[pi])[3];
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// What the launcher promises beside the launch: tiles for every recipe id and none past them, a reason for an
// unknown recipe, cudaErrorInvalidValue (no launch) for one or for split_k 0 off recipes 4, 5 and 7-11, and no workspace
// without a split.
bool check_launcher_contract() {
  bool ok = gemm_recipe_tile_m(kGemmRecipes) == 0 && gemm_recipe_tile_n(-1) == 0;
  for (int r = 0; r < kGemmRecipes; ++r) ok = ok && gemm_recipe_tile_m(r) > 0 && gemm_recipe_tile_n(r) > 0;
  DeviceBuffer<uint8_t> dummy(4096);
  for (const PairInfo& pi : kPairs) {
    ok = ok && gemm_k_tile(pi.pair) > 0 && gemm_unsupported(pi.pair, GemmLayout::kNT, kGemmRecipes) != nullptr &&
         gemm_unsupported(pi.pair, GemmLayout::kNT, -1) != nullptr;
    GemmParams p{};
    p.a = p.b = dummy.get();
    p.out = dummy.get();
    p.a_row_stride = p.b_row_stride = p.out_row_stride = 64;
    p.m = p.n = p.k = p.batch = p.split_k = 1;
    p.out_dtype = pi.group == Group::kW8A8 ? GemmOut::kS32 : GemmOut::kF32;
    ok = ok && gemm_workspace_bytes(p, pi.pair, 0) == 0;
    ok = ok && gemm_launch(p, pi.pair, kGemmRecipes, nullptr) == cudaErrorInvalidValue;
    p.split_k = 0;  // the last wave split: recipes 4, 5 and 7-11 only; nothing to split in one tile
    ok = ok && gemm_launch(p, pi.pair, 0, nullptr) == cudaErrorInvalidValue &&
         gemm_workspace_bytes(p, pi.pair, kGemmFirstSm90Recipe) == 0;
    p.split_k = 3;
    ok = ok && gemm_workspace_bytes(p, pi.pair, 0) >= 3 * 4;
  }
  TEST_CUDA_CHECK(cudaGetLastError());
  TEST_CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("launcher contract (recipe tiles, unknown recipe refused, workspace): %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

// ---- --bench ---------------------------------------------------------------------------------------------

// Hash-random bytes ANDed with `mask` (fp8: 0xbf keeps the exponent's top bit clear: finite, |x| < 2).
__global__ void fill_random_bytes(uint8_t* x, int64_t n, uint32_t seed, uint8_t mask) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = uint8_t(h) & mask;
  }
}

// bf16 in [-1, 1].
__global__ void fill_random_bf16(uint16_t* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = uint16_t(__float_as_uint((float(h & 0xffffu) / 65535.f) * 2.f - 1.f) >> 16);
  }
}

void fill_operand(Elem e, uint8_t* x, int64_t count, uint32_t seed) {
  if (e == Elem::kBf16 || e == Elem::kF16) {
    fill_random_bf16<<<1024, 256>>>(reinterpret_cast<uint16_t*>(x), count, seed);  // the bench's 16-bit pairs are bf16
  } else {
    fill_random_bytes<<<1024, 256>>>(x, count, seed, e == Elem::kS8 ? 0xff : 0xbf);
  }
  TEST_CUDA_CHECK(cudaGetLastError());
}

// Median over samples of the mean time of `reps` back-to-back launches, in microseconds; b cycles over `copies`.
double time_launches(GemmParams p, GemmPair pair, int recipe, const std::vector<const void*>& b_copies,
                     cudaError_t* st) {
  GpuTimer timer;
  size_t turn = 0;
  auto launch = [&]() {
    p.b = b_copies[turn++ % b_copies.size()];
    const cudaError_t e = gemm_launch(p, pair, recipe, nullptr);
    if (e != cudaSuccess) *st = e;
  };
  *st = cudaSuccess;
  launch();
  timer.start();
  launch();
  const float first_ms = timer.stop();
  if (*st != cudaSuccess) return 0.0;
  const int reps = std::max(5, std::min(200, int(2.0 / std::max(first_ms, 1e-3f))));  // ~2 ms a sample
  std::vector<double> us;
  for (int sample = 0; sample < 7; ++sample) {
    timer.start();
    for (int r = 0; r < reps; ++r) launch();
    us.push_back(double(timer.stop()) * 1e3 / reps);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Informational: never fails on speed (exit 2 only for a CUDA error).
int run_bench(const cudaDeviceProp& prop) {
  const int64_t l2 = prop.l2CacheSize;
  std::printf("bench: %s, %d SMs, L2 %.0f MB; CUDA events, median of 7 samples of back-to-back launches; b cycles "
              "over copies past 2x L2\n", prop.name, prop.multiProcessorCount, double(l2) / 1e6);
  {  // the copy ceiling, for the TB/s column
    const int64_t bytes = int64_t(1) << 30;
    DeviceBuffer<uint8_t> src{size_t(bytes)}, dst{size_t(bytes)};
    TEST_CUDA_CHECK(cudaMemset(src.get(), 1, size_t(bytes)));
    GpuTimer timer;
    TEST_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), size_t(bytes), cudaMemcpyDeviceToDevice));
    timer.start();
    for (int r = 0; r < 5; ++r) {
      TEST_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), size_t(bytes), cudaMemcpyDeviceToDevice));
    }
    const double s = timer.stop() * 1e-3 / 5;
    std::printf("device copy of 1 GiB: %.2f TB/s (read + write)\n", 2.0 * double(bytes) / s * 1e-12);
  }
  std::printf("%-10s %5s %6s %6s %3s %5s %10s %9s %7s\n", "pair", "M", "N", "K", "r", "split", "us", "TFLOP/s",
              "TB/s");
  struct BenchPair {
    int pair;
    Scale a, b;
  };
  const BenchPair pairs[] = {{0, Scale::kNone, Scale::kNone}, {2, Scale::kNone, Scale::kVector},
                             {4, Scale::kVector, Scale::kVector}, {5, Scale::kTensor, Scale::kTensor}};
  const int ms[] = {1, 16, 4096};
  const int nks[][2] = {{4096, 4096}, {14336, 4096}};
  for (const BenchPair& bp : pairs) {
    const PairInfo& pi = kPairs[bp.pair];
    for (const auto& nk : nks) {
      const int N = nk[0], K = nk[1], M_max = ms[2];
      const int64_t b_bytes = int64_t(N) * K * elem_bytes(pi.b);
      const int copies = int(std::max<int64_t>(1, ceil_div<int64_t>(2 * l2, b_bytes)));
      std::vector<DeviceBuffer<uint8_t>> bs;
      std::vector<const void*> b_ptrs;
      for (int i = 0; i < copies; ++i) {
        bs.emplace_back(size_t(b_bytes));
        fill_operand(pi.b, bs.back().get(), int64_t(N) * K, 11u + uint32_t(i));
        b_ptrs.push_back(bs.back().get());
      }
      DeviceBuffer<uint8_t> a(size_t(int64_t(M_max) * K * elem_bytes(pi.a))), out(size_t(int64_t(M_max) * N * 2));
      fill_operand(pi.a, a.get(), int64_t(M_max) * K, 3u);
      const std::vector<float> scale_values(size_t(std::max(M_max, N)), 1.0f / 64);
      const DeviceBuffer<float> scales = upload(scale_values);
      for (int M : ms)
        for (int recipe = 0; recipe < kGemmRecipes; ++recipe) {
          const char* why = gemm_unsupported(pi.pair, GemmLayout::kNT, recipe);
          if (why) {
            std::printf("%-10s %5d %6d %6d %3d %5s  skipped: %s\n", pi.name, M, N, K, recipe, "-", why);
            continue;
          }
          const int tiles = ceil_div(M, gemm_recipe_tile_m(recipe)) * ceil_div(N, gemm_recipe_tile_n(recipe));
          const int k_tiles = ceil_div(K, gemm_k_tile(pi.pair));
          // A split that gives every SM two CTAs, where the tiles alone leave most of them idle.
          const int fill = std::min({16, k_tiles, ceil_div(2 * prop.multiProcessorCount, tiles)});
          std::vector<int> splits{1};
          if (fill > 1) splits.push_back(fill);
          for (int split : splits) {
            GemmParams p{};
            p.a = a.get();
            p.out = out.get();
            p.a_scale = bp.a == Scale::kNone ? nullptr : scales.get();
            p.b_scale = bp.b == Scale::kNone ? nullptr : scales.get();
            p.a_row_stride = p.b_row_stride = K;
            p.out_row_stride = N;
            p.m = M;
            p.n = N;
            p.k = K;
            p.batch = 1;
            p.split_k = split;
            p.a_scale_per_row = bp.a == Scale::kVector;
            p.b_scale_per_col = bp.b == Scale::kVector;
            p.out_dtype = GemmOut::kBf16;
            DeviceBuffer<uint8_t> ws(size_t(gemm_workspace_bytes(p, pi.pair, recipe)));
            p.workspace = ws.size() ? ws.get() : nullptr;
            cudaError_t st = cudaSuccess;
            const double us = time_launches(p, pi.pair, recipe, b_ptrs, &st);
            TEST_CUDA_CHECK(cudaDeviceSynchronize());
            if (st != cudaSuccess) {
              std::printf("%-10s %5d %6d %6d %3d %5d  launch returned %s\n", pi.name, M, N, K, recipe, split,
                          cudaGetErrorName(st));
              continue;
            }
            const double flops = 2.0 * M * N * double(K);
            const double bytes = double(M) * K * elem_bytes(pi.a) + double(b_bytes) + double(M) * N * 2;
            std::printf("%-10s %5d %6d %6d %3d %5d %10.1f %9.1f %7.2f\n", pi.name, M, N, K, recipe, split, us,
                        flops / us * 1e-6, bytes / us * 1e-6);
          }
        }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // --bench is this test's own flag; the rest are the house options.
  bool bench = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--bench") == 0) {
      bench = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  const TestOptions opts = parse_test_options(int(args.size()), args.data());
  if (!opts.ok) {
    std::fprintf(stderr, "       %s --bench: time Llama-size shapes (informational)\n", argv[0]);
    return 2;
  }
  const cudaDeviceProp prop = print_test_banner("quant_gemm_test", opts);
  if (bench) return run_bench(prop);

  Rng rng(opts.seed);
  const std::vector<Case> cases = make_cases(opts.small);
  std::vector<std::string> skipped_why;
  int failed = 0, index = 0, skipped = 0;
  print_table_header();
  for (const Case& c : cases) {
    const char* why = gemm_unsupported(c.info().pair, GemmLayout(kLayouts[c.layout].code), c.recipe);
    if (why) {
      ++skipped;
      const std::string note = std::string(c.info().name) + " recipe " + std::to_string(c.recipe) + ": " + why;
      if (std::find(skipped_why.begin(), skipped_why.end(), note) == skipped_why.end()) {
        skipped_why.push_back(note);
        std::printf("     skipped: %s\n", note.c_str());
      }
      continue;
    }
    const ErrorStats s = run_case(c, rng);
    print_table_row(index++, c.name(), s);
    failed += s.failures > 0;
  }
  if (skipped > 0) std::printf("%d cases skipped (%zu pair x recipe combinations this device or image cannot run)\n",
                               skipped, skipped_why.size());
  const bool contract_ok = check_launcher_contract();
  return test_exit_status(failed + (contract_ok ? 0 : 1), index + 1, opts.seed);
}
