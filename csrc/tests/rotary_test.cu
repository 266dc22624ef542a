// Standalone correctness table for rotary_bf16_launch against a float64 CPU reference (no torch).
// Usage: rotary_test [--small] [--seed N]. Exit status: 0 all pass, 1 a case failed, 2 a CUDA error.
#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/rotary/rotary.h"
#include "tests/test_utils.cuh"

namespace {

// The launch the policy plans for p on the current device (what the op does).
astrai::RotaryLaunch plan_of(const astrai::RotaryParams& p) {
  int device = 0;
  astrai::RotaryTarget target{};
  TEST_CUDA_CHECK(cudaGetDevice(&device));
  TEST_CUDA_CHECK(astrai::rotary_device_target(device, &target));
  return astrai::rotary_plan(astrai::rotary_shape_of(p), target);
}

using astrai::RotaryParams;
using namespace astrai_test;

constexpr uint16_t kPoison = 0xffff;  // a NaN whose bits the kernel never produces (it writes 0x7fff)
// Allocations up to this many elements keep a full host mirror (padding is then checked too).
constexpr int64_t kMirrorLimit = int64_t(1) << 27;

enum class Pos { kNone, kInt32, kInt64 };
enum class Layout {
  kContiguous,      // [T, H, D] dense
  kPadded,          // gaps between heads and tokens, all multiples of 8 elements: 16-byte path
  kOddStrides,      // odd head and token strides: scalar path
  kMisalignedBase,  // dense strides, base pointer off by one element: scalar path
  kCsMisaligned,    // dense x, cos/sin rows of D/2 + 1 starting one element in: scalar cos/sin loads
  kHeadMajor,       // a [H, T, D] buffer viewed as [T, H, D]
  kFusedQkv,        // q and k are head slices of one [T, Hq + 2 Hk, D] buffer
};

const char* pos_name(Pos p) { return p == Pos::kNone ? "none" : p == Pos::kInt32 ? "i32" : "i64"; }
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kContiguous: return "contig";
    case Layout::kPadded: return "padded";
    case Layout::kOddStrides: return "odd-strides";
    case Layout::kMisalignedBase: return "misaligned";
    case Layout::kCsMisaligned: return "cs-misaligned";
    case Layout::kHeadMajor: return "head-major";
    case Layout::kFusedQkv: return "fused-qkv";
  }
  return "?";
}

struct Case {
  int64_t T;
  int Hq, Hk, D;
  bool interleaved;
  Pos pos;
  bool in_place;
  Layout layout;
  bool bad_positions = false;     // some positions outside [0, max_pos): those tokens must be NaN
  int max_blocks = 0;             // > 0: forces the token grid-stride loop
  int64_t huge_token_stride = 0;  // > 0: q token stride (elements) so offsets pass 2^31

  std::string name() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s pos=%s %s %s T=%" PRId64 " H=%d/%d D=%d %s%s%s%s",
                  interleaved ? "gptj" : "neox", pos_name(pos), in_place ? "inplace" : "outplace",
                  Hk > 0 ? "qk" : "q", T, Hq, Hk, D, layout_name(layout), bad_positions ? " bad-pos" : "",
                  max_blocks > 0 ? (" grid=" + std::to_string(max_blocks)).c_str() : "",
                  huge_token_stride > 0 ? " 64-bit-offsets" : "");
    return buf;
  }
};

// Element (t, h, d) of a strided [T, H, D] view lives at offset + t * token_stride + h * head_stride + d.
struct View {
  int64_t T = 0, H = 0, D = 0;
  int64_t token_stride = 0, head_stride = 0, offset = 0;
  int64_t index(int64_t t, int64_t h, int64_t d) const { return offset + t * token_stride + h * head_stride + d; }
  int64_t span() const {
    if (T == 0 || H == 0 || D == 0) return offset + 1;
    return index(T - 1, H - 1, D - 1) + 1;
  }
};

View dense(int64_t T, int64_t H, int64_t D) { return View{T, H, D, H * D, D, 0}; }

// One bf16 allocation, with a host mirror of all of it when small enough.
struct Bf16Alloc {
  DeviceBuffer<uint16_t> dev;
  std::vector<uint16_t> mirror;  // empty: too large, rows move one by one
  bool has_mirror() const { return !mirror.empty(); }
};

std::unique_ptr<Bf16Alloc> make_alloc(int64_t span) {
  auto a = std::make_unique<Bf16Alloc>();
  a->dev = DeviceBuffer<uint16_t>(size_t(span));
  if (span <= kMirrorLimit) a->mirror.assign(size_t(span), kPoison);
  TEST_CUDA_CHECK(cudaMemset(a->dev.get(), 0xff, size_t(span) * sizeof(uint16_t)));  // kPoison everywhere
  return a;
}

// Fills the logical elements of `v` (and, with a mirror, every other element too) with random data;
// returns the logical values [T, H, D].
std::vector<uint16_t> fill_random(Bf16Alloc& a, const View& v, Rng& rng) {
  std::vector<uint16_t> logical(size_t(v.T * v.H * v.D));
  if (a.has_mirror()) {
    for (auto& x : a.mirror) x = rng.nonzero_bf16();
    for (int64_t t = 0; t < v.T; ++t)
      for (int64_t h = 0; h < v.H; ++h)
        for (int64_t d = 0; d < v.D; ++d) logical[size_t((t * v.H + h) * v.D + d)] = a.mirror[size_t(v.index(t, h, d))];
    a.dev.upload(a.mirror);
  } else {
    for (auto& x : logical) x = rng.nonzero_bf16();
    for (int64_t t = 0; t < v.T; ++t)
      for (int64_t h = 0; h < v.H; ++h)
        TEST_CUDA_CHECK(cudaMemcpy(a.dev.get() + v.index(t, h, 0), &logical[size_t((t * v.H + h) * v.D)],
                                   size_t(v.D) * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
  return logical;
}

// The logical elements of `v` as they are on the device now; refreshes the mirror.
std::vector<uint16_t> read_logical(Bf16Alloc& a, const View& v) {
  std::vector<uint16_t> logical(size_t(v.T * v.H * v.D));
  if (a.has_mirror()) {
    std::vector<uint16_t> now;
    a.dev.download(now);
    a.mirror.swap(now);
    for (int64_t t = 0; t < v.T; ++t)
      for (int64_t h = 0; h < v.H; ++h)
        for (int64_t d = 0; d < v.D; ++d) logical[size_t((t * v.H + h) * v.D + d)] = a.mirror[size_t(v.index(t, h, d))];
  } else {
    for (int64_t t = 0; t < v.T; ++t)
      for (int64_t h = 0; h < v.H; ++h)
        TEST_CUDA_CHECK(cudaMemcpy(&logical[size_t((t * v.H + h) * v.D)], a.dev.get() + v.index(t, h, 0),
                                   size_t(v.D) * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  }
  return logical;
}

// Marks the elements of `v` in a mask over the allocation.
void mark(std::vector<char>& mask, const View& v) {
  for (int64_t t = 0; t < v.T; ++t)
    for (int64_t h = 0; h < v.H; ++h)
      for (int64_t d = 0; d < v.D; ++d) mask[size_t(v.index(t, h, d))] = 1;
}

// Input and output views for one tensor (q or k) of a case.
struct Layouts {
  View q_in, k_in, q_out, k_out;
  bool fused = false;     // k_in lives in q_in's allocation
  int64_t q_in_span = 0;  // elements of q_in's allocation
};

Layouts make_layouts(const Case& c) {
  const int64_t T = c.T, Hq = c.Hq, Hk = c.Hk, D = c.D;
  Layouts l;
  l.q_in = dense(T, Hq, D);
  l.k_in = dense(T, Hk, D);
  switch (c.layout) {
    case Layout::kContiguous:
    case Layout::kCsMisaligned:
      break;
    case Layout::kPadded:
      l.q_in = View{T, Hq, D, Hq * (D + 8) + 16, D + 8, 8};
      l.k_in = View{T, Hk, D, Hk * (D + 16) + 8, D + 16, 0};
      break;
    case Layout::kOddStrides:
      l.q_in = View{T, Hq, D, Hq * (D + 3) + 5, D + 3, 0};
      l.k_in = View{T, Hk, D, Hk * (D + 1) + 7, D + 1, 2};
      break;
    case Layout::kMisalignedBase:
      l.q_in.offset = 1;
      l.k_in.offset = 3;
      break;
    case Layout::kHeadMajor:
      l.q_in = View{T, Hq, D, D, T * D, 0};
      l.k_in = View{T, Hk, D, D, T * D, 0};
      break;
    case Layout::kFusedQkv:
      l.q_in = View{T, Hq, D, (Hq + 2 * Hk) * D, D, 0};
      l.k_in = View{T, Hk, D, (Hq + 2 * Hk) * D, D, Hq * D};
      l.fused = true;
      break;
  }
  l.q_in_span = l.fused ? std::max<int64_t>(T, 1) * (Hq + 2 * Hk) * D : 0;
  if (c.huge_token_stride > 0) l.q_in.token_stride = c.huge_token_stride;
  if (!l.fused) l.q_in_span = l.q_in.span();
  if (c.in_place) {
    l.q_out = l.q_in;
    l.k_out = l.k_in;
  } else if (c.layout == Layout::kOddStrides || c.layout == Layout::kMisalignedBase) {
    l.q_out = l.q_in;  // same odd geometry, own allocation: scalar stores at odd addresses
    l.k_out = l.k_in;
  } else if (c.layout == Layout::kPadded) {
    l.q_out = View{T, Hq, D, Hq * (D + 24), D + 24, 0};  // strides differ from the input's
    l.k_out = View{T, Hk, D, Hk * (D + 8) + 8, D + 8, 8};
  } else {
    l.q_out = dense(T, Hq, D);
    l.k_out = dense(T, Hk, D);
  }
  return l;
}

// Compares the logical outputs of one tensor with the float64 reference.
void check_tensor(const char* tensor, const std::vector<uint16_t>& in, const std::vector<uint16_t>& got,
                  int64_t T, int64_t H, int64_t D, bool interleaved, const std::vector<int64_t>& rows,
                  int64_t num_rows, const std::vector<float>& cos, const std::vector<float>& sin,
                  int64_t cs_offset, int64_t cos_stride, int64_t sin_stride, ErrorStats& s) {
  const int64_t half = D / 2;
  char what[512];
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = rows[size_t(t)];
    const bool valid = row >= 0 && row < num_rows;
    for (int64_t h = 0; h < H; ++h) {
      const size_t base = size_t((t * H + h) * D);
      for (int64_t j = 0; j < half; ++j) {
        const int64_t i0 = interleaved ? 2 * j : j;
        const int64_t i1 = interleaved ? 2 * j + 1 : j + half;
        for (int m = 0; m < 2; ++m) {
          const int64_t i = m == 0 ? i0 : i1;
          const uint16_t bits = got[base + size_t(i)];
          const double g = bf16_to_float(bits);
          ++s.checked;
          if (!valid) {
            if (!std::isnan(g) || bits == kPoison) {
              std::snprintf(what, sizeof what, "%s[%" PRId64 ",%" PRId64 ",%" PRId64 "]: bits 0x%04x, expected a NaN"
                            " the kernel wrote (position %" PRId64 " outside [0, %" PRId64 "))",
                            tensor, t, h, i, bits, row, num_rows);
              s.fail(what);
            }
            continue;
          }
          const double x0 = bf16_to_float(in[base + size_t(i0)]);
          const double x1 = bf16_to_float(in[base + size_t(i1)]);
          const double cv = cos[size_t(cs_offset + row * cos_stride + j)];
          const double sv = sin[size_t(cs_offset + row * sin_stride + j)];
          const double ref = m == 0 ? x0 * cv - x1 * sv : x1 * cv + x0 * sv;
          // float32 arithmetic (products and one add, maybe fused) then one rounding to bf16.
          const double mag = m == 0 ? std::fabs(x0 * cv) + std::fabs(x1 * sv) : std::fabs(x1 * cv) + std::fabs(x0 * sv);
          const double eps = std::ldexp(mag, -21);
          const double tol = 0.5 * bf16_ulp(std::fabs(ref) + eps) + eps;
          const double err = std::fabs(g - ref);
          if (std::isnan(g) || !(err <= tol)) {
            std::snprintf(what, sizeof what, "%s[%" PRId64 ",%" PRId64 ",%" PRId64 "]: got %.9g (bits 0x%04x), "
                          "reference %.17g, |error| %.17g > tolerance %.17g (x0 %.9g, x1 %.9g, cos %.9g, sin %.9g, "
                          "row %" PRId64 ")", tensor, t, h, i, g, bits, ref, err, tol, x0, x1, cv, sv, row);
            s.fail(what);
            continue;
          }
          s.max_abs = std::max(s.max_abs, err);
          s.max_ulp = std::max(s.max_ulp, err / bf16_ulp(ref));
          s.max_tol_ratio = std::max(s.max_tol_ratio, err / tol);
        }
      }
    }
  }
}

// Every element of `a` outside `mask` must still equal `before`.
void check_untouched(const char* what, const Bf16Alloc& a, const std::vector<uint16_t>& before,
                     const std::vector<char>& mask, ErrorStats& s) {
  for (size_t i = 0; i < before.size(); ++i) {
    if (!mask[i] && a.mirror[i] != before[i]) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "%s: element %zu outside the tensor changed (0x%04x -> 0x%04x)", what, i,
                    before[i], a.mirror[i]);
      s.fail(msg);
      return;
    }
  }
}

ErrorStats run_case(const Case& c, Rng& rng) {
  ErrorStats s;
  const Layouts l = make_layouts(c);
  const bool has_k = c.Hk > 0;
  const int64_t half = c.D / 2;

  // x buffers.
  auto q_in_alloc = make_alloc(l.q_in_span);
  std::unique_ptr<Bf16Alloc> k_in_alloc;
  if (has_k && !l.fused) k_in_alloc = make_alloc(l.k_in.span());
  Bf16Alloc* k_in_a = l.fused ? q_in_alloc.get() : k_in_alloc.get();
  // Fused: one fill covers q, k and the v gap; logical values are then read per view.
  std::vector<uint16_t> q_vals = fill_random(*q_in_alloc, l.q_in, rng);
  std::vector<uint16_t> k_vals;
  if (has_k) {
    if (l.fused) {
      for (int64_t t = 0; t < l.k_in.T; ++t)
        for (int64_t h = 0; h < l.k_in.H; ++h)
          for (int64_t d = 0; d < l.k_in.D; ++d) k_vals.push_back(q_in_alloc->mirror[size_t(l.k_in.index(t, h, d))]);
    } else {
      k_vals = fill_random(*k_in_a, l.k_in, rng);
    }
  }
  const std::vector<uint16_t> q_in_before = q_in_alloc->mirror;
  const std::vector<uint16_t> k_in_before = k_in_alloc ? k_in_alloc->mirror : std::vector<uint16_t>();

  std::unique_ptr<Bf16Alloc> q_out_alloc, k_out_alloc;
  if (!c.in_place) {
    q_out_alloc = make_alloc(l.q_out.span());
    if (has_k) k_out_alloc = make_alloc(l.k_out.span());
  }
  Bf16Alloc* q_out_a = c.in_place ? q_in_alloc.get() : q_out_alloc.get();
  Bf16Alloc* k_out_a = c.in_place ? k_in_a : k_out_alloc.get();

  // cos/sin tables and positions.
  const int64_t max_pos = c.T + 17;
  const int64_t num_rows = c.pos == Pos::kNone ? c.T : max_pos;
  int64_t cs_offset = 0, cos_stride = half, sin_stride = half;
  if (c.layout == Layout::kCsMisaligned) {
    cs_offset = 1;
    cos_stride = sin_stride = half + 1;
  } else if (c.layout == Layout::kPadded) {
    cos_stride = half + 4;
    sin_stride = half + 12;
  }
  const size_t cos_count = size_t(cs_offset + std::max<int64_t>(num_rows, 1) * cos_stride);
  const size_t sin_count = size_t(cs_offset + std::max<int64_t>(num_rows, 1) * sin_stride);
  std::vector<float> cos_h(cos_count), sin_h(sin_count);
  for (auto& v : cos_h) v = float(std::cos(rng.uniform(0.0, 6.283185307179586)));
  for (auto& v : sin_h) v = float(std::sin(rng.uniform(0.0, 6.283185307179586)));
  DeviceBuffer<float> cos_d(cos_count), sin_d(sin_count);
  cos_d.upload(cos_h);
  sin_d.upload(sin_h);

  std::vector<int64_t> rows(size_t(c.T));
  for (int64_t t = 0; t < c.T; ++t) rows[size_t(t)] = c.pos == Pos::kNone ? t : rng.integer(0, max_pos - 1);
  if (c.bad_positions && c.T > 0) {
    const bool i64 = c.pos == Pos::kInt64;
    rows[0] = -1;
    if (c.T > 2) rows[size_t(c.T / 2)] = max_pos;
    if (c.T > 1) rows[size_t(c.T - 1)] = i64 ? (int64_t(1) << 40) : INT_MAX;
    if (c.T > 3) rows[1] = i64 ? INT64_MIN : INT_MIN;
  }
  const int64_t pos_stride = c.layout == Layout::kPadded ? 2 : 1;
  DeviceBuffer<int32_t> pos32;
  DeviceBuffer<int64_t> pos64;
  if (c.pos == Pos::kInt32) {
    std::vector<int32_t> h(size_t(std::max<int64_t>(c.T, 1) * pos_stride), 7);
    for (int64_t t = 0; t < c.T; ++t) h[size_t(t * pos_stride)] = int32_t(rows[size_t(t)]);
    pos32 = DeviceBuffer<int32_t>(h.size());
    pos32.upload(h);
  } else if (c.pos == Pos::kInt64) {
    std::vector<int64_t> h(size_t(std::max<int64_t>(c.T, 1) * pos_stride), 7);
    for (int64_t t = 0; t < c.T; ++t) h[size_t(t * pos_stride)] = rows[size_t(t)];
    pos64 = DeviceBuffer<int64_t>(h.size());
    pos64.upload(h);
  }

  RotaryParams p{};
  p.q_ptr = q_in_alloc->dev.get() + l.q_in.offset;
  p.q_out_ptr = q_out_a->dev.get() + l.q_out.offset;
  p.q_token_stride = l.q_in.token_stride;
  p.q_head_stride = l.q_in.head_stride;
  p.q_out_token_stride = l.q_out.token_stride;
  p.q_out_head_stride = l.q_out.head_stride;
  if (has_k) {
    p.k_ptr = k_in_a->dev.get() + l.k_in.offset;
    p.k_out_ptr = k_out_a->dev.get() + l.k_out.offset;
    p.k_token_stride = l.k_in.token_stride;
    p.k_head_stride = l.k_in.head_stride;
    p.k_out_token_stride = l.k_out.token_stride;
    p.k_out_head_stride = l.k_out.head_stride;
  }
  p.cos_ptr = cos_d.get() + cs_offset;
  p.sin_ptr = sin_d.get() + cs_offset;
  p.cos_row_stride = cos_stride;
  p.sin_row_stride = sin_stride;
  if (c.pos == Pos::kInt32) p.positions_ptr = pos32.get();
  if (c.pos == Pos::kInt64) p.positions_ptr = pos64.get();
  p.positions_token_stride = pos_stride;
  p.positions_int64 = c.pos == Pos::kInt64;
  p.num_tokens = c.T;
  p.num_rows = num_rows;
  p.num_q_heads = c.Hq;
  p.num_k_heads = c.Hk;
  p.head_dim = c.D;
  p.interleaved = c.interleaved;
  p.max_blocks = c.max_blocks;

  const cudaError_t launch_status = astrai::rotary_bf16_launch(p, plan_of(p), nullptr);
  if (launch_status != cudaSuccess) {
    s.fail(std::string("launch returned ") + cudaGetErrorName(launch_status));
    return s;
  }
  TEST_CUDA_CHECK(cudaGetLastError());
  TEST_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<uint16_t> q_got = read_logical(*q_out_a, l.q_out);
  check_tensor("q", q_vals, q_got, c.T, c.Hq, c.D, c.interleaved, rows, num_rows, cos_h, sin_h, cs_offset,
               cos_stride, sin_stride, s);
  if (has_k) {
    const std::vector<uint16_t> k_got = read_logical(*k_out_a, l.k_out);
    check_tensor("k", k_vals, k_got, c.T, c.Hk, c.D, c.interleaved, rows, num_rows, cos_h, sin_h, cs_offset,
                 cos_stride, sin_stride, s);
  }

  // Nothing outside the outputs may change: inputs of out-of-place runs, padding, the v gap of fused qkv.
  if (q_in_alloc->has_mirror()) {
    if (!c.in_place) read_logical(*q_in_alloc, l.q_in);  // refresh the mirror
    std::vector<char> mask(q_in_alloc->mirror.size(), 0);
    if (c.in_place) {
      mark(mask, l.q_in);
      if (l.fused && has_k) mark(mask, l.k_in);
    }
    check_untouched("q input allocation", *q_in_alloc, q_in_before, mask, s);
  }
  if (k_in_alloc && k_in_alloc->has_mirror()) {
    if (!c.in_place) read_logical(*k_in_alloc, l.k_in);
    std::vector<char> mask(k_in_alloc->mirror.size(), 0);
    if (c.in_place) mark(mask, l.k_in);
    check_untouched("k input allocation", *k_in_alloc, k_in_before, mask, s);
  }
  if (!c.in_place) {
    std::vector<char> mask(q_out_alloc->mirror.size(), 0);
    mark(mask, l.q_out);
    check_untouched("q output padding", *q_out_alloc, std::vector<uint16_t>(mask.size(), kPoison), mask, s);
    if (k_out_alloc) {
      std::vector<char> kmask(k_out_alloc->mirror.size(), 0);
      mark(kmask, l.k_out);
      check_untouched("k output padding", *k_out_alloc, std::vector<uint16_t>(kmask.size(), kPoison), kmask, s);
    }
  }
  return s;
}

std::vector<Case> make_cases(bool small) {
  std::vector<Case> cases;
  const std::vector<int> dims = small ? std::vector<int>{128, 40, 6} : std::vector<int>{64, 128, 256, 6, 34, 40};
  const Pos all_pos[] = {Pos::kNone, Pos::kInt32, Pos::kInt64};

  // Every pairing x position mode x head_dim x in/out of place, small contiguous problem.
  for (bool il : {false, true})
    for (int D : dims)
      for (Pos pos : all_pos)
        for (bool ip : {false, true}) cases.push_back(Case{19, 3, 1, D, il, pos, ip, Layout::kContiguous});

  // Layouts: 16-byte path with gaps, scalar fallbacks, scalar cos/sin, transposed, fused qkv views.
  const Layout layouts[] = {Layout::kPadded, Layout::kOddStrides, Layout::kMisalignedBase,
                            Layout::kCsMisaligned, Layout::kHeadMajor, Layout::kFusedQkv};
  const std::vector<int> layout_dims = small ? std::vector<int>{128, 6} : std::vector<int>{128, 256, 40, 6};
  for (bool il : {false, true})
    for (int D : layout_dims)
      for (Layout lay : layouts)
        for (bool ip : {false, true}) {
          if (small && ip != (lay == Layout::kFusedQkv || lay == Layout::kPadded)) continue;
          cases.push_back(Case{19, 3, 1, D, il, lay == Layout::kPadded ? Pos::kInt32 : Pos::kInt64, ip, lay});
        }

  // Sizes: awkward T, production head counts.
  const std::vector<int64_t> sizes = small ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 989};
  const std::vector<std::pair<int, int>> heads =
      small ? std::vector<std::pair<int, int>>{{3, 1}} : std::vector<std::pair<int, int>>{{32, 8}, {3, 1}};
  const std::vector<int> size_dims = small ? std::vector<int>{128} : std::vector<int>{64, 128, 256, 34};
  int n = 0;
  for (bool il : {false, true})
    for (int64_t T : sizes)
      for (auto hk : heads)
        for (int D : size_dims) {
          cases.push_back(Case{T, hk.first, hk.second, D, il, all_pos[n % 3], n % 2 == 1, Layout::kContiguous});
          ++n;
        }

  // q only.
  for (bool il : {false, true})
    for (int D : {128, 6})
      for (bool ip : {false, true}) cases.push_back(Case{19, 4, 0, D, il, Pos::kInt64, ip, Layout::kContiguous});

  // Positions outside [0, max_pos): NaN rows, no out-of-bounds reads.
  for (bool il : {false, true})
    for (Pos pos : {Pos::kInt32, Pos::kInt64})
      for (int D : small ? std::vector<int>{128} : std::vector<int>{128, 34})
        for (bool ip : {false, true}) {
          Case c{19, 3, 1, D, il, pos, ip, Layout::kContiguous};
          c.bad_positions = true;
          cases.push_back(c);
        }

  // A tiny grid: every block runs the token loop several times.
  for (bool il : {false, true})
    for (int D : {128, 6}) {
      Case c{small ? 19 : 989, 32, 8, D, il, Pos::kInt32, false, Layout::kContiguous};
      c.max_blocks = small ? 2 : 3;
      cases.push_back(c);
    }

  // T = 0: no launch, nothing written.
  cases.push_back(Case{0, 3, 1, 128, false, Pos::kInt64, false, Layout::kContiguous});

  // Element offsets past 2^31 (about 4.3 GB of q): 64-bit index math.
  if (!small) {
    for (bool il : {false, true}) {
      Case c{3, 2, 1, 128, il, Pos::kInt64, true, Layout::kContiguous};
      c.huge_token_stride = (int64_t(1) << 30) + 64;
      cases.push_back(c);
    }
  }
  return cases;
}

// The launcher must refuse inconsistent params with a status, not launch.
bool check_rejections() {
  RotaryParams p{};
  uint16_t* dummy = nullptr;
  TEST_CUDA_CHECK(cudaMalloc(&dummy, 256));
  p.q_ptr = dummy;
  p.q_out_ptr = dummy;
  p.cos_ptr = reinterpret_cast<const float*>(dummy);
  p.sin_ptr = reinterpret_cast<const float*>(dummy);
  p.num_tokens = 1;
  p.num_rows = 1;
  p.num_q_heads = 1;
  p.head_dim = 7;
  bool ok = astrai::rotary_bf16_launch(p, plan_of(p), nullptr) == cudaErrorInvalidValue;
  p.head_dim = 8;
  p.num_k_heads = 1;  // k pointers missing
  ok = ok && astrai::rotary_bf16_launch(p, plan_of(p), nullptr) == cudaErrorInvalidValue;
  p.num_k_heads = 0;
  p.num_rows = 2;  // no positions: one row per token is required
  ok = ok && astrai::rotary_bf16_launch(p, plan_of(p), nullptr) == cudaErrorInvalidValue;
  // Valid params, a plan they do not allow: refused before any launch.
  p.num_rows = 1;
  p.head_dim = 64;
  const astrai::RotaryLaunch good = plan_of(p);
  astrai::RotaryLaunch bad = good;
  bad.block_x = 1024;  // more threads than the kernel's bound
  ok = ok && good.pairs == 8 && astrai::rotary_bf16_launch(p, bad, nullptr) == cudaErrorInvalidValue;
  p.q_ptr = reinterpret_cast<const char*>(dummy) + 2;  // x no longer 16-byte aligned: pairs 8 is not allowed
  ok = ok && astrai::rotary_bf16_launch(p, good, nullptr) == cudaErrorInvalidValue;
  ok = ok && plan_of(p).pairs == 1;
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
  print_test_banner("rotary_test", opts);

  Rng rng(seed);
  const std::vector<Case> cases = make_cases(small);
  int failed = 0;
  print_table_header();
  for (size_t i = 0; i < cases.size(); ++i) {
    const ErrorStats s = run_case(cases[i], rng);
    print_table_row(int(i), cases[i].name(), s);
    failed += s.failures > 0;
  }
  const bool rejections_ok = check_rejections();
  std::printf("%zu cases, %d failed (seed %" PRIu64 ")\n", cases.size(), failed, seed);
  return (failed == 0 && rejections_ok) ? 0 : 1;
}
