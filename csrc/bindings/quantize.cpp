// Stable-ABI registration of the quantize ops: validate, pack the params, launch on the current stream; and the
// tensor-free quantize_plan and quantize_can_implement ops (what probe() and the policy ask).
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include "bindings/stable_helpers.h"
#include "kernels/quantize/quantize.h"

namespace astrai {
namespace {

using binding::check;
using binding::fail;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// The explicit plan of a quantize launch (quantize_plan, on the current device), then the launch of exactly it.
cudaError_t launch_planned(const QuantizeParams& p, cudaStream_t stream) {
  return plan_and_launch(quantize_plan, quantize_launch, p, stream);
}

constexpr const char* kOpStatic = "astrai.quantize";
constexpr const char* kOpDynamic = "astrai.quantize_dynamic";
constexpr const char* kOpBlock = "astrai.quantize_block";
constexpr const char* kOpLayout = "astrai.scale_layout";
constexpr const char* kOpFold = "astrai.amax_history_fold";
constexpr const char* kOpDelayed = "astrai.quantize_delayed";

constexpr int64_t kGroup = 128;  // columns of one block / group

// ---- argument checks --------------------------------------------------------------------------------

// Why the kernels cannot read an x of this dtype whose last dimension has this size and stride; empty when they
// can. check_x enforces the same rules with the same words; the policy (backend/quantize.py) asks them without
// tensors, on the CPU too, instead of restating them.
std::string quantize_can_implement(ScalarType x_dtype, int64_t last_size, int64_t last_stride) {
  if (x_dtype != ScalarType::BFloat16 && x_dtype != ScalarType::Half && x_dtype != ScalarType::Float) {
    return std::string("x must be bfloat16, float16 or float32, got ") + binding::dtype_name(x_dtype);
  }
  if (last_size > 1 && last_stride != 1) {
    return "x must have stride 1 in its last dimension, got " + std::to_string(last_stride);
  }
  return std::string();
}

QuantIn check_x(const char* op, const Tensor& x) {
  const ScalarType t = x.scalar_type();
  const std::string dtype = quantize_can_implement(t, 1, 1);
  check(dtype.empty(), op, dtype);
  binding::check_rank(op, "x", x, 2, "[M, N]");  // x: (M, N)
  binding::check_strides(op, "x", x);  // the last-dimension rule of quantize_can_implement, with x's shape
  binding::check_element_aligned(op, "x", x);
  return t == ScalarType::BFloat16 ? QuantIn::kBF16 : t == ScalarType::Half ? QuantIn::kF16 : QuantIn::kF32;
}

// out_dtype -> (format, qmax); int8 only where `int8_ok`.
QuantOut check_out_dtype(const char* op, ScalarType t, bool int8_ok, float* qmax) {
  if (t == ScalarType::Float8_e4m3fn) {
    *qmax = 448.0f;
    return QuantOut::kE4M3;
  }
  if (t == ScalarType::Float8_e5m2) {
    *qmax = 57344.0f;
    return QuantOut::kE5M2;
  }
  if (t == ScalarType::Char && int8_ok) {
    *qmax = 127.0f;
    return QuantOut::kInt8;
  }
  fail(op, "out_dtype must be float8_e4m3fn or float8_e5m2", int8_ok ? " or int8" : "",
       int8_ok ? "" : " here (int8 is row-major only)", ", got ", binding::dtype_name(t));
}

void check_layout(const char* op, int64_t layout) {
  check(layout >= 0 && layout <= 2, op, "layout must be 0 (row-major), 1 (transposed) or 2 (both), got ", layout);
}

int64_t nonzero_stride(const Tensor& t, int64_t d) { return t.size(d) == 1 ? int64_t(0) : t.stride(d); }

// The multiplier's kind from its shape: [] / [1] / [1, 1] per tensor, [M, 1] per row, [1, N] per column.
QuantScale check_scale(const char* op, const Tensor& scale, const Tensor& x) {
  binding::check_dtype(op, "scale", scale, ScalarType::Float);
  const int64_t M = x.size(0), N = x.size(1);
  const bool one = scale.numel() == 1 && scale.dim() <= 2;
  QuantScale kind = QuantScale::kTensor;
  if (one) {
    kind = QuantScale::kTensor;
  } else if (scale.dim() == 2 && scale.size(0) == M && scale.size(1) == 1) {
    kind = QuantScale::kRow;
    check(M <= 1 || scale.stride(0) == 1, op, "scale [M, 1] must be contiguous, got strides ",
          binding::strides_text(scale));
  } else if (scale.dim() == 2 && scale.size(0) == 1 && scale.size(1) == N) {
    kind = QuantScale::kColumn;
    check(N <= 1 || scale.stride(1) == 1, op, "scale [1, N] must be contiguous, got strides ",
          binding::strides_text(scale));
  } else {
    fail(op, "scale must be [] or [1] (per tensor), [M, 1] = [", M, ", 1] (per row) or [1, N] = [1, ", N,
         "] (per column) for x of shape ", binding::shape_text(x), ", got ", binding::shape_text(scale));
  }
  binding::check_element_aligned(op, "scale", scale);
  return kind;
}

std::string config_str(const char* kernel, const Tensor& x, const char* extra, int32_t device_index) {
  std::ostringstream s;
  s << kernel << " (x " << binding::dtype_name(x.scalar_type()) << " " << binding::shape_text(x) << ", strides "
    << binding::strides_text(x) << ", " << extra << ", device=cuda:" << device_index << ")";
  return s.str();
}

Tensor empty_1d(const Tensor& like) { return torch::stable::new_empty(like, {0}, ScalarType::Float); }

// [mn, k] float32 with strides (1, align(mn, 4)): MN-major, TMA-aligned (DeepGEMM's scale-factor layout).
Tensor new_mn_major(const Tensor& like, int64_t mn, int64_t k, ScalarType dtype) {
  const int64_t aligned = (mn + 3) / 4 * 4;
  Tensor buf = torch::stable::new_empty(like, {k, aligned}, dtype);
  Tensor mn_major = torch::stable::transpose(buf, 0, 1);  // [aligned, k], strides (1, aligned)
  return torch::stable::narrow(mn_major, 0, 0, mn);
}

QuantizeParams base_params(const Tensor& x, QuantIn in, QuantOut out_type, float qmax) {
  QuantizeParams p{};
  p.x_ptr = x.data_ptr();
  p.x_row_stride = nonzero_stride(x, 0);
  p.rows = x.size(0);
  p.cols = x.size(1);
  p.in_type = in;
  p.out_type = out_type;
  p.qmax = qmax;
  p.group_cols = int32_t(kGroup);
  return p;
}

// ---- quantize (static multiplier) ---------------------------------------------------------------------

struct StaticArgs {
  QuantIn in;
  QuantOut out_type;
  float qmax;
  QuantScale kind;
  QuantAmax amax;
};

StaticArgs validate_static(const Tensor& x, const Tensor& scale, ScalarType out_dtype, int64_t layout,
                           int64_t amax) {
  StaticArgs a{};
  a.in = check_x(kOpStatic, x);
  check_layout(kOpStatic, layout);
  a.out_type = check_out_dtype(kOpStatic, out_dtype, layout == 0, &a.qmax);
  check(amax >= 0 && amax <= 2, kOpStatic, "amax must be 0 (none), 1 (per tensor) or 2 (per row), got ", amax);
  a.amax = QuantAmax(int32_t(amax));
  a.kind = check_scale(kOpStatic, scale, x);
  binding::check_cuda_device(kOpStatic, "x", x);
  binding::check_same_device(kOpStatic, "scale", scale, "x", x);
  return a;
}

std::tuple<Tensor, Tensor, Tensor> quantize_cuda(const Tensor& x, const Tensor& scale, ScalarType out_dtype,
                                                 int64_t layout, int64_t amax) {
  const StaticArgs a = validate_static(x, scale, out_dtype, layout, amax);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  const int64_t M = x.size(0), N = x.size(1);
  QuantizeParams p = base_params(x, a.in, a.out_type, a.qmax);
  Tensor out = layout != 1 ? torch::stable::new_empty(x, {M, N}, out_dtype) : torch::stable::new_empty(x, {0}, out_dtype);
  Tensor out_t = layout != 0 ? torch::stable::new_empty(x, {N, M}, out_dtype) : torch::stable::new_empty(x, {0}, out_dtype);
  Tensor amax_t = a.amax == QuantAmax::kTensor ? torch::stable::new_zeros(x, {1}, ScalarType::Float)
                  : a.amax == QuantAmax::kRow  ? torch::stable::new_zeros(x, {M}, ScalarType::Float)
                                               : empty_1d(x);
  p.out_ptr = layout != 1 ? out.data_ptr() : nullptr;
  p.out_t_ptr = layout != 0 ? out_t.data_ptr() : nullptr;
  p.scale_ptr = static_cast<const float*>(scale.data_ptr());
  p.scale_kind = a.kind;
  p.amax_kind = a.amax;
  p.amax_ptr = a.amax != QuantAmax::kNone ? static_cast<float*>(amax_t.data_ptr()) : nullptr;
  if (M > 0 && N > 0) {
    const cudaStream_t stream = binding::current_cuda_stream(kOpStatic, x.get_device_index());
    binding::check_cuda_status(launch_planned(p, stream), kOpStatic, [&] {
      return config_str("quantize", x, layout == 0 ? "layout 0" : layout == 1 ? "layout 1" : "layout 2",
                        x.get_device_index());
    });
  }
  return std::make_tuple(out, out_t, amax_t);
}

std::tuple<Tensor, Tensor, Tensor> quantize_cpu(const Tensor& x, const Tensor& scale, ScalarType out_dtype,
                                                int64_t layout, int64_t amax) {
  validate_static(x, scale, out_dtype, layout, amax);
  fail(kOpStatic, "x must be a CUDA tensor, got ", binding::device_text(x));
}

// ---- quantize_dynamic (per tensor: amax pass + cast pass; per row: one pass) ----------------------------

struct DynamicArgs {
  QuantIn in;
  QuantOut out_type;
  float qmax;
};

DynamicArgs validate_dynamic(const Tensor& x, ScalarType out_dtype, int64_t granularity, int64_t layout) {
  DynamicArgs a{};
  a.in = check_x(kOpDynamic, x);
  check(granularity == 0 || granularity == 1, kOpDynamic,
        "granularity must be 0 (per tensor) or 1 (per row), got ", granularity);
  check_layout(kOpDynamic, layout);
  check(granularity == 0 || layout == 0, kOpDynamic,
        "layout must be 0 for per-row scales (granularity 1), got ", layout);
  a.out_type = check_out_dtype(kOpDynamic, out_dtype, layout == 0, &a.qmax);
  binding::check_cuda_device(kOpDynamic, "x", x);
  return a;
}

std::tuple<Tensor, Tensor, Tensor> quantize_dynamic_cuda(const Tensor& x, ScalarType out_dtype, int64_t granularity,
                                                         bool pow2_scale, int64_t layout) {
  const DynamicArgs a = validate_dynamic(x, out_dtype, granularity, layout);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  const int64_t M = x.size(0), N = x.size(1);
  Tensor out = layout != 1 ? torch::stable::new_empty(x, {M, N}, out_dtype) : torch::stable::new_empty(x, {0}, out_dtype);
  Tensor out_t = layout != 0 ? torch::stable::new_empty(x, {N, M}, out_dtype) : torch::stable::new_empty(x, {0}, out_dtype);
  QuantizeParams p = base_params(x, a.in, a.out_type, a.qmax);
  p.out_ptr = layout != 1 ? out.data_ptr() : nullptr;
  p.out_t_ptr = layout != 0 ? out_t.data_ptr() : nullptr;
  p.pow2_scale = pow2_scale;
  const int32_t dev = x.get_device_index();
  if (granularity == 1) {
    Tensor scale_inv = torch::stable::new_empty(x, {M, 1}, ScalarType::Float);
    p.scale_kind = QuantScale::kDynamicRow;
    p.scale_inv_ptr = static_cast<float*>(scale_inv.data_ptr());
    if (M > 0 && N > 0) {
      const cudaStream_t stream = binding::current_cuda_stream(kOpDynamic, dev);
      binding::check_cuda_status(launch_planned(p, stream), kOpDynamic,
                                 [&] { return config_str("quantize per row", x, "dynamic", dev); });
    } else if (M > 0) {
      // No columns: amax 0, so the multiplier is 1.
      torch::stable::fill_(scale_inv, 1.0);
    }
    return std::make_tuple(out, out_t, scale_inv);
  }
  // Per tensor: amax (zeroed, atomically maxed), then the cast reads it and writes scale_inv.
  Tensor amax_t = torch::stable::new_zeros(x, {1}, ScalarType::Float);
  Tensor scale_inv = torch::stable::new_empty(x, {1}, ScalarType::Float);
  if (M > 0 && N > 0) {
    const cudaStream_t stream = binding::current_cuda_stream(kOpDynamic, dev);
    AmaxParams ap{};
    ap.x_ptr = x.data_ptr();
    ap.amax_ptr = static_cast<float*>(amax_t.data_ptr());
    ap.x_row_stride = p.x_row_stride;
    ap.rows = M;
    ap.cols = N;
    ap.in_type = a.in;
    binding::check_cuda_status(plan_and_launch(quantize_amax_plan, quantize_amax_launch, ap, stream), kOpDynamic,
                               [&] { return config_str("amax", x, "per tensor", dev); });
    p.scale_kind = QuantScale::kFromAmax;
    p.amax_in_ptr = ap.amax_ptr;
    p.scale_inv_ptr = static_cast<float*>(scale_inv.data_ptr());
    binding::check_cuda_status(launch_planned(p, stream), kOpDynamic,
                               [&] { return config_str("quantize per tensor", x, "dynamic", dev); });
  } else {
    torch::stable::fill_(scale_inv, 1.0);
  }
  return std::make_tuple(out, out_t, scale_inv);
}

std::tuple<Tensor, Tensor, Tensor> quantize_dynamic_cpu(const Tensor& x, ScalarType out_dtype, int64_t granularity,
                                                        bool pow2_scale, int64_t layout) {
  validate_dynamic(x, out_dtype, granularity, layout);
  fail(kOpDynamic, "x must be a CUDA tensor, got ", binding::device_text(x));
}

// ---- quantize_block (1 x 128 groups or 128 x 128 blocks) -------------------------------------------------

struct BlockArgs {
  QuantIn in;
  QuantOut out_type;
  float qmax;
};

BlockArgs validate_block(const Tensor& x, ScalarType out_dtype, int64_t block_rows) {
  BlockArgs a{};
  a.in = check_x(kOpBlock, x);
  a.out_type = check_out_dtype(kOpBlock, out_dtype, false, &a.qmax);
  check(block_rows == 1 || block_rows == kGroup, kOpBlock, "block_rows must be 1 (1 x 128 groups) or 128 (128 x 128 ",
        "blocks), got ", block_rows);
  check(x.size(1) % kGroup == 0, kOpBlock, "the block size 128 does not divide N = x.size(1) = ", x.size(1),
        " (x shape ", binding::shape_text(x), "); pad the columns to a multiple of 128");
  binding::check_cuda_device(kOpBlock, "x", x);
  return a;
}

std::tuple<Tensor, Tensor> quantize_block_cuda(const Tensor& x, ScalarType out_dtype, int64_t block_rows,
                                               bool pow2_scale, bool scale_mn_major) {
  const BlockArgs a = validate_block(x, out_dtype, block_rows);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  const int64_t M = x.size(0), N = x.size(1);
  const int64_t sf_rows = (M + block_rows - 1) / block_rows, sf_cols = N / kGroup;
  Tensor out = torch::stable::new_empty(x, {M, N}, out_dtype);
  Tensor scale_inv = scale_mn_major ? new_mn_major(x, sf_rows, sf_cols, ScalarType::Float)
                                    : torch::stable::new_empty(x, {sf_rows, sf_cols}, ScalarType::Float);
  if (M == 0 || N == 0) return std::make_tuple(out, scale_inv);
  const int32_t dev = x.get_device_index();
  const cudaStream_t stream = binding::current_cuda_stream(kOpBlock, dev);
  float* sf = static_cast<float*>(scale_inv.data_ptr());
  if (block_rows == 1) {
    QuantizeParams p = base_params(x, a.in, a.out_type, a.qmax);
    p.out_ptr = out.data_ptr();
    p.scale_kind = QuantScale::kDynamicGroup;
    p.scale_inv_ptr = sf;
    p.scale_inv_row_stride = scale_inv.stride(0);
    p.scale_inv_group_stride = scale_inv.stride(1);
    p.pow2_scale = pow2_scale;
    binding::check_cuda_status(launch_planned(p, stream), kOpBlock,
                               [&] { return config_str("quantize 1x128", x, "dynamic", dev); });
  } else {
    BlockQuantParams p{};
    p.x_ptr = x.data_ptr();
    p.out_ptr = out.data_ptr();
    p.scale_inv_ptr = sf;
    p.x_row_stride = nonzero_stride(x, 0);
    p.scale_inv_row_stride = scale_inv.stride(0);
    p.scale_inv_col_stride = scale_inv.stride(1);
    p.rows = M;
    p.cols = N;
    p.qmax = a.qmax;
    p.in_type = a.in;
    p.out_type = a.out_type;
    p.pow2_scale = pow2_scale;
    binding::check_cuda_status(plan_and_launch(quantize_block128_plan, quantize_block128_launch, p, stream), kOpBlock,
                               [&] { return config_str("quantize 128x128", x, "dynamic", dev); });
  }
  return std::make_tuple(out, scale_inv);
}

std::tuple<Tensor, Tensor> quantize_block_cpu(const Tensor& x, ScalarType out_dtype, int64_t block_rows,
                                              bool pow2_scale, bool scale_mn_major) {
  validate_block(x, out_dtype, block_rows);
  fail(kOpBlock, "x must be a CUDA tensor, got ", binding::device_text(x));
}

// ---- scale_layout ----------------------------------------------------------------------------------------

void validate_layout(const Tensor& sf) {
  binding::check_dtype(kOpLayout, "sf", sf, ScalarType::Float);
  binding::check_rank(kOpLayout, "sf", sf, 2, "[MN, SF_K]");  // sf: (MN, SF_K)
  for (int64_t d = 0; d < 2; ++d) {
    check(sf.stride(d) >= 0, kOpLayout, "sf must have non-negative strides, got ", binding::strides_text(sf));
  }
  binding::check_element_aligned(kOpLayout, "sf", sf);
  binding::check_cuda_device(kOpLayout, "sf", sf);
}

Tensor scale_layout_cuda(const Tensor& sf, bool pack_ue8m0) {
  validate_layout(sf);
  torch::stable::accelerator::DeviceGuard guard(sf.get_device_index());
  const int64_t mn = sf.size(0), sf_k = sf.size(1);
  const int64_t out_k = pack_ue8m0 ? (sf_k + 3) / 4 : sf_k;
  Tensor out = new_mn_major(sf, mn, out_k, pack_ue8m0 ? ScalarType::Int : ScalarType::Float);
  if (mn == 0 || sf_k == 0) return out;
  ScaleLayoutParams p{};
  p.sf_ptr = static_cast<const float*>(sf.data_ptr());
  p.out_ptr = out.data_ptr();
  p.sf_mn_stride = sf.stride(0);
  p.sf_k_stride = sf.stride(1);
  p.mn = mn;
  p.sf_k = sf_k;
  p.packed = pack_ue8m0;
  const cudaStream_t stream = binding::current_cuda_stream(kOpLayout, sf.get_device_index());
  binding::check_cuda_status(plan_and_launch(scale_layout_plan, scale_layout_launch, p, stream), kOpLayout, [&] {
    std::ostringstream cfg;
    cfg << "scale_layout (sf " << binding::shape_text(sf) << ", " << (pack_ue8m0 ? "packed ue8m0" : "float32") << ")";
    return cfg.str();
  });
  return out;
}

Tensor scale_layout_cpu(const Tensor& sf, bool pack_ue8m0) {
  validate_layout(sf);
  fail(kOpLayout, "sf must be a CUDA tensor, got ", binding::device_text(sf));
}

// ---- amax_history_fold (the delayed-scaling ring fold, in place) ------------------------------------------

// A one-element float32 / int64 / int32 tensor.
void check_scalar_tensor(const char* op, const char* name, const Tensor& t, ScalarType dtype) {
  binding::check_dtype(op, name, t, dtype);
  check(t.numel() == 1, op, name, " must hold one element, got shape ", binding::shape_text(t));
  binding::check_element_aligned(op, name, t);
}

// The ring state of a fold (ring, pos, scale, scale_inv): dtypes and shapes.
void check_ring(const char* op, const Tensor& ring, const Tensor& pos, const Tensor& scale,
                const std::optional<Tensor>& scale_inv, int64_t margin) {
  binding::check_dtype(op, "ring", ring, ScalarType::Float);
  binding::check_rank(op, "ring", ring, 1, "[history_len]");  // ring: (history_len,)
  check(ring.numel() >= 1, op, "ring must hold at least one slot, got shape ", binding::shape_text(ring));
  check(ring.numel() <= 1 || ring.stride(0) == 1, op, "ring must be contiguous, got strides ",
        binding::strides_text(ring));
  binding::check_element_aligned(op, "ring", ring);
  check_scalar_tensor(op, "pos", pos, ScalarType::Long);
  check_scalar_tensor(op, "scale", scale, ScalarType::Float);
  if (scale_inv.has_value()) check_scalar_tensor(op, "scale_inv", *scale_inv, ScalarType::Float);
  check(margin >= 0 && margin <= (int64_t(1) << 30), op, "margin must be in [0, 2^30], got ", margin);
}

AmaxHistoryParams ring_params(const Tensor& ring, const Tensor& pos, const Tensor& scale,
                              const std::optional<Tensor>& scale_inv, double qmax, int64_t margin) {
  AmaxHistoryParams p{};
  p.ring_ptr = static_cast<float*>(ring.data_ptr());
  p.pos_ptr = static_cast<int64_t*>(pos.data_ptr());
  p.scale_ptr = static_cast<float*>(scale.data_ptr());
  p.scale_inv_ptr = scale_inv.has_value() ? static_cast<float*>(scale_inv->data_ptr()) : nullptr;
  p.len = ring.numel();
  p.qmax = float(qmax);
  p.margin = int32_t(margin);
  return p;
}

// Dtypes and shapes first, devices last (as the other ops): a CPU call reports a bad argument before "must be
// a CUDA tensor".
void validate_fold(const Tensor& ring, const Tensor& pos, const Tensor& scale, const std::optional<Tensor>& scale_inv,
                   const Tensor& amax, double qmax, int64_t margin) {
  check_ring(kOpFold, ring, pos, scale, scale_inv, margin);
  check_scalar_tensor(kOpFold, "amax", amax, ScalarType::Float);
  check(qmax > 0.0 && qmax <= 3.4028234663852886e38, kOpFold, "qmax must be finite and > 0, got ", qmax);
  binding::check_cuda_device(kOpFold, "ring", ring);
  binding::check_same_device(kOpFold, "pos", pos, "ring", ring);
  binding::check_same_device(kOpFold, "scale", scale, "ring", ring);
  if (scale_inv.has_value()) binding::check_same_device(kOpFold, "scale_inv", *scale_inv, "ring", ring);
  binding::check_same_device(kOpFold, "amax", amax, "ring", ring);
}

void amax_history_fold_cuda(const Tensor& ring, const Tensor& pos, const Tensor& scale,
                            const std::optional<Tensor>& scale_inv, const Tensor& amax, double qmax, int64_t margin) {
  validate_fold(ring, pos, scale, scale_inv, amax, qmax, margin);
  torch::stable::accelerator::DeviceGuard guard(ring.get_device_index());
  AmaxHistoryParams p = ring_params(ring, pos, scale, scale_inv, qmax, margin);
  p.amax_ptr = static_cast<const float*>(amax.data_ptr());
  const int32_t dev = ring.get_device_index();
  const cudaStream_t stream = binding::current_cuda_stream(kOpFold, dev);
  binding::check_cuda_status(amax_history_fold_launch(p, stream), kOpFold, [&] {
    std::ostringstream cfg;
    cfg << "amax_history_fold (ring [" << p.len << "], margin " << margin << ", device=cuda:" << dev << ")";
    return cfg.str();
  });
}

void amax_history_fold_cpu(const Tensor& ring, const Tensor& pos, const Tensor& scale,
                           const std::optional<Tensor>& scale_inv, const Tensor& amax, double qmax, int64_t margin) {
  validate_fold(ring, pos, scale, scale_inv, amax, qmax, margin);
}


// ---- quantize_delayed (per-tensor multiplier + fused amax + the ring fold, one launch) --------------------

struct DelayedArgs {
  QuantIn in;
  QuantOut out_type;
  float qmax;
};

DelayedArgs validate_delayed(const Tensor& x, const Tensor& scale, const Tensor& ring, const Tensor& pos,
                             const std::optional<Tensor>& scale_inv, const Tensor& workspace, ScalarType out_dtype,
                             int64_t layout, int64_t margin) {
  DelayedArgs a{};
  a.in = check_x(kOpDelayed, x);
  check_layout(kOpDelayed, layout);
  a.out_type = check_out_dtype(kOpDelayed, out_dtype, false, &a.qmax);
  check_ring(kOpDelayed, ring, pos, scale, scale_inv, margin);
  check_scalar_tensor(kOpDelayed, "workspace", workspace, ScalarType::Int);
  binding::check_cuda_device(kOpDelayed, "x", x);
  binding::check_same_device(kOpDelayed, "scale", scale, "x", x);
  binding::check_same_device(kOpDelayed, "ring", ring, "x", x);
  binding::check_same_device(kOpDelayed, "pos", pos, "x", x);
  if (scale_inv.has_value()) binding::check_same_device(kOpDelayed, "scale_inv", *scale_inv, "x", x);
  binding::check_same_device(kOpDelayed, "workspace", workspace, "x", x);
  return a;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> quantize_delayed_cuda(const Tensor& x, const Tensor& scale, const Tensor& ring,
                                                                 const Tensor& pos, const std::optional<Tensor>& scale_inv,
                                                                 const Tensor& workspace, ScalarType out_dtype,
                                                                 int64_t layout, int64_t margin) {
  const DelayedArgs a = validate_delayed(x, scale, ring, pos, scale_inv, workspace, out_dtype, layout, margin);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  const int64_t M = x.size(0), N = x.size(1);
  QuantizeParams p = base_params(x, a.in, a.out_type, a.qmax);
  Tensor out = layout != 1 ? torch::stable::new_empty(x, {M, N}, out_dtype) : torch::stable::new_empty(x, {0}, out_dtype);
  Tensor out_t = layout != 0 ? torch::stable::new_empty(x, {N, M}, out_dtype) : torch::stable::new_empty(x, {0}, out_dtype);
  Tensor amax_t = torch::stable::new_zeros(x, {1}, ScalarType::Float);
  Tensor step_inv = torch::stable::new_empty(x, {1}, ScalarType::Float);
  p.out_ptr = layout != 1 ? out.data_ptr() : nullptr;
  p.out_t_ptr = layout != 0 ? out_t.data_ptr() : nullptr;
  p.scale_ptr = static_cast<const float*>(scale.data_ptr());
  p.scale_kind = QuantScale::kTensor;
  p.amax_kind = QuantAmax::kTensor;
  p.amax_ptr = static_cast<float*>(amax_t.data_ptr());
  p.fold = ring_params(ring, pos, scale, scale_inv, a.qmax, margin);
  p.fold_counter_ptr = static_cast<uint32_t*>(workspace.data_ptr());
  p.step_scale_inv_ptr = static_cast<float*>(step_inv.data_ptr());
  const cudaStream_t stream = binding::current_cuda_stream(kOpDelayed, x.get_device_index());
  binding::check_cuda_status(launch_planned(p, stream), kOpDelayed, [&] {
    return config_str("quantize_delayed", x, layout == 0 ? "layout 0" : layout == 1 ? "layout 1" : "layout 2",
                      x.get_device_index());
  });
  return std::make_tuple(out, out_t, amax_t, step_inv);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> quantize_delayed_cpu(const Tensor& x, const Tensor& scale, const Tensor& ring,
                                                                const Tensor& pos, const std::optional<Tensor>& scale_inv,
                                                                const Tensor& workspace, ScalarType out_dtype,
                                                                int64_t layout, int64_t margin) {
  validate_delayed(x, scale, ring, pos, scale_inv, workspace, out_dtype, layout, margin);
  fail(kOpDelayed, "x must be a CUDA tensor, got ", binding::device_text(x));
}

// The plan quantize_launch takes on the current CUDA device for an x of rows x cols: [kernel (0 rows, 1 transpose
// smem, 2 / 3 transpose regs 8 / 16), vec, threads_per_row, blocks]. in_type 0 bf16, 1 fp16, 2 fp32; out_type 0 e4m3,
// 1 e5m2, 2 int8; scale_kind as QuantScale (0 tensor, 1 row, 2 column, 3 from amax, 4 dynamic row, 5 dynamic group);
// vec_x: x (and out) 16-byte aligned with 16-byte aligned rows. No tensors (the device's facts only).
std::vector<int64_t> quantize_plan_op(int64_t rows, int64_t cols, int64_t in_type, int64_t out_type,
                                      int64_t scale_kind, bool transposed, bool vec_x, bool fold) {
  const char* op = "astrai.quantize_plan";
  check(rows >= 0 && cols >= 0, op, "rows and cols must be >= 0, got ", rows, " x ", cols);
  check(in_type >= 0 && in_type <= 2, op, "in_type must be 0 (bf16), 1 (fp16) or 2 (fp32), got ", in_type);
  check(out_type >= 0 && out_type <= 2, op, "out_type must be 0 (e4m3), 1 (e5m2) or 2 (int8), got ", out_type);
  check(scale_kind >= 0 && scale_kind <= 5, op, "scale_kind must be in [0, 5], got ", scale_kind);
  alignas(16) static float cell[4] = {};  // addresses only: a plan never reads memory
  char* base = reinterpret_cast<char*>(cell) + (vec_x ? 0 : 2);
  static uint32_t counter = 0;
  static int64_t slot = 0;
  QuantizeParams p{};
  p.x_ptr = base;
  if (transposed) {
    p.out_t_ptr = base;
  } else {
    p.out_ptr = base;
  }
  p.rows = rows;
  p.cols = cols;
  p.x_row_stride = cols;
  p.in_type = QuantIn(in_type);
  p.out_type = QuantOut(out_type);
  p.scale_kind = QuantScale(scale_kind);
  p.scale_ptr = cell;
  p.amax_in_ptr = cell;
  p.scale_inv_ptr = cell;
  p.group_cols = 128;
  p.qmax = 448.0f;
  if (fold) {
    p.fold_counter_ptr = &counter;
    p.amax_kind = QuantAmax::kTensor;
    p.amax_ptr = cell;
    p.fold.ring_ptr = cell;
    p.fold.pos_ptr = &slot;
    p.fold.len = 1;
    p.fold.scale_ptr = cell;
    p.fold.qmax = p.qmax;
  }
  QuantizeLaunch plan{};
  const cudaError_t status = quantize_plan(p, &plan);
  check(status != cudaErrorInvalidValue, op, "the quantize ops do not take this combination (rows ", rows, ", cols ",
        cols, ", in_type ", in_type, ", out_type ", out_type, ", scale_kind ", scale_kind,
        transposed ? ", transposed" : "", fold ? ", fused fold" : "", ")");
  binding::check_cuda_status(status, op, [] { return "planning on the current device"; });
  return {int64_t(plan.kernel), plan.vec ? 1 : 0, plan.threads_per_row, plan.blocks};
}

}  // namespace
}  // namespace astrai

// Schemas: docs/contracts.md, "Quantize ops". FRAGMENT: other families register into `astrai` too.
STABLE_TORCH_LIBRARY_FRAGMENT(astrai, m) {
  m.def("quantize(Tensor x, Tensor scale, ScalarType out_dtype, int layout, int amax) -> (Tensor, Tensor, Tensor)");
  m.def(
      "quantize_dynamic(Tensor x, ScalarType out_dtype, int granularity, bool pow2_scale, int layout) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "quantize_block(Tensor x, ScalarType out_dtype, int block_rows, bool pow2_scale, bool scale_mn_major) "
      "-> (Tensor, Tensor)");
  m.def("scale_layout(Tensor sf, bool pack_ue8m0) -> Tensor");
  m.def(
      "amax_history_fold(Tensor(a!) ring, Tensor(b!) pos, Tensor(c!) scale, Tensor(d!)? scale_inv, Tensor amax, "
      "float qmax, int margin) -> ()");
  m.def(
      "quantize_delayed(Tensor x, Tensor(a!) scale, Tensor(b!) ring, Tensor(c!) pos, Tensor(d!)? scale_inv, "
      "Tensor(e!) workspace, ScalarType out_dtype, int layout, int margin) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "quantize_plan(int rows, int cols, int in_type, int out_type, int scale_kind, bool transposed, bool vec_x, "
      "bool fold) -> int[]");
  m.def("quantize_can_implement(ScalarType x_dtype, int last_size, int last_stride) -> str");
}

// No tensor arguments: one kernel for every backend (quantize_plan plans for the current CUDA device).
STABLE_TORCH_LIBRARY_IMPL(astrai, CompositeExplicitAutograd, m) {
  m.impl("quantize_plan", TORCH_BOX(&astrai::quantize_plan_op));
  m.impl("quantize_can_implement", TORCH_BOX(&astrai::quantize_can_implement));
}

STABLE_TORCH_LIBRARY_IMPL(astrai, CUDA, m) {
  m.impl("quantize", TORCH_BOX(&astrai::quantize_cuda));
  m.impl("quantize_dynamic", TORCH_BOX(&astrai::quantize_dynamic_cuda));
  m.impl("quantize_block", TORCH_BOX(&astrai::quantize_block_cuda));
  m.impl("scale_layout", TORCH_BOX(&astrai::scale_layout_cuda));
  m.impl("amax_history_fold", TORCH_BOX(&astrai::amax_history_fold_cuda));
  m.impl("quantize_delayed", TORCH_BOX(&astrai::quantize_delayed_cuda));
}

STABLE_TORCH_LIBRARY_IMPL(astrai, CPU, m) {
  m.impl("quantize", TORCH_BOX(&astrai::quantize_cpu));
  m.impl("quantize_dynamic", TORCH_BOX(&astrai::quantize_dynamic_cpu));
  m.impl("quantize_block", TORCH_BOX(&astrai::quantize_block_cpu));
  m.impl("scale_layout", TORCH_BOX(&astrai::scale_layout_cpu));
  m.impl("amax_history_fold", TORCH_BOX(&astrai::amax_history_fold_cpu));
  m.impl("quantize_delayed", TORCH_BOX(&astrai::quantize_delayed_cpu));
}
