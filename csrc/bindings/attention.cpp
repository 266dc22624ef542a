// Stable-ABI registration of the attention ops: validate, plan (decode KV splits, prefill Q tiles, and the launch
// the policy picks: attention_policy.h), allocate the workspace, pack DecodeParams / PrefillParams /
// AppendParams, launch on the current stream; and the policy's tensor-free ops (can_implement, plan, device facts,
// switches).
#include <algorithm>
#include <cmath>
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
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_policy.h"
#include "kernels/common/host/align.h"

namespace astrai {
namespace {

using binding::check;
using binding::fail;
using torch::headeronly::ScalarType;
using torch::stable::Tensor;

constexpr const char* kOpDecode = "astrai.attn_decode";
constexpr const char* kOpPagedDecode = "astrai.attn_paged_decode";
constexpr const char* kOpAppend = "astrai.paged_kv_append";
constexpr const char* kOpPrefill = "astrai.attn_prefill";
constexpr const char* kOpPrefillRagged = "astrai.attn_prefill_ragged";
constexpr const char* kOpPagedPrefill = "astrai.attn_paged_prefill";

// q, K / V and the paged caches: the kernels' only element type.
constexpr ScalarType kAttnDtype = ScalarType::BFloat16;

bool aligned16(const Tensor& t) { return astrai::aligned16(t.data_ptr()); }

// The stride of a size-1 axis is never used; zero keeps an odd value from failing the 16-byte rule.
int64_t stride_of(const Tensor& t, int64_t d) { return t.size(d) == 1 ? int64_t(0) : t.stride(d); }

// bf16, last-dim stride 1, every other used stride a multiple of 8 elements and a 16-byte aligned base:
// the kernels move 16-byte runs.
void check_vec_layout(const char* op, const char* name, const Tensor& t) {
  binding::check_strides(op, name, t);
  if (t.numel() == 0) return;
  bool ok = aligned16(t);
  for (int64_t d = 0; d + 1 < t.dim(); ++d) ok = ok && stride_of(t, d) % 8 == 0;
  check(ok, op, name, " must be 16-byte aligned with strides (except the last) that are multiples of 8 ",
        "elements, got strides ", binding::strides_text(t), " (call .contiguous())");
}

// q, K and V: the 16-byte layout, then one CUDA device (device checks last, so that a CPU-dispatched call
// reports every other fault first).
void check_qkv(const char* op, const Tensor& q, const Tensor& k, const char* kname, const Tensor& v,
               const char* vname) {
  check_vec_layout(op, "q", q);
  check_vec_layout(op, kname, k);
  check_vec_layout(op, vname, v);
  binding::check_cuda_device(op, "q", q);
  binding::check_same_device(op, kname, k, "q", q);
  binding::check_same_device(op, vname, v, "q", q);
}

void check_int32_vector(const char* op, const char* name, const Tensor& t, int64_t size, const char* what) {
  binding::check_dtype(op, name, t, ScalarType::Int);
  binding::check_rank(op, name, t, 1, what);
  check(t.size(0) == size, op, name, " must have ", size, " elements ", what, ", got ", t.size(0));
  check(t.size(0) <= 1 || t.stride(0) == 1, op, name, " must be contiguous, got strides ", binding::strides_text(t));
  binding::check_element_aligned(op, name, t);
}

int32_t log2_exact(int64_t v) {
  int32_t l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return (int64_t(1) << l) == v ? l : -1;
}

// The device facts the policy plans with (attention_policy.h).
AttnTarget target_of(const char* op, int32_t device_index) {
  AttnTarget target{};
  binding::check_cuda_status(attn_device_target(device_index, &target), op,
                             [&] { return "querying the device facts of cuda:" + std::to_string(device_index); });
  return target;
}

struct DecodeArgs {
  const Tensor& q;
  const Tensor& k;
  const Tensor& v;
  const std::optional<Tensor>& page_table;  // set: paged
  const std::optional<Tensor>& kv_lens;
  const std::optional<Tensor>& mask;
  double scale;
  int64_t kv_split_size;
};

std::string config_str(const DecodeParams& p, const DecodeLaunch& launch, int32_t device_index) {
  std::ostringstream s;
  s << (p.paged ? "attn_paged_decode_bf16" : "attn_decode_bf16") << " (B=" << p.batch << ", Hq=" << p.num_q_heads
    << ", Hkv=" << p.num_kv_heads << ", D=" << p.head_dim << ", max_kv_len=" << p.max_kv_len;
  if (p.paged) s << ", page_size=" << (1 << p.page_size_log2) << ", num_pages=" << p.num_pages;
  s << ", splits=" << p.num_splits << "x" << p.split_len << ", pdl=" << (launch.pdl ? 1 : 0)
    << ", mask=" << (p.mask_ptr ? "yes" : "no")
    << ", device=cuda:" << device_index << ")";
  return s.str();
}

// Validates every argument (the device last, so that a CPU call reports shape errors first) and packs the
// inputs; output, workspace and the split plan are the caller's.
DecodeParams make_decode_params(const char* op, const DecodeArgs& a) {
  const bool paged = a.page_table.has_value();
  const char* kname = paged ? "k_cache" : "k";
  const char* vname = paged ? "v_cache" : "v";
  const char* kv_layout = paged ? "[num_pages, page_size, Hkv, D]" : "[B, L, Hkv, D]";
  binding::check_dtype(op, "q", a.q, kAttnDtype);
  binding::check_dtype(op, kname, a.k, kAttnDtype);
  binding::check_dtype(op, vname, a.v, kAttnDtype);
  binding::check_rank(op, "q", a.q, 3, "[B, Hq, D]");   // q: (B, Hq, D)
  binding::check_rank(op, kname, a.k, 4, kv_layout);      // k: (B, L, Hkv, D) or (P, page_size, Hkv, D)
  binding::check_rank(op, vname, a.v, 4, kv_layout);      // v: like k
  const int64_t batch = a.q.size(0), hq = a.q.size(1), d = a.q.size(2);
  const int64_t hkv = a.k.size(2);
  check(attn_head_dim_supported(d), op, "head_dim (q.size(2)) must be 64, 128 or 256, got ", d);
  check(a.k.size(3) == d, op, kname, ".size(3) must equal head_dim = q.size(2) = ", d, ", got ", a.k.size(3));
  check(a.v.sizes().equals(a.k.sizes()), op, vname, " must have the shape of ", kname, " ",
        binding::shape_text(a.k), ", got ", binding::shape_text(a.v));
  check(hkv >= 1 && hq >= 1 && hq % hkv == 0, op, "q heads (q.size(1) = ", hq, ") must be a positive multiple of ",
        "kv heads (", kname, ".size(2) = ", hkv, ")");
  check(batch <= 65535, op, "batch (q.size(0)) must be at most 65535, got ", batch);
  int64_t max_kv_len = 0, num_pages = 0, page_size = 0;
  if (paged) {
    const Tensor& pt = *a.page_table;
    num_pages = a.k.size(0);
    page_size = a.k.size(1);
    if (!attn_page_size_supported(page_size)) fail(op, "page_size (k_cache.size(1)) ", attn_page_size_rule(page_size));
    binding::check_dtype(op, "page_table", pt, ScalarType::Int);
    binding::check_rank(op, "page_table", pt, 2, "[B, max_pages]");  // page_table: (B, max_pages)
    check(pt.size(0) == batch, op, "page_table.size(0) must equal the batch q.size(0) = ", batch, ", got ",
          pt.size(0));
    check(pt.size(1) <= 1 || pt.stride(1) == 1, op, "page_table must have stride 1 in its last dimension, got ",
          binding::strides_text(pt));
    check(pt.stride(0) >= 0, op, "page_table must have non-negative strides, got ", binding::strides_text(pt));
    check(num_pages <= INT32_MAX, op, "k_cache.size(0) (pages) must fit in int32, got ", num_pages);
    max_kv_len = pt.size(1) * page_size;
    check(a.kv_lens.has_value(), op, "kv_lens is required for the paged cache");
  } else {
    max_kv_len = a.k.size(1);
    check(a.k.size(0) == batch, op, "k.size(0) must equal the batch q.size(0) = ", batch, ", got ", a.k.size(0));
  }
  check(max_kv_len <= INT32_MAX - 1024, op, "keys per sequence must fit in int32, got ", max_kv_len);
  if (a.kv_lens) {
    check_int32_vector(op, "kv_lens", *a.kv_lens, batch, "[B]");  // kv_lens: (B,)
  }
  if (a.mask) {
    const Tensor& m = *a.mask;
    binding::check_dtype(op, "mask", m, ScalarType::Bool);
    binding::check_rank(op, "mask", m, 2, "[B, kv_len]");  // mask: (B, kv_len)
    check(m.size(0) == batch, op, "mask.size(0) must equal the batch q.size(0) = ", batch, ", got ", m.size(0));
    if (!paged) {
      check(m.size(1) == max_kv_len, op, "mask.size(1) must equal the keys per sequence k.size(1) = ", max_kv_len,
            ", got ", m.size(1));
    }
    check(m.size(1) <= INT32_MAX, op, "mask.size(1) must fit in int32, got ", m.size(1));
    check(m.size(1) <= 1 || m.stride(1) == 1, op, "mask must have stride 1 in its last dimension, got ",
          binding::strides_text(m));
    check(m.stride(0) >= 0, op, "mask must have non-negative strides, got ", binding::strides_text(m));
  }
  check(std::isfinite(a.scale) && a.scale != 0.0, op, "scale must be finite and non-zero, got ", a.scale);
  check(a.kv_split_size >= 0, op, "kv_split_size must be >= 0 (0: automatic), got ", a.kv_split_size);
  check_qkv(op, a.q, a.k, kname, a.v, vname);
  if (paged) binding::check_same_device(op, "page_table", *a.page_table, "q", a.q);
  if (a.kv_lens) binding::check_same_device(op, "kv_lens", *a.kv_lens, "q", a.q);
  if (a.mask) binding::check_same_device(op, "mask", *a.mask, "q", a.q);

  DecodeParams p{};
  p.q_ptr = a.q.data_ptr();
  p.k_ptr = a.k.data_ptr();
  p.v_ptr = a.v.data_ptr();
  p.q_batch_stride = stride_of(a.q, 0);
  p.q_head_stride = stride_of(a.q, 1);
  p.k_batch_stride = stride_of(a.k, 0);
  p.k_seq_stride = stride_of(a.k, 1);
  p.k_head_stride = stride_of(a.k, 2);
  p.v_batch_stride = stride_of(a.v, 0);
  p.v_seq_stride = stride_of(a.v, 1);
  p.v_head_stride = stride_of(a.v, 2);
  if (paged) {
    p.page_table_ptr = static_cast<const int32_t*>(a.page_table->data_ptr());
    p.page_table_batch_stride = stride_of(*a.page_table, 0);
    p.num_pages = int32_t(num_pages);
    p.page_size_log2 = log2_exact(page_size);
  }
  if (a.kv_lens) p.kv_lens_ptr = static_cast<const int32_t*>(a.kv_lens->data_ptr());
  if (a.mask) {
    p.mask_ptr = static_cast<const uint8_t*>(a.mask->data_ptr());
    p.mask_batch_stride = stride_of(*a.mask, 0);
    p.mask_len = int32_t(a.mask->size(1));
  }
  p.batch = int32_t(batch);
  p.num_q_heads = int32_t(hq);
  p.num_kv_heads = int32_t(hkv);
  p.head_dim = int32_t(d);
  p.max_kv_len = int32_t(max_kv_len);
  p.scale_log2 = float(a.scale * 1.4426950408889634);
  p.paged = paged;
  return p;
}

Tensor decode(const char* op, const DecodeArgs& a) {
  DecodeParams p = make_decode_params(op, a);
  const int32_t device = a.q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  Tensor out = torch::stable::new_empty(a.q, {a.q.size(0), a.q.size(1), a.q.size(2)});
  if (p.batch == 0) return out;
  // An empty mask ([B, 0], paged) keeps no key; its data pointer may be null, which would read as "no mask".
  if (a.mask && a.mask->numel() == 0) {
    torch::stable::zero_(out);
    return out;
  }
  // The explicit plan: the split rule (attn_decode_plan) and the launch the policy picks (attn_decode_choose).
  const AttnTarget target = target_of(op, device);
  const DecodePlan plan = attn_decode_plan(p.batch, p.num_kv_heads, p.num_q_heads / p.num_kv_heads, p.max_kv_len,
                                           p.head_dim, p.paged, target.sm_count, a.kv_split_size);
  p.num_splits = plan.num_splits;
  p.split_len = plan.split_len;
  const DecodeLaunch launch = attn_decode_choose(p, attn_policy(), target);
  p.out_ptr = out.data_ptr();
  p.out_batch_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  // Workspace: its size depends on shapes only, so graph capture records one fixed allocation.
  std::optional<Tensor> partial_o, partial_lse;
  if (p.num_splits > 1) {
    partial_o = torch::stable::new_empty(a.q, {p.num_splits, p.batch, p.num_q_heads, p.head_dim}, ScalarType::Float);
    partial_lse = torch::stable::new_empty(a.q, {p.num_splits, p.batch, p.num_q_heads}, ScalarType::Float);
    p.partial_o_ptr = static_cast<float*>(partial_o->data_ptr());
    p.partial_lse_ptr = static_cast<float*>(partial_lse->data_ptr());
  }
  const cudaStream_t stream = binding::current_cuda_stream(op, device);
  binding::check_cuda_status(attn_decode_bf16_launch(p, launch, stream), op,
                             [&] { return config_str(p, launch, device); });
  return out;
}

Tensor attn_decode_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& kv_lens,
                        const std::optional<Tensor>& mask, double scale, int64_t kv_split_size) {
  const std::optional<Tensor> no_table;
  return decode(kOpDecode, DecodeArgs{q, k, v, no_table, kv_lens, mask, scale, kv_split_size});
}

Tensor attn_paged_decode_cuda(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const Tensor& page_table, const Tensor& kv_lens, const std::optional<Tensor>& mask,
                              double scale, int64_t kv_split_size) {
  const std::optional<Tensor> table(page_table), lens(kv_lens);
  return decode(kOpPagedDecode, DecodeArgs{q, k_cache, v_cache, table, lens, mask, scale, kv_split_size});
}

Tensor attn_decode_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& kv_lens,
                       const std::optional<Tensor>& mask, double scale, int64_t kv_split_size) {
  const std::optional<Tensor> no_table;
  make_decode_params(kOpDecode, DecodeArgs{q, k, v, no_table, kv_lens, mask, scale, kv_split_size});
  fail(kOpDecode, "q must be a CUDA tensor, got ", binding::device_text(q));
}

Tensor attn_paged_decode_cpu(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& page_table,
                             const Tensor& kv_lens, const std::optional<Tensor>& mask, double scale,
                             int64_t kv_split_size) {
  const std::optional<Tensor> table(page_table), lens(kv_lens);
  make_decode_params(kOpPagedDecode, DecodeArgs{q, k_cache, v_cache, table, lens, mask, scale, kv_split_size});
  fail(kOpPagedDecode, "q must be a CUDA tensor, got ", binding::device_text(q));
}

// ---- prefill --------------------------------------------------------------------------------------

// One packer serves the three prefill ops. Q schedule: ragged when qo_indptr is set ([Tq, Hq, D]), else
// dense ([B, Lq, Hq, D]). KV source: paged when page_table is set, contiguous ragged when kv_indptr is set
// ([Tkv, Hkv, D]), else contiguous dense ([B, L, Hkv, D]).
struct PrefillArgs {
  const Tensor& q;
  const Tensor& k;
  const Tensor& v;
  const std::optional<Tensor>& qo_indptr;
  const std::optional<Tensor>& kv_indptr;
  const std::optional<Tensor>& page_table;
  const std::optional<Tensor>& kv_lens;
  const std::optional<Tensor>& mask;
  bool is_causal;
  double scale;
};

std::string config_str(const char* kernel, const PrefillParams& p, const PrefillLaunch& launch,
                       int32_t device_index) {
  std::ostringstream s;
  s << kernel << (launch.kernel == PrefillKernel::kSm90 ? (launch.tma ? "[sm90, tma]" : "[sm90]") : "[mma]")
    << " (B=" << p.batch << ", " << (p.qo_indptr_ptr ? "Tq=" : "Lq=") << p.q_len << ", Hq=" << p.num_q_heads
    << ", Hkv=" << p.num_kv_heads << ", D=" << p.head_dim << ", max_kv_len=" << p.max_kv_len;
  if (p.paged) s << ", page_size=" << (1 << p.page_size_log2) << ", num_pages=" << p.num_pages;
  s << ", mask=" << (p.mask_ptr ? (p.mask_q_stride ? "3-D" : "2-D") : "no") << ", causal=" << (p.is_causal ? 1 : 0)
    << ", q_tiles=" << p.num_q_tiles << ", device=cuda:" << device_index << ")";
  return s.str();
}

// Validates every argument (the device last, so that a CPU call reports shape errors first) and packs the
// inputs; output, workspace and the tile plan are the caller's. Values inside qo_indptr, kv_indptr and
// kv_lens are never read here (that needs a host sync): the device clamps them.
PrefillParams make_prefill_params(const char* op, const PrefillArgs& a) {
  const bool ragged_q = a.qo_indptr.has_value();
  const bool paged = a.page_table.has_value();
  const bool ragged_kv = a.kv_indptr.has_value();
  const char* kname = paged ? "k_cache" : "k";
  const char* vname = paged ? "v_cache" : "v";
  const char* kv_layout = paged ? "[num_pages, page_size, Hkv, D]" : ragged_kv ? "[Tkv, Hkv, D]" : "[B, L, Hkv, D]";
  binding::check_dtype(op, "q", a.q, kAttnDtype);
  binding::check_dtype(op, kname, a.k, kAttnDtype);
  binding::check_dtype(op, vname, a.v, kAttnDtype);
  binding::check_rank(op, "q", a.q, ragged_q ? 3 : 4, ragged_q ? "[Tq, Hq, D]" : "[B, Lq, Hq, D]");
  binding::check_rank(op, kname, a.k, ragged_kv ? 3 : 4, kv_layout);  // k: (B, L, Hkv, D) / (Tkv, ..) / (P, ps, ..)
  binding::check_rank(op, vname, a.v, ragged_kv ? 3 : 4, kv_layout);  // v: like k
  const int64_t q_head_axis = ragged_q ? 1 : 2, k_head_axis = ragged_kv ? 1 : 2;
  const int64_t q_rows = a.q.size(ragged_q ? 0 : 1);  // Tq (ragged) or Lq (dense)
  const int64_t hq = a.q.size(q_head_axis), d = a.q.size(q_head_axis + 1), hkv = a.k.size(k_head_axis);
  check(attn_head_dim_supported(d), op, "head_dim (q.size(", q_head_axis + 1, ")) must be 64, 128 or 256, got ",
        d);
  check(a.k.size(k_head_axis + 1) == d, op, kname, ".size(", k_head_axis + 1, ") must equal head_dim = ", d, ", got ",
        a.k.size(k_head_axis + 1));
  check(a.v.sizes().equals(a.k.sizes()), op, vname, " must have the shape of ", kname, " ",
        binding::shape_text(a.k), ", got ", binding::shape_text(a.v));
  check(hkv >= 1 && hq >= 1 && hq % hkv == 0, op, "q heads (q.size(", q_head_axis, ") = ", hq,
        ") must be a positive multiple of kv heads (", kname, ".size(", k_head_axis, ") = ", hkv, ")");
  check(q_rows <= INT32_MAX, op, ragged_q ? "q.size(0) (Tq)" : "q.size(1) (Lq)", " must fit in int32, got ", q_rows);

  // The batch: q's first axis (dense Q), else the page table's rows (paged), else qo_indptr's size - 1.
  int64_t batch = 0;
  if (paged) {
    const Tensor& pt = *a.page_table;
    binding::check_dtype(op, "page_table", pt, ScalarType::Int);
    binding::check_rank(op, "page_table", pt, 2, "[B, max_pages]");  // page_table: (B, max_pages)
    batch = ragged_q ? pt.size(0) : a.q.size(0);
    check(pt.size(0) == batch, op, "page_table.size(0) must equal the batch q.size(0) = ", batch, ", got ",
          pt.size(0));
  } else if (ragged_q) {
    binding::check_dtype(op, "qo_indptr", *a.qo_indptr, ScalarType::Int);
    binding::check_rank(op, "qo_indptr", *a.qo_indptr, 1, "[B + 1]");
    check(a.qo_indptr->size(0) >= 1, op, "qo_indptr must have B + 1 >= 1 elements, got 0");
    batch = a.qo_indptr->size(0) - 1;
  } else {
    batch = a.q.size(0);
  }
  check(batch <= INT32_MAX - 1, op, "batch must fit in int32, got ", batch);
  if (ragged_q) check_int32_vector(op, "qo_indptr", *a.qo_indptr, batch + 1, "[B + 1]");  // qo_indptr: (B + 1,)
  if (ragged_kv) check_int32_vector(op, "kv_indptr", *a.kv_indptr, batch + 1, "[B + 1]");  // kv_indptr: (B + 1,)

  int64_t max_kv_len = 0, num_pages = 0, page_size = 0;
  if (paged) {
    const Tensor& pt = *a.page_table;
    num_pages = a.k.size(0);
    page_size = a.k.size(1);
    if (!attn_page_size_supported(page_size)) fail(op, "page_size (k_cache.size(1)) ", attn_page_size_rule(page_size));
    check(pt.size(1) <= 1 || pt.stride(1) == 1, op, "page_table must have stride 1 in its last dimension, got ",
          binding::strides_text(pt));
    check(pt.stride(0) >= 0, op, "page_table must have non-negative strides, got ", binding::strides_text(pt));
    binding::check_element_aligned(op, "page_table", pt);
    check(num_pages <= INT32_MAX, op, "k_cache.size(0) (pages) must fit in int32, got ", num_pages);
    max_kv_len = pt.size(1) * page_size;
    check(a.kv_lens.has_value(), op, "kv_lens is required for the paged cache");
  } else if (ragged_kv) {
    max_kv_len = a.k.size(0);
  } else {
    max_kv_len = a.k.size(1);
    check(a.k.size(0) == batch, op, "k.size(0) must equal the batch q.size(0) = ", batch, ", got ", a.k.size(0));
  }
  check(max_kv_len <= INT32_MAX - 1024, op, "keys per sequence must fit in int32, got ", max_kv_len);
  if (a.kv_lens) check_int32_vector(op, "kv_lens", *a.kv_lens, batch, "[B]");  // kv_lens: (B,)

  // Masks are indexed by (sequence, row within the sequence, key within the sequence). Contiguous dense K/V:
  // the key axis is exactly L; paged or ragged K/V: any M (keys at or past M are dropped).
  const bool mask_len_free = paged || ragged_kv;
  if (a.mask) {
    const Tensor& m = *a.mask;
    const char* rows = ragged_q ? "max_q_len" : "Lq";
    const char* keys = mask_len_free ? "M" : "L";
    binding::check_dtype(op, "mask", m, ScalarType::Bool);
    check(m.dim() == 2 || m.dim() == 3, op, "mask must be 2-D [B, ", keys, "] or 3-D [B, ", rows, ", ", keys,
          "], got ", m.dim(), "-D with shape ", binding::shape_text(m));
    check(m.size(0) == batch, op, "mask.size(0) must equal the batch ", batch, ", got ", m.size(0));
    const int64_t m_keys = m.size(m.dim() - 1);
    if (!mask_len_free) {
      check(m_keys == max_kv_len, op, "mask.size(", m.dim() - 1, ") must equal the keys per sequence k.size(1) = ",
            max_kv_len, ", got ", m_keys);
    }
    if (m.dim() == 3 && !ragged_q) {
      check(m.size(1) == q_rows, op, "mask.size(1) must equal the query rows q.size(1) = ", q_rows, ", got ",
            m.size(1));
    }
    check(m_keys <= INT32_MAX && (m.dim() == 2 || m.size(1) <= INT32_MAX), op, "mask sizes must fit in int32, got ",
          binding::shape_text(m));
    binding::check_strides(op, "mask", m);
    // The kernel reads a zero row stride as a [B, M] key mask, which keeps rows past max_q_len: packed rows can
    // run past it, so their 3-D mask needs a real row stride.
    check(!ragged_q || m.dim() == 2 || m.size(1) <= 1 || m.stride(1) != 0, op,
          "a 3-D mask must not have stride 0 along its rows (an expanded view), got strides ", binding::strides_text(m),
          "; pass the [B, M] key mask itself or call .contiguous()");
  }
  check(std::isfinite(a.scale) && a.scale != 0.0, op, "scale must be finite and non-zero, got ", a.scale);
  check_qkv(op, a.q, a.k, kname, a.v, vname);
  if (ragged_q) binding::check_same_device(op, "qo_indptr", *a.qo_indptr, "q", a.q);
  if (ragged_kv) binding::check_same_device(op, "kv_indptr", *a.kv_indptr, "q", a.q);
  if (paged) binding::check_same_device(op, "page_table", *a.page_table, "q", a.q);
  if (a.kv_lens) binding::check_same_device(op, "kv_lens", *a.kv_lens, "q", a.q);
  if (a.mask) binding::check_same_device(op, "mask", *a.mask, "q", a.q);

  PrefillParams p{};
  p.q_ptr = a.q.data_ptr();
  p.k_ptr = a.k.data_ptr();
  p.v_ptr = a.v.data_ptr();
  const int64_t qa = ragged_q ? 0 : 1;  // q's row axis
  p.q_batch_stride = ragged_q ? 0 : stride_of(a.q, 0);
  p.q_seq_stride = stride_of(a.q, qa);
  p.q_head_stride = stride_of(a.q, qa + 1);
  const int64_t ka = ragged_kv ? 0 : 1;  // k's key axis (the slot axis when paged)
  p.k_batch_stride = ragged_kv ? 0 : stride_of(a.k, 0);
  p.k_seq_stride = stride_of(a.k, ka);
  p.k_head_stride = stride_of(a.k, ka + 1);
  p.v_batch_stride = ragged_kv ? 0 : stride_of(a.v, 0);
  p.v_seq_stride = stride_of(a.v, ka);
  p.v_head_stride = stride_of(a.v, ka + 1);
  if (ragged_q) p.qo_indptr_ptr = static_cast<const int32_t*>(a.qo_indptr->data_ptr());
  if (ragged_kv) p.kv_indptr_ptr = static_cast<const int32_t*>(a.kv_indptr->data_ptr());
  if (a.kv_lens) p.kv_lens_ptr = static_cast<const int32_t*>(a.kv_lens->data_ptr());
  if (paged) {
    p.page_table_ptr = static_cast<const int32_t*>(a.page_table->data_ptr());
    p.page_table_batch_stride = stride_of(*a.page_table, 0);
    p.num_pages = int32_t(num_pages);
    p.page_size_log2 = log2_exact(page_size);
  }
  if (a.mask) {
    const Tensor& m = *a.mask;
    p.mask_ptr = static_cast<const uint8_t*>(m.data_ptr());
    p.mask_batch_stride = stride_of(m, 0);
    p.mask_len = int32_t(m.size(m.dim() - 1));
    // mask_q_stride == 0 means a [B, M] key mask for every row (no row limit); a 3-D mask of one row gets a
    // non-zero stride that row 0 never multiplies, so that rows past it keep nothing.
    p.mask_q_stride = m.dim() == 2 ? 0 : m.size(1) == 1 ? 1 : m.stride(1);
    p.mask_q_len = m.dim() == 3 ? int32_t(m.size(1)) : INT32_MAX;
  }
  p.batch = int32_t(batch);
  p.num_q_heads = int32_t(hq);
  p.num_kv_heads = int32_t(hkv);
  p.head_dim = int32_t(d);
  p.q_len = int32_t(q_rows);
  p.max_kv_len = int32_t(max_kv_len);
  p.scale_log2 = float(a.scale * 1.4426950408889634);
  p.is_causal = a.is_causal;
  p.paged = paged;
  return p;
}

Tensor prefill(const char* op, const char* kernel, const PrefillArgs& a) {
  PrefillParams p = make_prefill_params(op, a);
  const int32_t device = a.q.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  Tensor out = torch::stable::new_empty(a.q, a.q.sizes());  // shaped like q, contiguous
  if (p.batch == 0 || p.q_len == 0) return out;
  // No key can be kept (no keys, no pages, an empty mask): every row is zeros. An empty tensor may have a null
  // data pointer, which would read as "no mask", so these never reach the kernel.
  if (p.max_kv_len == 0 || a.k.numel() == 0 || (a.mask && a.mask->numel() == 0)) {
    torch::stable::zero_(out);
    return out;
  }
  const bool ragged_q = a.qo_indptr.has_value();
  p.out_ptr = out.data_ptr();
  p.out_batch_stride = ragged_q ? 0 : out.stride(0);
  p.out_seq_stride = out.stride(ragged_q ? 0 : 1);
  p.out_head_stride = out.stride(ragged_q ? 1 : 2);
  // The tile plan depends on shapes only (never on qo_indptr's values): no host sync, one fixed workspace
  // allocation under graph capture.
  const PrefillPlan plan = attn_prefill_plan(p);
  p.num_q_tiles = plan.num_q_tiles;
  const int64_t words = plan.workspace_bytes / 4;  // ragged: two tile maps; then the scheduler's counter
  Tensor workspace = torch::stable::new_empty(a.q, {words}, ScalarType::Int);
  int32_t* base = static_cast<int32_t*>(workspace.data_ptr());
  if (ragged_q) {
    p.q_tile_to_batch = base;                     // [num_q_tiles]
    p.q_tile_to_index = base + plan.num_q_tiles;  // [num_q_tiles]
  }
  p.sched_counter_ptr = words > 0 ? base + (words - 1) : nullptr;  // 0 words: invalid shapes, the launch refuses
  // The explicit plan: the kernel (and its K/V copy) the policy picks for this device (attn_prefill_choose).
  const int64_t page_size = p.paged ? int64_t(1) << p.page_size_log2 : 0;
  const PrefillLaunch launch =
      attn_prefill_choose(p.head_dim, page_size, p.scale_log2 > 0.f, attn_policy(), target_of(op, device));
  const cudaStream_t stream = binding::current_cuda_stream(op, device);
  binding::check_cuda_status(attn_prefill_bf16_launch(p, launch, stream), op,
                             [&] { return config_str(kernel, p, launch, device); });
  return out;
}

const std::optional<Tensor> kNone;

Tensor attn_prefill_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& kv_lens,
                         const std::optional<Tensor>& mask, bool is_causal, double scale) {
  return prefill(kOpPrefill, "attn_prefill_bf16",
                 PrefillArgs{q, k, v, kNone, kNone, kNone, kv_lens, mask, is_causal, scale});
}

Tensor attn_prefill_ragged_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qo_indptr,
                                const Tensor& kv_indptr, const std::optional<Tensor>& mask, bool is_causal,
                                double scale) {
  const std::optional<Tensor> qo(qo_indptr), kv(kv_indptr);
  return prefill(kOpPrefillRagged, "attn_prefill_ragged_bf16",
                 PrefillArgs{q, k, v, qo, kv, kNone, kNone, mask, is_causal, scale});
}

Tensor attn_paged_prefill_cuda(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                               const std::optional<Tensor>& qo_indptr, const Tensor& page_table,
                               const Tensor& kv_lens, const std::optional<Tensor>& mask, bool is_causal,
                               double scale) {
  const std::optional<Tensor> table(page_table), lens(kv_lens);
  return prefill(kOpPagedPrefill, "attn_paged_prefill_bf16",
                 PrefillArgs{q, k_cache, v_cache, qo_indptr, kNone, table, lens, mask, is_causal, scale});
}

Tensor attn_prefill_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& kv_lens,
                        const std::optional<Tensor>& mask, bool is_causal, double scale) {
  make_prefill_params(kOpPrefill, PrefillArgs{q, k, v, kNone, kNone, kNone, kv_lens, mask, is_causal, scale});
  fail(kOpPrefill, "q must be a CUDA tensor, got ", binding::device_text(q));
}

Tensor attn_prefill_ragged_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qo_indptr,
                               const Tensor& kv_indptr, const std::optional<Tensor>& mask, bool is_causal,
                               double scale) {
  const std::optional<Tensor> qo(qo_indptr), kv(kv_indptr);
  make_prefill_params(kOpPrefillRagged, PrefillArgs{q, k, v, qo, kv, kNone, kNone, mask, is_causal, scale});
  fail(kOpPrefillRagged, "q must be a CUDA tensor, got ", binding::device_text(q));
}

Tensor attn_paged_prefill_cpu(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const std::optional<Tensor>& qo_indptr, const Tensor& page_table, const Tensor& kv_lens,
                              const std::optional<Tensor>& mask, bool is_causal, double scale) {
  const std::optional<Tensor> table(page_table), lens(kv_lens);
  make_prefill_params(kOpPagedPrefill,
                      PrefillArgs{q, k_cache, v_cache, qo_indptr, kNone, table, lens, mask, is_causal, scale});
  fail(kOpPagedPrefill, "q must be a CUDA tensor, got ", binding::device_text(q));
}

// ---- paged_kv_append ------------------------------------------------------------------------------

AppendParams make_append_params(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k_new,
                                const Tensor& v_new, const Tensor& page_table, const Tensor& seq_ids,
                                const Tensor& positions) {
  const char* op = kOpAppend;
  binding::check_dtype(op, "k_cache", k_cache, kAttnDtype);
  binding::check_dtype(op, "v_cache", v_cache, kAttnDtype);
  binding::check_dtype(op, "k_new", k_new, kAttnDtype);
  binding::check_dtype(op, "v_new", v_new, kAttnDtype);
  binding::check_rank(op, "k_cache", k_cache, 4, "[num_pages, page_size, Hkv, D]");  // (P, page_size, Hkv, D)
  binding::check_rank(op, "v_cache", v_cache, 4, "[num_pages, page_size, Hkv, D]");
  binding::check_rank(op, "k_new", k_new, 3, "[N, Hkv, D]");                         // k_new: (N, Hkv, D)
  binding::check_rank(op, "v_new", v_new, 3, "[N, Hkv, D]");
  check(v_cache.sizes().equals(k_cache.sizes()), op, "v_cache must have the shape of k_cache ",
        binding::shape_text(k_cache), ", got ", binding::shape_text(v_cache));
  const int64_t n = k_new.size(0), hkv = k_cache.size(2), d = k_cache.size(3), page_size = k_cache.size(1);
  if (!attn_page_size_supported(page_size)) fail(op, "page_size (k_cache.size(1)) ", attn_page_size_rule(page_size));
  check(attn_append_head_dim_supported(d), op, "head_dim (k_cache.size(3)) must be a positive multiple of 8, got ", d);
  check(k_new.size(1) == hkv && k_new.size(2) == d, op, "k_new must be [N, ", hkv, ", ", d,
        "] to match k_cache, got ", binding::shape_text(k_new));
  check(v_new.sizes().equals(k_new.sizes()), op, "v_new must have the shape of k_new ", binding::shape_text(k_new),
        ", got ", binding::shape_text(v_new));
  binding::check_dtype(op, "page_table", page_table, ScalarType::Int);
  binding::check_rank(op, "page_table", page_table, 2, "[B, max_pages]");
  check(page_table.size(1) <= 1 || page_table.stride(1) == 1, op,
        "page_table must have stride 1 in its last dimension, got ", binding::strides_text(page_table));
  check(page_table.stride(0) >= 0, op, "page_table must have non-negative strides");
  check(page_table.size(0) <= INT32_MAX && page_table.size(1) <= INT32_MAX && k_cache.size(0) <= INT32_MAX, op,
        "page_table and page counts must fit in int32");
  check_int32_vector(op, "seq_ids", seq_ids, n, "[N]");
  check_int32_vector(op, "positions", positions, n, "[N]");
  check_vec_layout(op, "k_cache", k_cache);
  check_vec_layout(op, "v_cache", v_cache);
  check_vec_layout(op, "k_new", k_new);
  check_vec_layout(op, "v_new", v_new);
  check(binding::strides_non_overlapping(k_cache) && binding::strides_non_overlapping(v_cache), op,
        "k_cache and v_cache are written in place and must not have overlapping elements");

  binding::check_cuda_device(op, "k_cache", k_cache);
  binding::check_same_device(op, "v_cache", v_cache, "k_cache", k_cache);
  binding::check_same_device(op, "k_new", k_new, "k_cache", k_cache);
  binding::check_same_device(op, "v_new", v_new, "k_cache", k_cache);
  binding::check_same_device(op, "page_table", page_table, "k_cache", k_cache);
  binding::check_same_device(op, "seq_ids", seq_ids, "k_cache", k_cache);
  binding::check_same_device(op, "positions", positions, "k_cache", k_cache);

  AppendParams p{};
  p.k_cache_ptr = k_cache.data_ptr();
  p.v_cache_ptr = v_cache.data_ptr();
  p.k_new_ptr = k_new.data_ptr();
  p.v_new_ptr = v_new.data_ptr();
  p.page_table_ptr = static_cast<const int32_t*>(page_table.data_ptr());
  p.seq_ids_ptr = static_cast<const int32_t*>(seq_ids.data_ptr());
  p.positions_ptr = static_cast<const int32_t*>(positions.data_ptr());
  p.k_cache_page_stride = stride_of(k_cache, 0);
  p.k_cache_seq_stride = stride_of(k_cache, 1);
  p.k_cache_head_stride = stride_of(k_cache, 2);
  p.v_cache_page_stride = stride_of(v_cache, 0);
  p.v_cache_seq_stride = stride_of(v_cache, 1);
  p.v_cache_head_stride = stride_of(v_cache, 2);
  p.k_new_token_stride = stride_of(k_new, 0);
  p.k_new_head_stride = stride_of(k_new, 1);
  p.v_new_token_stride = stride_of(v_new, 0);
  p.v_new_head_stride = stride_of(v_new, 1);
  p.page_table_batch_stride = stride_of(page_table, 0);
  p.seq_ids_stride = 1;
  p.positions_stride = 1;
  p.num_tokens = n;
  p.batch = int32_t(page_table.size(0));
  p.max_pages = int32_t(page_table.size(1));
  p.num_pages = int32_t(k_cache.size(0));
  p.page_size_log2 = log2_exact(page_size);
  p.num_kv_heads = int32_t(hkv);
  p.head_dim = int32_t(d);
  return p;
}

void paged_kv_append_cuda(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k_new, const Tensor& v_new,
                          const Tensor& page_table, const Tensor& seq_ids, const Tensor& positions) {
  const AppendParams p = make_append_params(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions);
  if (p.num_tokens == 0) return;
  const int32_t device = k_cache.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(device);
  const cudaStream_t stream = binding::current_cuda_stream(kOpAppend, device);
  binding::check_cuda_status(paged_kv_append_bf16_launch(p, stream), kOpAppend, [&] {
    std::ostringstream config;
    config << "paged_kv_append_bf16 (N=" << p.num_tokens << ", Hkv=" << p.num_kv_heads << ", D=" << p.head_dim
           << ", page_size=" << (1 << p.page_size_log2) << ", device=cuda:" << device << ")";
    return config.str();
  });
}

void paged_kv_append_cpu(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k_new, const Tensor& v_new,
                         const Tensor& page_table, const Tensor& seq_ids, const Tensor& positions) {
  make_append_params(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions);
  fail(kOpAppend, "k_cache must be a CUDA tensor, got ", binding::device_text(k_cache));
}

// ---- the policy's tensor-free ops ----------------------------------------------------------------------------

AttnTarget described(int64_t cc, int64_t code_arch, int64_t binary_arch, int64_t sm_count, int64_t smem_optin) {
  return AttnTarget{int(cc), int(code_arch), int(binary_arch), int(sm_count), int(smem_optin)};
}

// Why paged_kv_append cannot write tokens of `new_dtype` into a cache of `cache_dtype` with this head_dim and
// page_size; empty when it can (make_append_params checks the same).
std::string attn_append_unsupported(ScalarType new_dtype, ScalarType cache_dtype, int64_t head_dim,
                                    int64_t page_size) {
  if (cache_dtype != kAttnDtype) return binding::dtype_rule("the cache", cache_dtype, kAttnDtype);
  if (new_dtype != kAttnDtype) return binding::dtype_rule("k_new / v_new", new_dtype, kAttnDtype);
  return attn_append_shapes_unsupported(head_dim, page_size);
}

bool decode_kind(const char* op, const std::string& kind, bool append_ok = false) {
  check(kind == "decode" || kind == "prefill", op,
        append_ok ? "kind must be 'decode', 'prefill' or 'append'" : "kind must be 'decode' or 'prefill'", ", got '",
        kind, "'");
  return kind == "decode";
}

// Why the attention ops cannot serve a call of these dtypes and shapes, or cannot run `kernel` (prefill: 0 mma,
// 1 sm90; decode: `pdl`) on a device described by (cc, code_arch, binary_arch, sm_count, smem_optin); empty when
// they can. kernel -1: the dtypes and shapes only. kind "append": paged_kv_append's rules (q_dtype: the new
// tokens', kv_dtype: the cache's; head_dim and page_size only). No tensors: callable on the CPU, for devices not
// in hand; the policies ask it instead of restating the rules.
std::string attn_can_implement(std::string kind, ScalarType q_dtype, ScalarType kv_dtype, int64_t head_dim,
                               int64_t num_q_heads, int64_t num_kv_heads, int64_t page_size, double scale,
                               int64_t kernel, bool pdl, int64_t cc, int64_t code_arch, int64_t binary_arch,
                               int64_t sm_count, int64_t smem_optin) {
  const char* op = "astrai.attn_can_implement";
  if (kind == "append") return attn_append_unsupported(q_dtype, kv_dtype, head_dim, page_size);
  const bool decode = decode_kind(op, kind, true);
  if (q_dtype != kAttnDtype) return binding::dtype_rule("q", q_dtype, kAttnDtype);
  if (kv_dtype != kAttnDtype) return binding::dtype_rule("K/V", kv_dtype, kAttnDtype);
  std::string why = attn_shapes_unsupported(head_dim, num_q_heads, num_kv_heads, page_size);
  if (!why.empty() || kernel < 0) return why;
  const AttnTarget target = described(cc, code_arch, binary_arch, sm_count, smem_optin);
  if (decode) return attn_decode_unfit(DecodeLaunch{pdl}, target);
  if (kernel > 1) return "prefill kernel must be 0 (mma) or 1 (sm90), got " + std::to_string(kernel);
  const PrefillLaunch launch{kernel == 1 ? PrefillKernel::kSm90 : PrefillKernel::kMma, true};
  return attn_prefill_unfit(head_dim, page_size, scale > 0.0, launch, target);
}

// The plan the attention ops launch for a call of these sizes on a described device under the process's policy:
// decode [num_splits, split_len, pdl]; prefill [kernel (0 mma, 1 sm90), tma, num_q_tiles]. page_size 0:
// contiguous K/V; kv_split_size as the decode ops take it.
std::vector<int64_t> attn_plan(std::string kind, int64_t batch, int64_t q_len, int64_t num_q_heads,
                               int64_t num_kv_heads, int64_t head_dim, int64_t max_kv_len, int64_t page_size,
                               bool ragged_q, double scale, int64_t kv_split_size, int64_t cc, int64_t code_arch,
                               int64_t binary_arch, int64_t sm_count, int64_t smem_optin) {
  const char* op = "astrai.attn_plan";
  const bool decode = decode_kind(op, kind);
  const std::string why = attn_shapes_unsupported(head_dim, num_q_heads, num_kv_heads, page_size);
  check(why.empty(), op, why);
  check(batch >= 0 && batch <= INT32_MAX - 1 && q_len >= 0 && q_len <= INT32_MAX && max_kv_len >= 0 &&
            max_kv_len <= INT32_MAX - 1024,
        op, "batch, q_len and max_kv_len must be >= 0 and fit in int32, got ", batch, ", ", q_len, ", ", max_kv_len);
  check(kv_split_size >= 0, op, "kv_split_size must be >= 0 (0: automatic), got ", kv_split_size);
  const AttnTarget target = described(cc, code_arch, binary_arch, sm_count, smem_optin);
  const AttnPolicy policy = attn_policy();
  if (decode) {
    DecodeParams p{};
    p.batch = int32_t(batch);
    p.num_q_heads = int32_t(num_q_heads);
    p.num_kv_heads = int32_t(num_kv_heads);
    p.head_dim = int32_t(head_dim);
    const DecodePlan plan = attn_decode_plan(p.batch, p.num_kv_heads, p.num_q_heads / p.num_kv_heads,
                                             int32_t(max_kv_len), p.head_dim, page_size != 0, target.sm_count,
                                             kv_split_size);
    p.num_splits = plan.num_splits;
    p.split_len = plan.split_len;
    return {plan.num_splits, plan.split_len, attn_decode_choose(p, policy, target).pdl ? 1 : 0};
  }
  PrefillParams p{};
  p.batch = int32_t(batch);
  p.q_len = int32_t(q_len);
  p.num_q_heads = int32_t(num_q_heads);
  p.num_kv_heads = int32_t(num_kv_heads);
  p.head_dim = int32_t(head_dim);
  p.max_kv_len = int32_t(max_kv_len);
  static int32_t marker = 0;  // a non-null qo_indptr: the plan of ragged Q
  p.qo_indptr_ptr = ragged_q ? &marker : nullptr;
  const PrefillLaunch launch = attn_prefill_choose(head_dim, page_size, scale > 0.0, policy, target);
  return {int64_t(launch.kernel), launch.tma ? 1 : 0, attn_prefill_plan(p).num_q_tiles};
}

// [cc, code_arch, binary_arch, sm_count, smem_optin] of CUDA device `device` with this image's attention code.
std::vector<int64_t> attn_device_facts(int64_t device) {
  const AttnTarget t = target_of("astrai.attn_device_facts", int32_t(device));
  return {t.cc, t.code_arch, t.binary_arch, t.sm_count, t.smem_optin};
}

// The process's policy switches (AttnPolicy), pushed by astrai.extension.attention_plan; returns the previous
// ones as [decode_pdl, prefill_sm90, prefill_tma].
std::vector<int64_t> attn_set_policy_op(bool decode_pdl, bool prefill_sm90, bool prefill_tma) {
  const AttnPolicy previous = attn_policy();
  AttnPolicy policy;
  policy.decode_pdl = decode_pdl;
  policy.prefill_sm90 = prefill_sm90;
  policy.prefill_tma = prefill_tma;
  attn_set_policy(policy);
  return {previous.decode_pdl ? 1 : 0, previous.prefill_sm90 ? 1 : 0, previous.prefill_tma ? 1 : 0};
}

}  // namespace
}  // namespace astrai

// Schemas: docs/contracts.md, "Attention ops". FRAGMENT: other families register into `astrai` too.
STABLE_TORCH_LIBRARY_FRAGMENT(astrai, m) {
  m.def("attn_decode(Tensor q, Tensor k, Tensor v, Tensor? kv_lens, Tensor? mask, float scale, "
        "int kv_split_size) -> Tensor");
  m.def("attn_paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor kv_lens, "
        "Tensor? mask, float scale, int kv_split_size) -> Tensor");
  m.def("paged_kv_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, Tensor page_table, "
        "Tensor seq_ids, Tensor positions) -> ()");
  m.def("attn_prefill(Tensor q, Tensor k, Tensor v, Tensor? kv_lens, Tensor? mask, bool is_causal, float scale) "
        "-> Tensor");
  m.def("attn_prefill_ragged(Tensor q, Tensor k, Tensor v, Tensor qo_indptr, Tensor kv_indptr, Tensor? mask, "
        "bool is_causal, float scale) -> Tensor");
  m.def("attn_paged_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? qo_indptr, Tensor page_table, "
        "Tensor kv_lens, Tensor? mask, bool is_causal, float scale) -> Tensor");
  m.def("attn_can_implement(str kind, ScalarType q_dtype, ScalarType kv_dtype, int head_dim, int num_q_heads, "
        "int num_kv_heads, int page_size, float scale, int kernel, bool pdl, int cc, int code_arch, int binary_arch, "
        "int sm_count, int smem_optin) -> str");
  m.def("attn_plan(str kind, int batch, int q_len, int num_q_heads, int num_kv_heads, int head_dim, int max_kv_len, "
        "int page_size, bool ragged_q, float scale, int kv_split_size, int cc, int code_arch, int binary_arch, "
        "int sm_count, int smem_optin) -> int[]");
  m.def("attn_device_facts(int device) -> int[]");
  m.def("attn_set_policy(bool decode_pdl, bool prefill_sm90, bool prefill_tma) -> int[]");
}

// No tensor arguments: one kernel for every backend.
STABLE_TORCH_LIBRARY_IMPL(astrai, CompositeExplicitAutograd, m) {
  m.impl("attn_can_implement", TORCH_BOX(&astrai::attn_can_implement));
  m.impl("attn_plan", TORCH_BOX(&astrai::attn_plan));
  m.impl("attn_device_facts", TORCH_BOX(&astrai::attn_device_facts));
  m.impl("attn_set_policy", TORCH_BOX(&astrai::attn_set_policy_op));
}

STABLE_TORCH_LIBRARY_IMPL(astrai, CUDA, m) {
  m.impl("attn_decode", TORCH_BOX(&astrai::attn_decode_cuda));
  m.impl("attn_paged_decode", TORCH_BOX(&astrai::attn_paged_decode_cuda));
  m.impl("paged_kv_append", TORCH_BOX(&astrai::paged_kv_append_cuda));
  m.impl("attn_prefill", TORCH_BOX(&astrai::attn_prefill_cuda));
  m.impl("attn_prefill_ragged", TORCH_BOX(&astrai::attn_prefill_ragged_cuda));
  m.impl("attn_paged_prefill", TORCH_BOX(&astrai::attn_paged_prefill_cuda));
}

STABLE_TORCH_LIBRARY_IMPL(astrai, CPU, m) {
  m.impl("attn_decode", TORCH_BOX(&astrai::attn_decode_cpu));
  m.impl("attn_paged_decode", TORCH_BOX(&astrai::attn_paged_decode_cpu));
  m.impl("paged_kv_append", TORCH_BOX(&astrai::paged_kv_append_cpu));
  m.impl("attn_prefill", TORCH_BOX(&astrai::attn_prefill_cpu));
  m.impl("attn_prefill_ragged", TORCH_BOX(&astrai::attn_prefill_ragged_cpu));
  m.impl("attn_paged_prefill", TORCH_BOX(&astrai::attn_paged_prefill_cpu));
}
