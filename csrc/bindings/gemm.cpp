// Stable-ABI registration of the GEMM ops: validate every argument, pack GemmParams, launch the plan given.
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include "bindings/stable_helpers.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/l2_prefetch.h"

namespace astrai {
namespace {

using binding::check;
using binding::fail;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr const char* kOp = "astrai.quant_gemm";
constexpr const char* kOpOut = "astrai.quant_gemm_out";
const char* const kLayoutNames[] = {"nt", "nn", "tn", "tt"};

struct PairInfo {
  ScalarType a, b;
  GemmPair pair;
  const char* group;
};
constexpr PairInfo kPairs[] = {
    {ScalarType::BFloat16, ScalarType::BFloat16, GemmPair::kBf16Bf16, "w16a16"},
    {ScalarType::Half, ScalarType::Half, GemmPair::kF16F16, "w16a16"},
    {ScalarType::BFloat16, ScalarType::Char, GemmPair::kBf16S8, "w8a16"},
    {ScalarType::Half, ScalarType::Char, GemmPair::kF16S8, "w8a16"},
    {ScalarType::Char, ScalarType::Char, GemmPair::kS8S8, "w8a8"},
    {ScalarType::Float8_e4m3fn, ScalarType::Float8_e4m3fn, GemmPair::kE4m3E4m3, "fp8"},
    {ScalarType::Float8_e5m2, ScalarType::Float8_e4m3fn, GemmPair::kE5m2E4m3, "fp8"},
    {ScalarType::Float8_e4m3fn, ScalarType::Float8_e5m2, GemmPair::kE4m3E5m2, "fp8"},
};

struct Problem {
  GemmParams p{};
  GemmPair pair{};
  std::vector<int64_t> out_shape;
  ScalarType out_dtype{};
};

const PairInfo* find_pair(ScalarType a, ScalarType b) {
  for (const PairInfo& info : kPairs) {
    if (info.a == a && info.b == b) return &info;
  }
  return nullptr;
}

std::string pairs_str() {
  std::ostringstream s;
  for (size_t i = 0; i < sizeof(kPairs) / sizeof(kPairs[0]); ++i) {
    s << (i ? ", " : "") << "(" << binding::dtype_name(kPairs[i].a) << ", " << binding::dtype_name(kPairs[i].b)
      << ")";
  }
  return s.str();
}

// An operand as `layout` stores it: rank 2 (`dims`, e.g. "[K, M]") or 3 ([B, ...]); stride 1 on its last dim
// (K for a K-major operand, M or N for a MN-major one); 16-byte aligned base and other strides.
void check_operand(const char* op, const char* name, const Tensor& t, const char* dims, const char* layout) {
  check(t.dim() == 2 || t.dim() == 3, op, name, " must be 2-D ", dims, " or 3-D [B, ", dims + 1, " (layout '", layout,
        "'), got ", t.dim(), "-D with shape ", binding::shape_text(t));
  const int64_t last = t.dim() - 1;
  if (t.numel() == 0) return;  // nothing is read (K = 0 or an empty M / N): any strides do
  check(t.size(last) <= 1 || t.stride(last) == 1, op, name, " must have stride 1 in its last dimension (layout '",
        layout, "' stores ", name, " as ", dims, "), got strides ", binding::strides_text(t), " for shape ",
        binding::shape_text(t), ": pass ", name, ".contiguous(), or the layout that matches how ", name,
        " is stored (its transpose flips the operand's letter)");
  binding::check_strides(op, name, t);
  const int64_t es = t.element_size();
  for (int64_t d = 0; d < last; ++d) {
    check(t.size(d) <= 1 || (t.stride(d) * es) % 16 == 0, op, name,
          " needs strides that are multiples of 16 bytes outside its last dimension, got strides ",
          binding::strides_text(t), " (", es, "-byte elements) for shape ", binding::shape_text(t),
          "; pad the last dimension to a multiple of ", 16 / es, " elements (a view of the padded tensor works)");
  }
  check(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, op, name,
        " must start at a 16-byte aligned address (a view at an offset that is not a multiple of 16 bytes): "
        "pass .clone()");
}

// A scale: float32, contiguous, 1 value or `count` values in one of the accepted shapes.
bool check_scale(const char* op, const char* name, const Tensor& s, int64_t count, const char* what, bool col) {
  binding::check_dtype(op, name, s, ScalarType::Float);
  const int64_t n = s.numel();
  bool shape_ok = s.dim() == 0 || (s.dim() == 1 && (n == 1 || n == count));
  if (s.dim() == 2) {
    shape_ok = (s.size(0) == count && s.size(1) == 1) || (col && s.size(0) == 1 && s.size(1) == count);
  }
  check(shape_ok && (n == 1 || n == count), op, name, " must hold 1 value or ", count, " (", what,
        "): shape [], [1], [", count, "]", col ? ", [N, 1] or [1, N]" : " or [M, 1]", ", got shape ",
        binding::shape_text(s));
  if (n > 1) {
    const int64_t inner = s.dim() == 2 ? (s.size(1) == 1 ? s.stride(0) : s.stride(1)) : s.stride(0);
    check(inner == 1, op, name, " must be contiguous, got strides ", binding::strides_text(s));
  }
  binding::check_element_aligned(op, name, s);
  return n > 1;  // one value per row / column
}

Problem make_problem(const char* op, const Tensor& a, const Tensor& b, const std::optional<Tensor>& a_scale,
                     const std::optional<Tensor>& b_scale, const std::optional<Tensor>& bias, ScalarType out_dtype,
                     int64_t layout, int64_t recipe, int64_t split_k) {
  Problem pr;
  const PairInfo* info = find_pair(a.scalar_type(), b.scalar_type());
  if (info == nullptr) {  // pairs_str() builds a string: only for the message
    fail(op, "(a, b) dtypes must be one of ", pairs_str(), ", got (", binding::dtype_name(a.scalar_type()), ", ",
         binding::dtype_name(b.scalar_type()), ")");
  }
  pr.pair = info->pair;
  check(layout >= 0 && layout <= 3, op, "layout must be 0 (nt), 1 (nn), 2 (tn) or 3 (tt), got ", layout);
  const char* lname = kLayoutNames[layout];
  const bool a_t = lname[0] == 't', b_n = lname[1] == 'n';  // MN-major a ([K, M]), MN-major b ([K, N])
  const char* a_dims = a_t ? "[K, M]" : "[M, K]";
  const char* b_dims = b_n ? "[K, N]" : "[N, K]";
  check_operand(op, "a", a, a_dims, lname);
  check_operand(op, "b", b, b_dims, lname);
  const int64_t K = a.size(a.dim() - (a_t ? 2 : 1));
  const int64_t M = a.size(a.dim() - (a_t ? 1 : 2));
  const int64_t b_k_dim = b.dim() - (b_n ? 2 : 1);
  check(b.size(b_k_dim) == K, op, "b.size(", b_n ? -2 : -1, ") must equal K = a.size(", a_t ? -2 : -1, ") = ", K,
        " (layout ", lname, ": a is ", a_dims, ", b is ", b_dims, "), got ", b.size(b_k_dim), " (b shape ",
        binding::shape_text(b), ")");
  const int64_t N = b.size(b.dim() - (b_n ? 1 : 2));
  const int64_t ba = a.dim() == 3 ? a.size(0) : 1, bb = b.dim() == 3 ? b.size(0) : 1;
  check(ba == bb || ba == 1 || bb == 1, op, "batch sizes must match or one must be 1 (broadcast), got a ",
        binding::shape_text(a), " and b ", binding::shape_text(b));
  const int64_t B = ba > bb ? ba : bb;
  check(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && B <= INT32_MAX, op,
        "M, N, K and the batch must fit in int32, got M=", M, ", N=", N, ", K=", K, ", B=", B);

  const bool is_s8 = info->pair == GemmPair::kS8S8;
  const bool is_w16 = info->pair == GemmPair::kBf16Bf16 || info->pair == GemmPair::kF16F16;
  const bool is_w8a16 = info->pair == GemmPair::kBf16S8 || info->pair == GemmPair::kF16S8;
  const bool raw = out_dtype == ScalarType::Int;
  check(out_dtype == ScalarType::BFloat16 || out_dtype == ScalarType::Half || out_dtype == ScalarType::Float ||
            (raw && is_s8),
        op, "out_dtype must be bfloat16, float16 or float32 (int32 only for int8 x int8), got ",
        binding::dtype_name(out_dtype), " for (", binding::dtype_name(info->a), ", ", binding::dtype_name(info->b),
        ")");
  if (raw) {
    check(!a_scale && !b_scale && !bias, op,
          "out_dtype int32 returns the raw int32 accumulators: a_scale, b_scale and bias must be None");
  } else if (is_s8) {
    check(a_scale.has_value(), op, "a_scale is required for int8 a (1 value or M values), got None");
    check(b_scale.has_value(), op, "b_scale is required for int8 b (1 value or N values), got None");
  } else if (is_w8a16) {
    check(!a_scale, op, "a_scale must be None for ", binding::dtype_name(info->a), " a (w8a16 scales the weight only)");
    check(b_scale.has_value(), op, "b_scale is required for int8 b (per channel: N values, or 1), got None");
  } else if (is_w16) {
    check(!a_scale && !b_scale, op, "a_scale and b_scale must be None for ", binding::dtype_name(info->a),
          " operands");
  }
  const bool a_rows = a_scale ? check_scale(op, "a_scale", *a_scale, M, "per tensor or per row of a", false) : false;
  const bool b_cols = b_scale ? check_scale(op, "b_scale", *b_scale, N, "per tensor or per column of the output", true)
                              : false;
  GemmBias bias_kind = GemmBias::kNone;
  if (bias) {
    const ScalarType bt = bias->scalar_type();
    check(bt == ScalarType::BFloat16 || bt == ScalarType::Half || bt == ScalarType::Float, op,
          "bias must be bfloat16, float16 or float32, got ", binding::dtype_name(bt));
    check(bias->dim() == 1 && bias->size(0) == N, op, "bias must be 1-D [N] with N = ", N, ", got shape ",
          binding::shape_text(*bias));
    check(N <= 1 || bias->stride(0) == 1, op, "bias must be contiguous, got strides ", binding::strides_text(*bias));
    binding::check_element_aligned(op, "bias", *bias);
    bias_kind = bt == ScalarType::BFloat16 ? GemmBias::kBf16 : bt == ScalarType::Half ? GemmBias::kF16 : GemmBias::kF32;
  }

  const std::string unfit = gemm_plan_unfit(info->pair, GemmLayout(layout), recipe, split_k, M, N, B);
  check(unfit.empty(), op, unfit);

  GemmParams& p = pr.p;
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.a_scale = a_scale ? static_cast<const float*>(a_scale->data_ptr()) : nullptr;
  p.b_scale = b_scale ? static_cast<const float*>(b_scale->data_ptr()) : nullptr;
  p.bias = bias ? bias->data_ptr() : nullptr;
  // The stride between stored rows (m or n rows when K-major, k rows when MN-major); unread with one row.
  p.a_row_stride = a.size(a.dim() - 2) > 1 ? a.stride(a.dim() - 2) : 0;
  p.b_row_stride = b.size(b.dim() - 2) > 1 ? b.stride(b.dim() - 2) : 0;
  p.a_batch_stride = a.dim() == 3 && ba > 1 ? a.stride(0) : 0;
  p.b_batch_stride = b.dim() == 3 && bb > 1 ? b.stride(0) : 0;
  p.m = int32_t(M);
  p.n = int32_t(N);
  p.k = int32_t(K);
  p.batch = int32_t(B);
  p.split_k = int32_t(split_k);
  p.a_scale_per_row = a_rows ? 1 : 0;
  p.b_scale_per_col = b_cols ? 1 : 0;
  p.out_dtype = out_dtype == ScalarType::BFloat16 ? GemmOut::kBf16
                : out_dtype == ScalarType::Half   ? GemmOut::kF16
                : out_dtype == ScalarType::Float  ? GemmOut::kF32
                                                  : GemmOut::kS32;
  p.bias_dtype = bias_kind;
  p.layout = GemmLayout(layout);
  pr.out_dtype = out_dtype;
  pr.out_shape = a.dim() == 3 || b.dim() == 3 ? std::vector<int64_t>{B, M, N} : std::vector<int64_t>{M, N};
  return pr;
}

// Last, so that a CPU call reports every other problem first.
void check_devices(const char* op, const Tensor& a, const Tensor& b, const std::optional<Tensor>& a_scale,
                   const std::optional<Tensor>& b_scale, const std::optional<Tensor>& bias, const Tensor* out) {
  binding::check_cuda_device(op, "a", a);
  binding::check_same_device(op, "b", b, "a", a);
  if (a_scale) binding::check_same_device(op, "a_scale", *a_scale, "a", a);
  if (b_scale) binding::check_same_device(op, "b_scale", *b_scale, "a", a);
  if (bias) binding::check_same_device(op, "bias", *bias, "a", a);
  if (out) binding::check_same_device(op, "out", *out, "a", a);
}

// quant_gemm_out's out: the output's shape, unit inner stride, no overlapping elements.
void check_out(const Problem& pr, const Tensor& out) {
  const auto want = binding::list_text(pr.out_shape);
  bool same = out.dim() == int64_t(pr.out_shape.size());
  for (size_t d = 0; same && d < pr.out_shape.size(); ++d) same = out.size(int64_t(d)) == pr.out_shape[d];
  check(same, kOpOut, "out must have shape ", want, ", got ", binding::shape_text(out));
  binding::check_strides(kOpOut, "out", out);
  check(binding::strides_non_overlapping(out), kOpOut, "out must not have overlapping elements, got strides ",
        binding::strides_text(out));
  binding::check_element_aligned(kOpOut, "out", out);
  // The epilogue stores two adjacent elements at once where their offset is even: a base on an odd element would
  // make those stores misaligned.
  const int64_t pair_bytes = 2 * int64_t(out.element_size());
  check(reinterpret_cast<uintptr_t>(out.data_ptr()) % pair_bytes == 0, kOpOut, "out must start at an address aligned to ",
        pair_bytes, " bytes (two elements), got one at ", reinterpret_cast<uintptr_t>(out.data_ptr()) % pair_bytes,
        " bytes past it (a view starting at an odd element, e.g. out[:, 1:]): pass a tensor of its own or an even offset");
}

void set_out(Problem& pr, const Tensor& out) {
  GemmParams& p = pr.p;
  p.out = out.data_ptr();
  p.out_row_stride = p.m > 1 ? out.stride(out.dim() - 2) : 0;
  p.out_batch_stride = out.dim() == 3 && p.batch > 1 ? out.stride(0) : 0;
}

std::string config_str(const Problem& pr, int64_t recipe, int32_t device_index) {
  std::ostringstream s;
  s << "quant_gemm (pair " << int(pr.pair) << ", layout " << kLayoutNames[int(pr.p.layout)] << ", B=" << pr.p.batch
    << ", M=" << pr.p.m << ", N=" << pr.p.n << ", K=" << pr.p.k << ", recipe " << recipe << ", split_k "
    << pr.p.split_k << ", device=cuda:" << device_index << ")";
  return s.str();
}

void run(const char* op, Problem& pr, const Tensor& a, int64_t recipe) {
  if (pr.p.m == 0 || pr.p.n == 0 || pr.p.batch == 0) return;
  const char* why = gemm_unsupported(pr.pair, pr.p.layout, int(recipe));
  check(why == nullptr, op, why ? why : "");
  Tensor workspace;
  const int64_t ws = gemm_workspace_bytes(pr.p, pr.pair, int(recipe));
  if (ws > 0) {
    workspace = torch::stable::new_empty(a, {ws / 4}, ScalarType::Float);
    pr.p.workspace = workspace.data_ptr();
  }
  const int32_t device = a.get_device_index();
  const cudaStream_t stream = binding::current_cuda_stream(op, device);
  binding::check_cuda_status(gemm_launch(pr.p, pr.pair, int(recipe), stream), op,
                             [&] { return config_str(pr, recipe, device); });
}

Tensor quant_gemm_cuda(const Tensor& a, const Tensor& b, const std::optional<Tensor>& a_scale,
                       const std::optional<Tensor>& b_scale, const std::optional<Tensor>& bias, ScalarType out_dtype,
                       int64_t layout, int64_t recipe, int64_t split_k) {
  Problem pr = make_problem(kOp, a, b, a_scale, b_scale, bias, out_dtype, layout, recipe, split_k);
  check_devices(kOp, a, b, a_scale, b_scale, bias, nullptr);
  torch::stable::accelerator::DeviceGuard guard(a.get_device_index());
  Tensor out = torch::stable::new_empty(a, pr.out_shape, out_dtype);
  set_out(pr, out);
  run(kOp, pr, a, recipe);
  return out;
}

void quant_gemm_out_cuda(const Tensor& a, const Tensor& b, const std::optional<Tensor>& a_scale,
                         const std::optional<Tensor>& b_scale, const std::optional<Tensor>& bias, int64_t layout,
                         int64_t recipe, int64_t split_k, Tensor out) {
  Problem pr = make_problem(kOpOut, a, b, a_scale, b_scale, bias, out.scalar_type(), layout, recipe, split_k);
  check_out(pr, out);
  check_devices(kOpOut, a, b, a_scale, b_scale, bias, &out);
  torch::stable::accelerator::DeviceGuard guard(a.get_device_index());
  set_out(pr, out);
  run(kOpOut, pr, a, recipe);
}

// CPU: the same validation, so that every message is testable without a GPU; valid inputs then fail the device
// check inside make_problem. The final fail() only guards against a future change there.
Tensor quant_gemm_cpu(const Tensor& a, const Tensor& b, const std::optional<Tensor>& a_scale,
                      const std::optional<Tensor>& b_scale, const std::optional<Tensor>& bias, ScalarType out_dtype,
                      int64_t layout, int64_t recipe, int64_t split_k) {
  make_problem(kOp, a, b, a_scale, b_scale, bias, out_dtype, layout, recipe, split_k);
  check_devices(kOp, a, b, a_scale, b_scale, bias, nullptr);
  fail(kOp, "a must be a CUDA tensor, got ", binding::device_text(a));
}

void quant_gemm_out_cpu(const Tensor& a, const Tensor& b, const std::optional<Tensor>& a_scale,
                        const std::optional<Tensor>& b_scale, const std::optional<Tensor>& bias, int64_t layout,
                        int64_t recipe, int64_t split_k, Tensor out) {
  check_out(make_problem(kOpOut, a, b, a_scale, b_scale, bias, out.scalar_type(), layout, recipe, split_k), out);
  check_devices(kOpOut, a, b, a_scale, b_scale, bias, &out);
  fail(kOpOut, "a must be a CUDA tensor, got ", binding::device_text(a));
}

// Why this image cannot run the plan (recipe, split_k) for a problem of these dtypes, layout and sizes on a device
// described by (cc, sm90_code, fp8_code_arch); empty when it can. No tensors: the planner asks about shapes and
// devices it does not hold (callable on the CPU too).
std::string quant_gemm_can_implement(ScalarType a_dtype, ScalarType b_dtype, int64_t layout, int64_t recipe,
                                     int64_t split_k, int64_t m, int64_t n, int64_t batch, int64_t cc, bool sm90_code,
                                     int64_t fp8_code_arch) {
  const PairInfo* info = find_pair(a_dtype, b_dtype);
  if (info == nullptr) return "(a, b) dtypes must be one of " + pairs_str();
  if (layout < 0 || layout > 3) return "layout must be 0 (nt), 1 (nn), 2 (tn) or 3 (tt), got " + std::to_string(layout);
  std::string why = gemm_plan_unfit(info->pair, GemmLayout(layout), recipe, split_k, m, n, batch);
  if (!why.empty()) return why;
  const char* unsupported = gemm_unsupported_on(info->pair, GemmLayout(layout), int(recipe),
                                                GemmTarget{int(cc), sm90_code, int(fp8_code_arch)});
  return unsupported ? std::string(unsupported) : std::string();
}

// Row-major contiguous (sizes of 1 may have any stride): the tensor's bytes are one span from its data pointer.
bool row_major_contiguous(const Tensor& t) {
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

constexpr const char* kOpPrefetch = "astrai.l2_prefetch";

void check_prefetch(const Tensor& t, int64_t run, int64_t period) {
  check(row_major_contiguous(t), kOpPrefetch, "t must be contiguous (its bytes one span), got strides ",
        binding::strides_text(t), " for shape ", binding::shape_text(t), "; pass t.contiguous() or a view of the span");
  check(period > 0 && period % 16 == 0, kOpPrefetch, "period must be a positive multiple of 16 bytes, got ", period);
  check(run >= 0 && run <= period && run % 16 == 0, kOpPrefetch,
        "run must be a multiple of 16 bytes in [0, period = ", period, "], got ", run);
}

// Asks the L2 for `run` bytes at the start of every `period` bytes of t (on t's device, current stream); changes
// nothing, returns once the requests are issued.
void l2_prefetch_cuda(const Tensor& t, int64_t run, int64_t period) {
  check_prefetch(t, run, period);
  if (t.numel() == 0 || run == 0) return;
  const int32_t device = t.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = binding::current_cuda_stream(kOpPrefetch, device);
  binding::check_cuda_status(
      gemm_l2_prefetch_launch(t.data_ptr(), t.numel() * t.element_size(), run, period, stream), kOpPrefetch, [&] {
        return "l2_prefetch (" + std::to_string(t.numel() * t.element_size()) + " bytes, run " + std::to_string(run) +
               ", period " + std::to_string(period) + ", device=cuda:" + std::to_string(device) + ")";
      });
}

void l2_prefetch_cpu(const Tensor& t, int64_t run, int64_t period) {
  check_prefetch(t, run, period);
  fail(kOpPrefetch, "t must be a CUDA tensor, got ", binding::device_text(t));
}

// The policy's programmatic-dependent-launch switch for every GEMM launch of this process; returns the previous one.
bool quant_gemm_set_pdl(bool allowed) {
  const bool previous = gemm_pdl_allowed();
  gemm_set_pdl_allowed(allowed);
  return previous;
}

}  // namespace
}  // namespace astrai

// Schemas: docs/contracts.md, "GEMM ops". FRAGMENT: other families register into `astrai` too.
STABLE_TORCH_LIBRARY_FRAGMENT(astrai, m) {
  m.def(
      "quant_gemm(Tensor a, Tensor b, Tensor? a_scale, Tensor? b_scale, Tensor? bias, ScalarType out_dtype, "
      "int layout, int recipe, int split_k) -> Tensor");
  m.def(
      "quant_gemm_out(Tensor a, Tensor b, Tensor? a_scale, Tensor? b_scale, Tensor? bias, int layout, int recipe, "
      "int split_k, Tensor(a!) out) -> ()");
  m.def(
      "quant_gemm_can_implement(ScalarType a_dtype, ScalarType b_dtype, int layout, int recipe, int split_k, int m, "
      "int n, int batch, int cc, bool sm90_code, int fp8_code_arch) -> str");
  m.def("quant_gemm_set_pdl(bool allowed) -> bool");
  m.def("l2_prefetch(Tensor t, int run, int period) -> ()");
}

// No tensor arguments: one kernel for every backend.
STABLE_TORCH_LIBRARY_IMPL(astrai, CompositeExplicitAutograd, m) {
  m.impl("quant_gemm_can_implement", TORCH_BOX(&astrai::quant_gemm_can_implement));
  m.impl("quant_gemm_set_pdl", TORCH_BOX(&astrai::quant_gemm_set_pdl));
}

STABLE_TORCH_LIBRARY_IMPL(astrai, CUDA, m) {
  m.impl("quant_gemm", TORCH_BOX(&astrai::quant_gemm_cuda));
  m.impl("quant_gemm_out", TORCH_BOX(&astrai::quant_gemm_out_cuda));
  m.impl("l2_prefetch", TORCH_BOX(&astrai::l2_prefetch_cuda));
}

STABLE_TORCH_LIBRARY_IMPL(astrai, CPU, m) {
  m.impl("quant_gemm", TORCH_BOX(&astrai::quant_gemm_cpu));
  m.impl("quant_gemm_out", TORCH_BOX(&astrai::quant_gemm_out_cpu));
  m.impl("l2_prefetch", TORCH_BOX(&astrai::l2_prefetch_cpu));
}
