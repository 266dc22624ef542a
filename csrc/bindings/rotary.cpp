// Stable-ABI registration of the rotary ops: validate, pack RotaryParams, plan the launch (rotary_plan), launch on
// the current stream; and the tensor-free rotary_plan and rotary_can_implement ops (what probe() and the policy ask).
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
#include "kernels/rotary/rotary.h"

namespace astrai {
namespace {

using binding::check;
using binding::fail;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr const char* kOp = "astrai.rotary_embedding";
constexpr const char* kOpQk = "astrai.rotary_embedding_qk";
constexpr const char* kOpInPlace = "astrai.rotary_embedding_";

// Bytes from the first to one past the last element of `t` over dims [first_dim, dim) (non-empty t,
// non-negative strides).
int64_t footprint_bytes(const Tensor& t, int64_t first_dim) {
  int64_t extent = 1;
  for (int64_t d = first_dim; d < t.dim(); ++d) extent += (t.size(d) - 1) * t.stride(d);
  return extent * int64_t(t.element_size());
}

// Whether in-place q and k may share an element. Disjoint byte ranges cannot. Token-major views of one
// buffer (q and k sliced from a fused qkv projection) interleave their ranges; they cannot share an
// element when both have the same token stride S and their per-token footprints are disjoint modulo S.
bool may_overlap(const Tensor& q, const Tensor& k) {
  if (q.numel() == 0 || k.numel() == 0) return false;
  const intptr_t q0 = reinterpret_cast<intptr_t>(q.data_ptr());
  const intptr_t k0 = reinterpret_cast<intptr_t>(k.data_ptr());
  if (q0 + footprint_bytes(q, 0) <= k0 || k0 + footprint_bytes(k, 0) <= q0) return false;
  const int64_t token_stride = q.stride(0) * int64_t(q.element_size());
  if (q.size(0) > 1 && k.size(0) > 1 && q.stride(0) == k.stride(0) && token_stride > 0) {
    const int64_t q_row = footprint_bytes(q, 1);
    const int64_t k_row = footprint_bytes(k, 1);
    const int64_t shift = (((k0 - q0) % token_stride) + token_stride) % token_stride;
    return !(q_row <= shift && shift + k_row <= token_stride);
  }
  return true;
}

// q / k's element type: the only one the kernel reads (cos / sin are float32; the policy casts other dtypes).
constexpr ScalarType kRotaryDtype = ScalarType::BFloat16;

// Why the kernel cannot take q / k of these dtypes with this head_dim; empty when it can (k_dtype: q's for the
// q-only op). make_params enforces the same rules; the policy (backend/rotary.py) asks them without tensors, on
// the CPU too, instead of restating them.
std::string rotary_can_implement(ScalarType q_dtype, ScalarType k_dtype, int64_t head_dim) {
  if (q_dtype != kRotaryDtype) return binding::dtype_rule("q", q_dtype, kRotaryDtype);
  if (k_dtype != kRotaryDtype) return binding::dtype_rule("k", k_dtype, kRotaryDtype);
  if (head_dim % 2 != 0) return "head_dim must be even, got " + std::to_string(head_dim);
  return std::string();
}

std::string config_str(const RotaryParams& p, const RotaryLaunch& plan, int32_t device_index) {
  std::ostringstream s;
  s << "rotary_bf16 (T=" << p.num_tokens << ", Hq=" << p.num_q_heads << ", Hk=" << p.num_k_heads
    << ", D=" << p.head_dim << ", " << (p.interleaved ? "interleaved" : "neox")
    << ", positions=" << (p.positions_ptr == nullptr ? "none" : p.positions_int64 ? "int64" : "int32")
    << ", cos rows=" << p.num_rows << ", plan: pairs=" << plan.pairs << (plan.vec_cs ? " vec_cs" : "") << " block=("
    << plan.block_x << ", " << plan.block_y << ", " << plan.block_z << ") blocks=" << plan.blocks
    << ", device=cuda:" << device_index << ")";
  return s.str();
}

// Validates every argument (dtype, rank, shape, strides, overlap; the device last, so that a CPU call
// reports shape errors first) and packs the inputs. Output pointers and strides are the caller's.
// k: null for the q-only op.
RotaryParams make_params(const char* op, const Tensor& q, const Tensor* k, const Tensor& cos, const Tensor& sin,
                         const std::optional<Tensor>& positions, bool interleaved, bool in_place) {
  const std::string dtypes = rotary_can_implement(q.scalar_type(), k ? k->scalar_type() : q.scalar_type(), 0);
  check(dtypes.empty(), op, dtypes);  // head_dim is checked below, once q's rank is
  binding::check_dtype(op, "cos", cos, ScalarType::Float);
  binding::check_dtype(op, "sin", sin, ScalarType::Float);
  if (positions) {
    const ScalarType pt = positions->scalar_type();
    check(pt == ScalarType::Int || pt == ScalarType::Long, op, "positions must be int32 or int64, got ",
          binding::dtype_name(pt));
  }

  binding::check_rank(op, "q", q, 3, "[T, Hq, D]");                            // q: (T, Hq, D)
  if (k) binding::check_rank(op, "k", *k, 3, "[T, Hk, D]");                    // k: (T, Hk, D)
  binding::check_rank(op, "cos", cos, 2, "[rows, D/2]");                       // cos: (T or max_pos, D/2)
  binding::check_rank(op, "sin", sin, 2, "[rows, D/2]");                       // sin: like cos
  if (positions) binding::check_rank(op, "positions", *positions, 1, "[T]");  // positions: (T,)

  const int64_t num_tokens = q.size(0);
  const int64_t head_dim = q.size(2);
  check(head_dim % 2 == 0, op, "head_dim (q.size(2)) must be even, got ", head_dim);
  if (k) {
    check(k->size(2) == head_dim, op, "k.size(2) must equal head_dim = q.size(2) = ", head_dim, ", got ",
          k->size(2));
    check(k->size(0) == num_tokens, op, "k.size(0) must equal the token count q.size(0) = ", num_tokens,
          ", got ", k->size(0));
  }
  check(cos.size(1) == head_dim / 2, op, "cos.size(1) must be head_dim / 2 = ", head_dim / 2, ", got ",
        cos.size(1), " (cos shape ", binding::shape_text(cos), ")");
  check(sin.size(0) == cos.size(0) && sin.size(1) == cos.size(1), op, "sin must have the shape of cos ",
        binding::shape_text(cos), ", got ", binding::shape_text(sin));
  if (positions) {
    check(positions->size(0) == num_tokens, op, "positions.size(0) must equal the token count q.size(0) = ",
          num_tokens, ", got ", positions->size(0));
  } else {
    check(cos.size(0) == num_tokens, op, "cos.size(0) must equal the token count q.size(0) = ", num_tokens,
          " when positions is not given, got ", cos.size(0));
  }
  const int64_t num_k_heads = k ? k->size(1) : 0;
  check(q.size(1) + num_k_heads <= INT32_MAX && head_dim <= INT32_MAX, op,
        "head counts and head_dim must fit in int32, got Hq=", q.size(1), ", Hk=", num_k_heads, ", D=", head_dim);

  binding::check_strides(op, "q", q);
  if (k) binding::check_strides(op, "k", *k);
  binding::check_strides(op, "cos", cos);
  binding::check_strides(op, "sin", sin);
  if (positions) {
    check(positions->stride(0) >= 0, op, "positions must have a non-negative stride, got ",
          binding::strides_text(*positions));
  }
  binding::check_element_aligned(op, "q", q);
  if (k) binding::check_element_aligned(op, "k", *k);
  binding::check_element_aligned(op, "cos", cos);
  binding::check_element_aligned(op, "sin", sin);
  if (positions) binding::check_element_aligned(op, "positions", *positions);

  if (in_place) {
    check(binding::strides_non_overlapping(q), op,
          "q is written in place and must not have overlapping elements, got strides ", binding::strides_text(q),
          " for shape ", binding::shape_text(q));
    if (k) {
      check(binding::strides_non_overlapping(*k), op,
            "k is written in place and must not have overlapping elements, got strides ",
            binding::strides_text(*k), " for shape ", binding::shape_text(*k));
      check(!may_overlap(q, *k), op, "q and k are written in place and must not overlap in memory");
    }
  }

  binding::check_cuda_device(op, "q", q);
  if (k) binding::check_same_device(op, "k", *k, "q", q);
  binding::check_same_device(op, "cos", cos, "q", q);
  binding::check_same_device(op, "sin", sin, "q", q);
  if (positions) binding::check_same_device(op, "positions", *positions, "q", q);

  // The stride of a size-1 axis is never used; zeroing it keeps an odd value from blocking the 16-byte path.
  const auto stride = [](const Tensor& t, int64_t d) { return t.size(d) == 1 ? int64_t(0) : t.stride(d); };
  RotaryParams p{};
  p.q_ptr = q.data_ptr();
  p.q_token_stride = stride(q, 0);
  p.q_head_stride = stride(q, 1);
  if (k) {
    p.k_ptr = k->data_ptr();
    p.k_token_stride = stride(*k, 0);
    p.k_head_stride = stride(*k, 1);
  }
  if (in_place) {
    p.q_out_ptr = q.data_ptr();
    p.q_out_token_stride = p.q_token_stride;
    p.q_out_head_stride = p.q_head_stride;
    p.k_out_ptr = k ? k->data_ptr() : nullptr;
    p.k_out_token_stride = p.k_token_stride;
    p.k_out_head_stride = p.k_head_stride;
  }
  p.cos_ptr = static_cast<const float*>(cos.data_ptr());
  p.sin_ptr = static_cast<const float*>(sin.data_ptr());
  p.cos_row_stride = stride(cos, 0);
  p.sin_row_stride = stride(sin, 0);
  if (positions) {
    p.positions_ptr = positions->data_ptr();
    p.positions_token_stride = positions->stride(0);
    p.positions_int64 = positions->scalar_type() == ScalarType::Long;
  }
  p.num_tokens = num_tokens;
  p.num_rows = cos.size(0);
  p.num_q_heads = static_cast<int32_t>(q.size(1));
  p.num_k_heads = static_cast<int32_t>(num_k_heads);
  p.head_dim = static_cast<int32_t>(head_dim);
  p.interleaved = interleaved;
  return p;
}

// A contiguous [T, H, D] bf16 output on the input's device; its pointer and strides go into `ptr`/strides.
Tensor new_output(const Tensor& like, void** ptr, int64_t* token_stride, int64_t* head_stride) {
  Tensor out = torch::stable::new_empty(like, {like.size(0), like.size(1), like.size(2)});
  *ptr = out.data_ptr();
  *token_stride = out.stride(0);
  *head_stride = out.stride(1);
  return out;
}

void launch(const char* op, const RotaryParams& p, int32_t device_index) {
  if (p.num_tokens == 0 || p.num_q_heads + p.num_k_heads == 0 || p.head_dim == 0) return;
  RotaryTarget target{};
  binding::check_cuda_status(rotary_device_target(device_index, &target), op,
                             [&] { return "querying the device facts of cuda:" + std::to_string(device_index); });
  const RotaryLaunch plan = rotary_plan(rotary_shape_of(p), target);  // the explicit plan the launcher takes
  const cudaStream_t stream = binding::current_cuda_stream(op, device_index);
  binding::check_cuda_status(rotary_bf16_launch(p, plan, stream), op,
                             [&] { return config_str(p, plan, device_index); });
}

// The plan the rotary ops launch for a call of this shape on a device of (sm_count, threads_per_sm):
// [pairs, vec_cs, block_x, block_y, block_z, blocks]. vec_x / vec_cs: what the call's pointers and strides allow
// (16-byte aligned q/k with strides multiples of 8 elements; cos/sin aligned with row strides multiples of 4).
// No tensors: callable on the CPU.
std::vector<int64_t> rotary_plan_op(int64_t num_tokens, int64_t num_q_heads, int64_t num_k_heads, int64_t head_dim,
                                    bool interleaved, bool vec_x, bool vec_cs, int64_t sm_count,
                                    int64_t threads_per_sm) {
  const char* op = "astrai.rotary_plan";
  check(num_tokens >= 0 && num_q_heads >= 0 && num_k_heads >= 0 && num_q_heads + num_k_heads <= INT32_MAX, op,
        "num_tokens and the head counts must be >= 0 (heads fitting in int32), got ", num_tokens, ", ", num_q_heads,
        ", ", num_k_heads);
  check(head_dim >= 2 && head_dim % 2 == 0 && head_dim <= INT32_MAX, op, "head_dim must be even and >= 2, got ",
        head_dim);
  const RotaryShape shape{num_tokens, int32_t(num_q_heads), int32_t(num_k_heads), int32_t(head_dim), interleaved,
                          vec_x, vec_cs, 0};
  const RotaryLaunch l = rotary_plan(shape, RotaryTarget{int(sm_count), int(threads_per_sm)});
  return {l.pairs, l.vec_cs ? 1 : 0, l.block_x, l.block_y, l.block_z, l.blocks};
}

Tensor rotary_embedding_cuda(const Tensor& q, const Tensor& cos, const Tensor& sin,
                             const std::optional<Tensor>& positions, bool interleaved) {
  RotaryParams p = make_params(kOp, q, nullptr, cos, sin, positions, interleaved, false);
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  Tensor q_out = new_output(q, &p.q_out_ptr, &p.q_out_token_stride, &p.q_out_head_stride);
  launch(kOp, p, q.get_device_index());
  return q_out;
}

std::tuple<Tensor, Tensor> rotary_embedding_qk_cuda(const Tensor& q, const Tensor& k, const Tensor& cos,
                                                    const Tensor& sin, const std::optional<Tensor>& positions,
                                                    bool interleaved) {
  RotaryParams p = make_params(kOpQk, q, &k, cos, sin, positions, interleaved, false);
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  Tensor q_out = new_output(q, &p.q_out_ptr, &p.q_out_token_stride, &p.q_out_head_stride);
  Tensor k_out = new_output(k, &p.k_out_ptr, &p.k_out_token_stride, &p.k_out_head_stride);
  launch(kOpQk, p, q.get_device_index());
  return std::make_tuple(q_out, k_out);
}

void rotary_embedding_inplace_cuda(const Tensor& q, const std::optional<Tensor>& k, const Tensor& cos,
                                   const Tensor& sin, const std::optional<Tensor>& positions, bool interleaved) {
  const RotaryParams p =
      make_params(kOpInPlace, q, k ? &*k : nullptr, cos, sin, positions, interleaved, true);
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  launch(kOpInPlace, p, q.get_device_index());
}

// CPU: the same validation, so that every message is testable without a GPU; valid inputs then fail
// the device check inside make_params. The final fail() only guards against a future change there.
Tensor rotary_embedding_cpu(const Tensor& q, const Tensor& cos, const Tensor& sin,
                            const std::optional<Tensor>& positions, bool interleaved) {
  make_params(kOp, q, nullptr, cos, sin, positions, interleaved, false);
  fail(kOp, "q must be a CUDA tensor, got ", binding::device_text(q));
}

std::tuple<Tensor, Tensor> rotary_embedding_qk_cpu(const Tensor& q, const Tensor& k, const Tensor& cos,
                                                   const Tensor& sin, const std::optional<Tensor>& positions,
                                                   bool interleaved) {
  make_params(kOpQk, q, &k, cos, sin, positions, interleaved, false);
  fail(kOpQk, "q must be a CUDA tensor, got ", binding::device_text(q));
}

void rotary_embedding_inplace_cpu(const Tensor& q, const std::optional<Tensor>& k, const Tensor& cos,
                                  const Tensor& sin, const std::optional<Tensor>& positions, bool interleaved) {
  make_params(kOpInPlace, q, k ? &*k : nullptr, cos, sin, positions, interleaved, true);
  fail(kOpInPlace, "q must be a CUDA tensor, got ", binding::device_text(q));
}

}  // namespace
}  // namespace astrai

// Schemas: docs/contracts.md, "Rotary ops". FRAGMENT: other families register into `astrai` too.
STABLE_TORCH_LIBRARY_FRAGMENT(astrai, m) {
  m.def("rotary_embedding(Tensor q, Tensor cos, Tensor sin, Tensor? positions, bool interleaved) -> Tensor");
  m.def(
      "rotary_embedding_qk(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? positions, bool interleaved) "
      "-> (Tensor, Tensor)");
  m.def(
      "rotary_embedding_(Tensor(a!) q, Tensor(b!)? k, Tensor cos, Tensor sin, Tensor? positions, "
      "bool interleaved) -> ()");
  m.def(
      "rotary_plan(int num_tokens, int num_q_heads, int num_k_heads, int head_dim, bool interleaved, bool vec_x, "
      "bool vec_cs, int sm_count, int threads_per_sm) -> int[]");
  m.def("rotary_can_implement(ScalarType q_dtype, ScalarType k_dtype, int head_dim) -> str");
}

// No tensor arguments: one kernel for every backend.
STABLE_TORCH_LIBRARY_IMPL(astrai, CompositeExplicitAutograd, m) {
  m.impl("rotary_plan", TORCH_BOX(&astrai::rotary_plan_op));
  m.impl("rotary_can_implement", TORCH_BOX(&astrai::rotary_can_implement));
}

STABLE_TORCH_LIBRARY_IMPL(astrai, CUDA, m) {
  m.impl("rotary_embedding", TORCH_BOX(&astrai::rotary_embedding_cuda));
  m.impl("rotary_embedding_qk", TORCH_BOX(&astrai::rotary_embedding_qk_cuda));
  m.impl("rotary_embedding_", TORCH_BOX(&astrai::rotary_embedding_inplace_cuda));
}

STABLE_TORCH_LIBRARY_IMPL(astrai, CPU, m) {
  m.impl("rotary_embedding", TORCH_BOX(&astrai::rotary_embedding_cpu));
  m.impl("rotary_embedding_qk", TORCH_BOX(&astrai::rotary_embedding_qk_cpu));
  m.impl("rotary_embedding_", TORCH_BOX(&astrai::rotary_embedding_inplace_cpu));
}
