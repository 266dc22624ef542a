// Standalone correctness table for the quantize launchers against a CPU reference (no torch): every byte of
// every output compared exactly, outputs poisoned first, padding checked untouched.
// Usage: quantize_test [--small] [--seed N]. Exit status: 0 all pass, 1 a case failed, 2 a CUDA error.
#include <algorithm>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "kernels/common/host/device_facts.h"
#include "kernels/quantize/quantize.h"
#include "kernels/quantize/quantize_transpose.cuh"
#include "tests/test_utils.cuh"

namespace {

using namespace astrai;
using namespace astrai_test;

// The plan the op takes (quantize_plan, on the current device), then the launch of exactly it.
cudaError_t planned(const QuantizeParams& p, cudaStream_t stream = nullptr) {
  QuantizeLaunch plan{};
  const cudaError_t status = quantize_plan(p, &plan);
  return status != cudaSuccess ? status : quantize_launch(p, plan, stream);
}

// A transposed call on the register or shared-memory variant the case names (-1 by size, 0, 8, 16).
cudaError_t planned_variant(const QuantizeParams& p, int variant, bool persistent) {
  QuantizeLaunch plan{};
  const cudaError_t status = quantize_detail::quantize_transpose_plan(p, variant, persistent, &plan);
  return status != cudaSuccess ? status : quantize_launch(p, plan, nullptr);
}

// ---- host reference ---------------------------------------------------------------------------------------

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Value of a non-negative finite fp8 code.
double fp8_value(QuantOut fmt, int code) {
  if (fmt == QuantOut::kE4M3) {
    const int e = (code >> 3) & 15, m = code & 7;
    return e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  }
  const int e = (code >> 2) & 31, m = code & 3;
  return e == 0 ? std::ldexp(double(m), -16) : std::ldexp(1.0 + m / 4.0, e - 15);
}

// Round to nearest, ties to the even code, by search over the format's finite codes (independent of any
// conversion routine), after the clamp to +-max; NaN -> 0x7f.
uint8_t ref_fp8(float v, QuantOut fmt) {
  if (std::isnan(v)) return 0x7f;
  const int max_code = fmt == QuantOut::kE4M3 ? 0x7e : 0x7b;
  const double a = std::min(std::fabs(double(v)), fp8_value(fmt, max_code));
  int lo = 0, hi = max_code;  // largest code with value <= a
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (fp8_value(fmt, mid) <= a) lo = mid; else hi = mid - 1;
  }
  int code = lo;
  if (lo < max_code) {
    const double d0 = a - fp8_value(fmt, lo), d1 = fp8_value(fmt, lo + 1) - a;
    if (d1 < d0 || (d1 == d0 && (lo & 1))) code = lo + 1;
  }
  return uint8_t(code | (std::signbit(v) ? 0x80 : 0));
}

uint8_t ref_int8(float v) {
  if (std::isnan(v)) return 0;
  const float c = std::min(std::max(v, -127.0f), 127.0f);
  return uint8_t(int8_t(std::nearbyint(c)));  // default rounding mode: half to even
}

uint8_t ref_cast(float v, QuantOut fmt) { return fmt == QuantOut::kInt8 ? ref_int8(v) : ref_fp8(v, fmt); }

float qmax_of(QuantOut fmt) { return fmt == QuantOut::kE4M3 ? 448.0f : fmt == QuantOut::kE5M2 ? 57344.0f : 127.0f; }

struct Mul {
  float mul, inv;
};
Mul ref_scale(float amax, float qmax, bool pow2) {
  if (!(amax > 0.0f) || !(amax <= FLT_MAX)) return {1.0f, 1.0f};
  volatile float mul = qmax / amax;
  float m = mul;
  if (!(m <= FLT_MAX)) m = pow2 ? std::ldexp(1.0f, 127) : FLT_MAX;
  if (pow2) m = bits_to_float(float_bits(m) & 0xff800000u);
  volatile float inv = 1.0f / m;
  return {m, inv};
}

// max |x| with NaN propagation, as ordered bits.
uint32_t abs_bits(float v) { return float_bits(v) & 0x7fffffffu; }

// ---- inputs ----------------------------------------------------------------------------------------------

const float kSpecials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, -448.0f, 464.0f, 57344.0f, 61440.0f,
                           1e30f, -1e30f, 1.0625f, 1.1875f, 2.5f, -2.5f, 0x1p-9f, 0x1p-10f, 0x3p-10f, 0x1p-16f,
                           0x1p-17f, 1e-38f, -1e-39f, 1e-45f, 127.5f, -126.5f, 0.5f, -0.5f};

// x values as float32 (what the kernel sees after widening), in an allocation of `elem` bytes per element.
struct Input {
  std::vector<float> value;      // [rows, cols] logical values
  std::vector<uint8_t> bytes;    // the allocation, offset elements first
  int64_t offset = 0;            // elements before x[0, 0]
  int64_t row_stride = 0;
};

Input make_input(QuantIn t, int64_t rows, int64_t cols, int64_t row_stride, int64_t offset, Rng& rng) {
  const int elem = t == QuantIn::kF32 ? 4 : 2;
  Input in;
  in.offset = offset;
  in.row_stride = row_stride;
  const int64_t span = offset + (rows > 0 ? (rows - 1) * row_stride + cols : 0) + 8;
  in.bytes.assign(size_t(span * elem), 0);
  in.value.resize(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float v;
      if (rng.uniform(0, 1) < 0.03) {
        v = kSpecials[rng.integer(0, int64_t(sizeof(kSpecials) / sizeof(float)) - 1)];
      } else {
        v = float(rng.uniform(-4, 4) * std::ldexp(1.0, int(rng.integer(-10, 10))));
      }
      uint8_t* dst = in.bytes.data() + size_t((offset + r * row_stride + c) * elem);
      if (t == QuantIn::kF32) {
        std::memcpy(dst, &v, 4);
      } else if (t == QuantIn::kBF16) {
        const uint16_t b = float_to_bf16(v);
        std::memcpy(dst, &b, 2);
        v = bf16_to_float(b);
      } else {
        const __half h = __float2half_rn(v);
        std::memcpy(dst, &h, 2);
        v = __half2float(h);
      }
      in.value[size_t(r * cols + c)] = v;
    }
  }
  return in;
}

// ---- cases -----------------------------------------------------------------------------------------------

enum class Kind { kTensor, kRow, kColumn, kDynTensor, kDynRow, kGroup, kBlock128 };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kTensor: return "tensor";
    case Kind::kRow: return "row";
    case Kind::kColumn: return "column";
    case Kind::kDynTensor: return "dyn-tensor";
    case Kind::kDynRow: return "dyn-row";
    case Kind::kGroup: return "1x128";
    case Kind::kBlock128: return "128x128";
  }
  return "?";
}
const char* in_name(QuantIn t) { return t == QuantIn::kBF16 ? "bf16" : t == QuantIn::kF16 ? "f16" : "f32"; }
const char* out_name(QuantOut t) { return t == QuantOut::kE4M3 ? "e4m3" : t == QuantOut::kE5M2 ? "e5m2" : "int8"; }

struct Case {
  QuantIn in;
  QuantOut out;
  Kind kind;
  int layout;  // 0 row-major, 1 transposed, 2 dual
  QuantAmax amax;
  int64_t rows, cols;
  int64_t pad = 0;      // extra elements per row of x
  int64_t offset = 0;   // x base offset in elements (odd: misaligned, element path)
  bool pow2 = false;
  int max_blocks = 0;
  int transpose_variant = -2;  // >= -1: the transpose plan of that variant (-1 by size, 0, 8, 16), not quantize_plan
  bool persistent = false;     // with transpose_variant: the resident grid

  std::string name() const {
    char buf[240];
    std::snprintf(buf, sizeof buf, "%s->%s %s layout=%d amax=%d %" PRId64 "x%" PRId64 " pad=%" PRId64
                  " off=%" PRId64 "%s%s", in_name(in), out_name(out), kind_name(kind), layout, int(amax), rows, cols,
                  pad, offset, pow2 ? " pow2" : "", max_blocks ? " grid-loop" : "");
    if (transpose_variant >= -1) {
      const size_t n = std::strlen(buf);
      std::snprintf(buf + n, sizeof buf - n, " variant=%d%s", transpose_variant, persistent ? " resident" : "");
    }
    return buf;
  }
};

void compare_bytes(const char* what, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                   ErrorStats& s) {
  for (size_t i = 0; i < want.size(); ++i) {
    ++s.checked;
    if (got[i] != want[i]) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "%s byte %zu: got 0x%02x, want 0x%02x", what, i, got[i], want[i]);
      s.fail(msg);
    }
  }
}

void compare_floats(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                    ErrorStats& s) {
  for (size_t i = 0; i < want.size(); ++i) {
    ++s.checked;
    const bool same = (std::isnan(got[i]) && std::isnan(want[i])) || float_bits(got[i]) == float_bits(want[i]);
    if (!same) {
      char msg[160];
      std::snprintf(msg, sizeof msg, "%s[%zu]: got %.9g (0x%08x), want %.9g (0x%08x)", what, i, got[i],
                    float_bits(got[i]), want[i], float_bits(want[i]));
      s.fail(msg);
    }
  }
}

ErrorStats run_case(const Case& c, Rng& rng) {
  ErrorStats s;
  const int64_t M = c.rows, N = c.cols;
  const int elem = c.in == QuantIn::kF32 ? 4 : 2;
  const Input in = make_input(c.in, M, N, N + c.pad, c.offset, rng);
  DeviceBuffer<uint8_t> x_d(in.bytes.size());
  x_d.upload(in.bytes);
  const float qmax = qmax_of(c.out);
  const uint8_t poison = c.out == QuantOut::kInt8 ? 0x80 : 0xff;  // never produced
  const bool want_out = c.layout != 1, want_t = c.layout != 0;
  DeviceBuffer<uint8_t> out_d(size_t(std::max<int64_t>(M * N, 1) + 16)), out_t_d(size_t(std::max<int64_t>(M * N, 1) + 16));
  TEST_CUDA_CHECK(cudaMemset(out_d.get(), poison, out_d.size()));
  TEST_CUDA_CHECK(cudaMemset(out_t_d.get(), poison, out_t_d.size()));

  // Multipliers (static kinds): positive, varied, some large enough to saturate.
  const int64_t n_scale = c.kind == Kind::kRow ? M : c.kind == Kind::kColumn ? N : 1;
  std::vector<float> scale(size_t(std::max<int64_t>(n_scale, 1)));
  for (auto& v : scale) v = float(std::ldexp(rng.uniform(0.5, 1.0), int(rng.integer(-4, 8))));
  DeviceBuffer<float> scale_d(scale.size());
  scale_d.upload(scale);

  const int64_t groups = N / 128;
  const int64_t sf_rows = c.kind == Kind::kBlock128 ? (M + 127) / 128 : M;
  const size_t sf_count = size_t(std::max<int64_t>(sf_rows * std::max<int64_t>(groups, 1), 1));
  DeviceBuffer<float> sf_d(sf_count + 4), amax_d(size_t(std::max<int64_t>(M, 1))), amax_in_d(1);
  TEST_CUDA_CHECK(cudaMemset(sf_d.get(), 0xff, (sf_count + 4) * sizeof(float)));
  TEST_CUDA_CHECK(cudaMemset(amax_d.get(), 0, amax_d.size() * sizeof(float)));
  TEST_CUDA_CHECK(cudaMemset(amax_in_d.get(), 0, sizeof(float)));

  const void* x_ptr = x_d.get() + in.offset * elem;
  cudaError_t st = cudaSuccess;
  if (c.kind == Kind::kBlock128) {
    BlockQuantParams p{};
    p.x_ptr = x_ptr;
    p.out_ptr = out_d.get();
    p.scale_inv_ptr = sf_d.get();
    p.x_row_stride = in.row_stride;
    p.scale_inv_row_stride = groups;
    p.scale_inv_col_stride = 1;
    p.rows = M;
    p.cols = N;
    p.qmax = qmax;
    p.in_type = c.in;
    p.out_type = c.out;
    p.pow2_scale = c.pow2;
    st = plan_and_launch(quantize_block128_plan, quantize_block128_launch, p, nullptr);
  } else {
    QuantizeParams p{};
    p.x_ptr = x_ptr;
    p.out_ptr = want_out ? out_d.get() : nullptr;
    p.out_t_ptr = want_t ? out_t_d.get() : nullptr;
    p.x_row_stride = in.row_stride;
    p.rows = M;
    p.cols = N;
    p.qmax = qmax;
    p.group_cols = 128;
    p.max_blocks = c.max_blocks;
    p.in_type = c.in;
    p.out_type = c.out;
    p.amax_kind = c.amax;
    p.amax_ptr = c.amax != QuantAmax::kNone ? amax_d.get() : nullptr;
    p.pow2_scale = c.pow2;
    switch (c.kind) {
      case Kind::kTensor: p.scale_kind = QuantScale::kTensor; p.scale_ptr = scale_d.get(); break;
      case Kind::kRow: p.scale_kind = QuantScale::kRow; p.scale_ptr = scale_d.get(); break;
      case Kind::kColumn: p.scale_kind = QuantScale::kColumn; p.scale_ptr = scale_d.get(); break;
      case Kind::kDynTensor: {
        AmaxParams ap{};
        ap.x_ptr = x_ptr;
        ap.amax_ptr = amax_in_d.get();
        ap.x_row_stride = in.row_stride;
        ap.rows = M;
        ap.cols = N;
        ap.max_blocks = c.max_blocks;
        ap.in_type = c.in;
        st = plan_and_launch(quantize_amax_plan, quantize_amax_launch, ap, nullptr);
        p.scale_kind = QuantScale::kFromAmax;
        p.amax_in_ptr = amax_in_d.get();
        p.scale_inv_ptr = sf_d.get();
        break;
      }
      case Kind::kDynRow: p.scale_kind = QuantScale::kDynamicRow; p.scale_inv_ptr = sf_d.get(); break;
      case Kind::kGroup:
        p.scale_kind = QuantScale::kDynamicGroup;
        p.scale_inv_ptr = sf_d.get();
        p.scale_inv_row_stride = groups;
        p.scale_inv_group_stride = 1;
        break;
      default: break;
    }
    if (st == cudaSuccess) {
      st = c.transpose_variant >= -1 && p.out_t_ptr != nullptr
               ? planned_variant(p, c.transpose_variant, c.persistent)
               : planned(p);
    }
  }
  if (st != cudaSuccess) {
    s.fail(std::string("launch returned ") + cudaGetErrorName(st));
    return s;
  }
  TEST_CUDA_CHECK(cudaGetLastError());
  TEST_CUDA_CHECK(cudaDeviceSynchronize());

  // Reference.
  std::vector<float> mul(size_t(M * N), 1.0f);  // multiplier of each element
  std::vector<float> want_sf;
  std::vector<float> want_amax;
  uint32_t t_amax = 0;
  std::vector<uint32_t> r_amax(size_t(M), 0);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < N; ++k) {
      const uint32_t a = abs_bits(in.value[size_t(r * N + k)]);
      t_amax = std::max(t_amax, a);
      r_amax[size_t(r)] = std::max(r_amax[size_t(r)], a);
    }
  switch (c.kind) {
    case Kind::kTensor: std::fill(mul.begin(), mul.end(), scale[0]); break;
    case Kind::kRow:
      for (int64_t r = 0; r < M; ++r) std::fill(mul.begin() + r * N, mul.begin() + (r + 1) * N, scale[size_t(r)]);
      break;
    case Kind::kColumn:
      for (int64_t r = 0; r < M; ++r)
        for (int64_t k = 0; k < N; ++k) mul[size_t(r * N + k)] = scale[size_t(k)];
      break;
    case Kind::kDynTensor: {
      const Mul m = ref_scale(bits_to_float(t_amax), qmax, c.pow2);
      std::fill(mul.begin(), mul.end(), m.mul);
      want_sf = {m.inv};
      break;
    }
    case Kind::kDynRow:
      for (int64_t r = 0; r < M; ++r) {
        const Mul m = ref_scale(bits_to_float(r_amax[size_t(r)]), qmax, c.pow2);
        std::fill(mul.begin() + r * N, mul.begin() + (r + 1) * N, m.mul);
        want_sf.push_back(m.inv);
      }
      break;
    case Kind::kGroup:
    case Kind::kBlock128: {
      const int64_t br = c.kind == Kind::kGroup ? 1 : 128;
      for (int64_t rb = 0; rb < sf_rows; ++rb)
        for (int64_t g = 0; g < groups; ++g) {
          uint32_t a = 0;
          for (int64_t r = rb * br; r < std::min(M, (rb + 1) * br); ++r)
            for (int64_t k = g * 128; k < (g + 1) * 128; ++k) a = std::max(a, abs_bits(in.value[size_t(r * N + k)]));
          const Mul m = ref_scale(bits_to_float(a), qmax, c.pow2);
          want_sf.push_back(m.inv);
          for (int64_t r = rb * br; r < std::min(M, (rb + 1) * br); ++r)
            for (int64_t k = g * 128; k < (g + 1) * 128; ++k) mul[size_t(r * N + k)] = m.mul;
        }
      break;
    }
  }
  std::vector<uint8_t> want(size_t(M * N));
  for (size_t i = 0; i < want.size(); ++i) want[i] = ref_cast(in.value[i] * mul[i], c.out);

  std::vector<uint8_t> got;
  if (want_out || c.kind == Kind::kBlock128) {
    out_d.download(got);
    compare_bytes("out", std::vector<uint8_t>(got.begin(), got.begin() + M * N), want, s);
    for (size_t i = size_t(M * N); i < got.size(); ++i) {
      if (got[i] != poison) s.fail("out: a byte past the tensor was written");
    }
  }
  if (want_t && c.kind != Kind::kBlock128) {
    std::vector<uint8_t> want_t_bytes(size_t(M * N));
    for (int64_t r = 0; r < M; ++r)
      for (int64_t k = 0; k < N; ++k) want_t_bytes[size_t(k * M + r)] = want[size_t(r * N + k)];
    out_t_d.download(got);
    compare_bytes("out_t", std::vector<uint8_t>(got.begin(), got.begin() + M * N), want_t_bytes, s);
    for (size_t i = size_t(M * N); i < got.size(); ++i) {
      if (got[i] != poison) s.fail("out_t: a byte past the tensor was written");
    }
  }
  if (!want_sf.empty()) {
    std::vector<float> sf;
    sf_d.download(sf);
    compare_floats("scale_inv", std::vector<float>(sf.begin(), sf.begin() + want_sf.size()), want_sf, s);
  }
  if (c.amax != QuantAmax::kNone) {
    std::vector<float> a;
    amax_d.download(a);
    if (c.amax == QuantAmax::kTensor) {
      compare_floats("amax", {a[0]}, {bits_to_float(t_amax)}, s);
    } else {
      std::vector<float> w(static_cast<size_t>(M));
      for (int64_t r = 0; r < M; ++r) w[size_t(r)] = bits_to_float(r_amax[size_t(r)]);
      compare_floats("amax", std::vector<float>(a.begin(), a.begin() + M), w, s);
    }
  }
  return s;
}

// Scale-factor layout: MN-major TMA-aligned, plain and packed, vs a bit-level model.
ErrorStats run_layout_case(int64_t mn, int64_t sf_k, bool packed, int64_t k_stride, Rng& rng) {
  ErrorStats s;
  const int64_t mn_stride = 1 + (k_stride == 1 ? sf_k : 0);  // [mn, sf_k] row-major, or MN-major input
  std::vector<float> sf(size_t(std::max<int64_t>(mn * sf_k * 2 + 8, 1)));
  for (auto& v : sf) v = std::ldexp(1.0f, int(rng.integer(-126, 127)));
  const int64_t row_stride = k_stride == 1 ? sf_k : 1;
  const int64_t col_stride = k_stride == 1 ? 1 : mn;
  (void)mn_stride;
  DeviceBuffer<float> sf_d(sf.size());
  sf_d.upload(sf);
  const int64_t aligned = (mn + 3) / 4 * 4;
  const int64_t out_k = packed ? (sf_k + 3) / 4 : sf_k;
  DeviceBuffer<uint32_t> out_d(size_t(std::max<int64_t>(aligned * out_k, 1)));
  TEST_CUDA_CHECK(cudaMemset(out_d.get(), 0xa5, out_d.size() * 4));
  ScaleLayoutParams p{};
  p.sf_ptr = sf_d.get();
  p.out_ptr = out_d.get();
  p.sf_mn_stride = row_stride;
  p.sf_k_stride = col_stride;
  p.mn = mn;
  p.sf_k = sf_k;
  p.packed = packed;
  const cudaError_t st = plan_and_launch(scale_layout_plan, scale_layout_launch, p, nullptr);
  if (st != cudaSuccess) {
    s.fail(std::string("launch returned ") + cudaGetErrorName(st));
    return s;
  }
  TEST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> got;
  out_d.download(got);
  for (int64_t k = 0; k < out_k; ++k)
    for (int64_t i = 0; i < aligned; ++i) {
      uint32_t want = 0;
      if (i < mn) {
        if (packed) {
          for (int j = 0; j < 4; ++j) {
            if (4 * k + j < sf_k) {
              want |= ((float_bits(sf[size_t(i * row_stride + (4 * k + j) * col_stride)]) >> 23) & 0xffu) << (8 * j);
            }
          }
        } else {
          want = float_bits(sf[size_t(i * row_stride + k * col_stride)]);
        }
      }
      ++s.checked;
      if (got[size_t(k * aligned + i)] != want) {
        char msg[160];
        std::snprintf(msg, sizeof msg, "word (i=%" PRId64 ", k=%" PRId64 "): got 0x%08x, want 0x%08x", i, k,
                      got[size_t(k * aligned + i)], want);
        s.fail(msg);
      }
    }
  return s;
}

std::vector<Case> make_cases(bool small) {
  std::vector<Case> cases;
  const QuantIn ins[] = {QuantIn::kBF16, QuantIn::kF16, QuantIn::kF32};
  const QuantOut fp8s[] = {QuantOut::kE4M3, QuantOut::kE5M2};
  struct Shape { int64_t rows, cols, pad, offset; };
  const std::vector<Shape> shapes = small ? std::vector<Shape>{{19, 256, 0, 0}, {19, 100, 3, 1}}
                                          : std::vector<Shape>{{19, 256, 0, 0}, {1, 48, 0, 0}, {989, 100, 0, 0},
                                                               {130, 200, 8, 8}, {19, 100, 3, 1}, {67, 13, 0, 0}};
  // Static multipliers: every input type, format, kind, layout; fused amax.
  for (QuantIn in : ins)
    for (QuantOut out : fp8s)
      for (Kind k : {Kind::kTensor, Kind::kRow, Kind::kColumn})
        for (int layout : {0, 1, 2})
          for (const Shape& sh : shapes) {
            const QuantAmax amax = QuantAmax((layout + int(k)) % 3);
            cases.push_back(Case{in, out, k, layout, amax, sh.rows, sh.cols, sh.pad, sh.offset});
          }
  // int8 static, row-major.
  for (QuantIn in : ins)
    for (Kind k : {Kind::kTensor, Kind::kRow, Kind::kColumn})
      for (const Shape& sh : shapes) cases.push_back(Case{in, QuantOut::kInt8, k, 0, QuantAmax::kRow, sh.rows, sh.cols, sh.pad, sh.offset});
  // Dynamic per tensor (any layout) and per row (fp8 and int8), with and without pow2.
  for (QuantIn in : ins)
    for (QuantOut out : {QuantOut::kE4M3, QuantOut::kE5M2, QuantOut::kInt8})
      for (const Shape& sh : shapes)
        for (bool pow2 : {false, true}) {
          if (small && pow2) continue;
          cases.push_back(Case{in, out, Kind::kDynRow, 0, pow2 ? QuantAmax::kRow : QuantAmax::kTensor, sh.rows, sh.cols, sh.pad, sh.offset, pow2});
          const int layout = out == QuantOut::kInt8 ? 0 : int(sh.rows % 3);
          cases.push_back(Case{in, out, Kind::kDynTensor, layout, QuantAmax::kNone, sh.rows, sh.cols, sh.pad, sh.offset, pow2});
        }
  // Long rows (dynamic per row past the register cache: 256 threads x 8 steps of 16 = 32768 elements of
  // 16-bit x, 16384 of float32), 1 x 128 groups and 128 x 128 blocks.
  for (QuantIn in : ins)
    for (QuantOut out : fp8s) {
      cases.push_back(Case{in, out, Kind::kDynRow, 0, QuantAmax::kRow, 5, small ? 32768 + 16 : 40000, 0, 0});
      for (bool pow2 : {false, true}) {
        cases.push_back(Case{in, out, Kind::kGroup, 0, QuantAmax::kNone, 19, 384, 0, 0, pow2});
        cases.push_back(Case{in, out, Kind::kGroup, 0, QuantAmax::kRow, small ? 3 : 989, 128, 8, 1, pow2});
        cases.push_back(Case{in, out, Kind::kBlock128, 0, QuantAmax::kNone, small ? 130 : 300, 256, 0, 0, pow2});
        cases.push_back(Case{in, out, Kind::kBlock128, 0, QuantAmax::kNone, 1, 128, 3, 1, pow2});
      }
    }
  // A tiny grid: every block loops.
  for (Kind k : {Kind::kTensor, Kind::kDynRow, Kind::kGroup, Kind::kDynTensor}) {
    Case c{QuantIn::kBF16, QuantOut::kE4M3, k, 0, QuantAmax::kTensor, 989, 256, 0, 0};
    c.max_blocks = 2;
    cases.push_back(c);
  }
  for (int layout : {1, 2}) {
    Case c{QuantIn::kBF16, QuantOut::kE4M3, Kind::kRow, layout, QuantAmax::kRow, 300, 200, 0, 0};
    c.max_blocks = 3;
    cases.push_back(c);
  }
  // Transposed raster bands: 20 tile rows (a full band of 16 and a partial one), a partial tile column;
  // with the launcher's grid and with a tiny one (blocks loop across bands).
  for (QuantIn in : {QuantIn::kBF16, QuantIn::kF32})
    for (int layout : {1, 2})
      for (int max_blocks : {0, 5}) {
        Case c{in, QuantOut::kE4M3, Kind::kTensor, layout, QuantAmax::kRow, 2437, 200, 0, 0};
        c.max_blocks = max_blocks;
        if (!small || max_blocks) cases.push_back(c);
      }
  // Every transposed kernel by name and the by-size choice (-1): awkward rows (1, 19, 989; 4100 and 2437: word
  // and byte out_t runs), columns off the 256-column tile, the element path (pad 3, offset 1), every scale kind
  // and fused amax, both formats, looping grids.
  {
    const std::vector<Shape> tshapes = small ? std::vector<Shape>{{19, 100, 0, 0}, {989, 136, 3, 1}}
                                             : std::vector<Shape>{{1, 48, 0, 0}, {19, 256, 0, 0}, {989, 100, 0, 0},
                                                                  {19, 100, 3, 1}, {67, 13, 0, 0}, {4100, 72, 0, 0},
                                                                  {2437, 200, 8, 8}, {512, 136, 0, 0}, {130, 300, 0, 0}};
    int r = 0;
    for (int variant : {-1, 0, 8, 16})
      for (QuantIn in : ins)
        for (int layout : {1, 2})
          for (const Shape& sh : tshapes) {
            const Kind kinds[] = {Kind::kTensor, Kind::kRow, Kind::kColumn, Kind::kDynTensor};
            const Kind k = kinds[r % 4];
            const QuantAmax amax = k == Kind::kDynTensor ? QuantAmax::kNone : QuantAmax((r / 4) % 3);
            Case c{in, fp8s[r % 2], k, layout, amax, sh.rows, sh.cols, sh.pad, sh.offset, k == Kind::kDynTensor && r % 3 == 0};
            c.transpose_variant = variant;
            c.persistent = r % 5 == 0;
            c.max_blocks = r % 7 == 0 ? 3 : 0;
            cases.push_back(c);
            ++r;
          }
  }
  // Dynamic rows on the persistent grid with more rows than resident blocks hold: blocks loop and prefetch.
  if (!small) {
    cases.push_back(Case{QuantIn::kBF16, QuantOut::kE4M3, Kind::kDynRow, 0, QuantAmax::kRow, 20011, 64, 0, 0});
    cases.push_back(Case{QuantIn::kF16, QuantOut::kInt8, Kind::kDynRow, 0, QuantAmax::kTensor, 20011, 48, 0, 0});
  }
  // Empty.
  cases.push_back(Case{QuantIn::kBF16, QuantOut::kE4M3, Kind::kTensor, 2, QuantAmax::kNone, 0, 64, 0, 0});
  return cases;
}

bool check_rejections() {
  float* dummy = nullptr;
  TEST_CUDA_CHECK(cudaMalloc(&dummy, 256));
  QuantizeParams p{};
  p.x_ptr = dummy;
  p.out_ptr = dummy;
  p.rows = 1;
  p.cols = 16;
  p.x_row_stride = 16;
  p.qmax = 448.0f;
  p.scale_kind = QuantScale::kTensor;  // scale_ptr missing
  bool ok = planned(p) == cudaErrorInvalidValue;
  p.scale_ptr = dummy;
  p.out_type = QuantOut::kInt8;
  p.out_t_ptr = dummy;  // int8 transposed
  ok = ok && planned(p) == cudaErrorInvalidValue;
  // The fused fold: per-tensor multiplier and amax, fp8, a ring whose scale is the multiplier.
  p.out_t_ptr = nullptr;
  p.out_type = QuantOut::kE4M3;
  p.amax_kind = QuantAmax::kTensor;
  p.amax_ptr = dummy;
  p.fold_counter_ptr = reinterpret_cast<uint32_t*>(dummy);
  p.fold.ring_ptr = dummy;
  p.fold.pos_ptr = reinterpret_cast<int64_t*>(dummy);
  p.fold.len = 4;
  p.fold.qmax = 448.0f;
  p.fold.scale_ptr = dummy + 1;  // not the multiplier
  ok = ok && planned(p) == cudaErrorInvalidValue;
  p.fold.scale_ptr = dummy;
  p.scale_kind = QuantScale::kRow;  // not per tensor
  ok = ok && planned(p) == cudaErrorInvalidValue;
  p.scale_kind = QuantScale::kTensor;
  p.out_type = QuantOut::kInt8;  // not fp8
  ok = ok && planned(p) == cudaErrorInvalidValue;
  p.out_type = QuantOut::kE4M3;
  p.fold.ring_ptr = nullptr;  // no ring
  ok = ok && planned(p) == cudaErrorInvalidValue;
  BlockQuantParams b{};
  b.x_ptr = dummy;
  b.out_ptr = dummy;
  b.scale_inv_ptr = dummy;
  b.rows = 1;
  b.cols = 100;  // not a multiple of 128
  b.qmax = 448.0f;
  ok = ok && plan_and_launch(quantize_block128_plan, quantize_block128_launch, b, nullptr) == cudaErrorInvalidValue;
  // Valid params, a plan they do not allow: refused before any launch.
  QuantizeParams r{};
  r.x_ptr = dummy;
  r.out_ptr = dummy;
  r.scale_ptr = dummy;
  r.rows = 1;
  r.cols = 16;
  r.x_row_stride = 16;
  r.qmax = 448.0f;
  r.scale_kind = QuantScale::kTensor;
  QuantizeLaunch good{};
  ok = ok && quantize_plan(r, &good) == cudaSuccess && good.kernel == QuantizeKernel::kRows && good.vec;
  QuantizeLaunch bad = good;
  bad.threads_per_row = 12;  // not a power of two
  ok = ok && quantize_launch(r, bad, nullptr) == cudaErrorInvalidValue;
  bad = good;
  bad.kernel = QuantizeKernel::kTransposeRegs8;  // no transposed output
  ok = ok && quantize_launch(r, bad, nullptr) == cudaErrorInvalidValue;
  r.x_ptr = reinterpret_cast<const char*>(dummy) + 2;  // misaligned x: the 16-byte variant is not allowed
  ok = ok && quantize_launch(r, good, nullptr) == cudaErrorInvalidValue;
  r.x_ptr = dummy;
  r.out_ptr = nullptr;
  r.out_t_ptr = dummy;
  r.in_type = QuantIn::kF32;
  bad = QuantizeLaunch{QuantizeKernel::kTransposeRegs16, false, 0, 1};  // bf16 input only
  ok = ok && quantize_launch(r, bad, nullptr) == cudaErrorInvalidValue;
  b.cols = 128;  // valid; a grid of no blocks and a 16-byte variant on misaligned x are refused
  b.x_row_stride = 128;
  QuantizeGridLaunch grid{};
  ok = ok && quantize_block128_plan(b, &grid) == cudaSuccess && grid.blocks >= 1;
  ok = ok && quantize_block128_launch(b, QuantizeGridLaunch{grid.vec, 0}, nullptr) == cudaErrorInvalidValue;
  b.x_ptr = reinterpret_cast<const char*>(dummy) + 2;
  ok = ok && quantize_block128_launch(b, QuantizeGridLaunch{true, 1}, nullptr) == cudaErrorInvalidValue;
  TEST_CUDA_CHECK(cudaGetLastError());
  TEST_CUDA_CHECK(cudaFree(dummy));
  std::printf("launchers reject inconsistent params with cudaErrorInvalidValue: %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

// Known bytes, independent of the search reference.
bool check_reference_anchors() {
  struct A { float v; QuantOut f; uint8_t want; };
  const A anchors[] = {{448.0f, QuantOut::kE4M3, 0x7e}, {1e9f, QuantOut::kE4M3, 0x7e}, {-INFINITY, QuantOut::kE4M3, 0xfe},
                       {NAN, QuantOut::kE4M3, 0x7f}, {-NAN, QuantOut::kE5M2, 0x7f}, {0x1p-9f, QuantOut::kE4M3, 0x01},
                       {0x1p-10f, QuantOut::kE4M3, 0x00}, {0x3p-10f, QuantOut::kE4M3, 0x02}, {-0.0f, QuantOut::kE4M3, 0x80},
                       {57344.0f, QuantOut::kE5M2, 0x7b}, {INFINITY, QuantOut::kE5M2, 0x7b}, {1.0f, QuantOut::kE5M2, 0x3c},
                       {1.0f, QuantOut::kE4M3, 0x38}, {1.0625f, QuantOut::kE4M3, 0x38}, {1.1875f, QuantOut::kE4M3, 0x3a},
                       {2.5f, QuantOut::kInt8, 2}, {3.5f, QuantOut::kInt8, 4}, {-200.0f, QuantOut::kInt8, 0x81},
                       {NAN, QuantOut::kInt8, 0}};
  bool ok = true;
  for (const A& a : anchors) {
    const uint8_t got = ref_cast(a.v, a.f);
    if (got != a.want) {
      std::printf("reference anchor %g (%s): got 0x%02x, want 0x%02x\n", a.v, out_name(a.f), got, a.want);
      ok = false;
    }
  }
  std::printf("reference anchors: %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

// resident_blocks_per_sm (the launchers' cached occupancy) against the runtime's answer, asked cold and again from the
// cache, at two block sizes of one kernel (the block size is part of the key) and a second kernel.
bool check_resident_cache() {
  const void* kernels[] = {
      reinterpret_cast<const void*>(&quantize::quantize_transpose_kernel<QuantIn::kBF16, QuantOut::kE4M3, true>),
      reinterpret_cast<const void*>(&quantize::quantize_transpose_kernel<QuantIn::kF32, QuantOut::kE5M2, false>)};
  bool ok = true;
  for (const void* kernel : kernels) {
    for (int threads : {quantize::kTransposeThreads, 64}) {
      int want = -1;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&want, kernel, threads, 0) != cudaSuccess) return false;
      for (int pass = 0; pass < 2; ++pass) {
        int got = -1;
        const cudaError_t status = resident_blocks_per_sm(kernel, threads, 0, &got);
        if (status != cudaSuccess || got != want) {
          std::printf("resident_blocks_per_sm %d threads, pass %d: %d (%s), want %d\n", threads, pass, got,
                      cudaGetErrorString(status), want);
          ok = false;
        }
      }
    }
  }
  std::printf("resident blocks cache: %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const TestOptions opts = parse_test_options(argc, argv);
  if (!opts.ok) return 2;
  const bool small = opts.small;
  const uint64_t seed = opts.seed;
  print_test_banner("quantize_test", opts);
  const bool anchors_ok = check_reference_anchors();
  const bool resident_ok = check_resident_cache();
  Rng rng(seed);
  const std::vector<Case> cases = make_cases(small);
  int failed = 0, index = 0;
  print_table_header();
  for (const Case& c : cases) {
    const ErrorStats s = run_case(c, rng);
    print_table_row(index++, c.name(), s);
    failed += s.failures > 0;
  }
  struct L { int64_t mn, sf_k; bool packed; int64_t k_stride; };
  const L layouts[] = {{6, 9, true, 1}, {6, 12, true, 1}, {6, 10, false, 1}, {1, 1, true, 1}, {13, 5, true, 0},
                       {13, 5, false, 0}, {989, 56, true, 1}, {4, 4, true, 1}};
  for (const L& l : layouts) {
    const ErrorStats s = run_layout_case(l.mn, l.sf_k, l.packed, l.k_stride, rng);
    char name[120];
    std::snprintf(name, sizeof name, "scale_layout mn=%" PRId64 " sf_k=%" PRId64 " %s %s", l.mn, l.sf_k,
                  l.packed ? "packed" : "plain", l.k_stride == 1 ? "row-major in" : "mn-major in");
    print_table_row(index++, name, s);
    failed += s.failures > 0;
  }
  const bool rejections_ok = check_rejections();
  std::printf("%d cases, %d failed (seed %" PRIu64 ")\n", index, failed, seed);
  return (failed == 0 && rejections_ok && anchors_ok && resident_ok) ? 0 : 1;
}
