// Launchers of the row-major quantize kernel and the per-tensor amax pass; quantize_plan picks a quantize_launch's
// kernel, variant and grid (transposed layouts: the tiled-transpose kernels), quantize_launch runs exactly that plan.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/quantize/quantize.h"
#include "kernels/quantize/quantize_dispatch.h"
#include "kernels/quantize/quantize_rows.cuh"

namespace astrai {
namespace {

using quantize::kRowsBlockThreads;
using quantize::kStep;

int in_bytes(QuantIn t) { return t == QuantIn::kF32 ? 4 : 2; }

// 16-byte moves: x 16-byte aligned, rows start 16-byte aligned, whole 16-element steps (out rows too).
bool vec_rows(const void* x, int64_t row_stride, int64_t cols, QuantIn t) {
  return aligned16(x) && (row_stride * in_bytes(t)) % 16 == 0 && cols % kStep == 0;
}

// The rows kernel's plan: threads per row (a power of two in [8, 256]) and the grid. Static multipliers: two loop
// iterations of kUnroll steps (fewer threads per row, each with more bytes in flight, beat one iteration:
// docs/benchmarks.md, quantize section). Groups: one iteration. Dynamic rows: the smallest that holds the row in the
// register cache (two warps for N = 4096 bf16), on a persistent grid (the prefetch of each block's next rows needs
// blocks that loop).
template <QuantIn kIn, QuantOut kOut, bool kVec>
cudaError_t plan_rows(const QuantizeParams& p, QuantizeLaunch* plan) {
  using quantize::RowsMode;
  const int64_t steps = (p.cols + kStep - 1) / kStep;
  const int per_thread = p.scale_kind == QuantScale::kDynamicRow     ? quantize::row_cache_steps(kIn)
                         : p.scale_kind == QuantScale::kDynamicGroup ? quantize::kUnroll
                                                                     : 2 * quantize::kUnroll;
  int tpr = 8;
  while (tpr < kRowsBlockThreads && int64_t(tpr) * per_thread < steps) tpr *= 2;
  const int rpb = kRowsBlockThreads / tpr;
  int64_t grid = 0;
  ASTRAI_CUDA_TRY(quantize_detail::grid_for((p.rows + rpb - 1) / rpb, kRowsBlockThreads, p.max_blocks, &grid));
  if (p.scale_kind == QuantScale::kDynamicRow && quantize::rows_prefetch_default<RowsMode::kDynamicRow>() &&
      p.max_blocks == 0) {
    const auto kernel = &quantize::quantize_rows_kernel<kIn, kOut, kVec, RowsMode::kDynamicRow>;
    DeviceFacts facts{};
    ASTRAI_CUDA_TRY(current_device_facts(&facts));
    int resident = 0;
    ASTRAI_CUDA_TRY(resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kRowsBlockThreads, 0, &resident));
    if (resident > 0) grid = std::min<int64_t>(grid, int64_t(resident) * facts.sm_count);
  }
  *plan = QuantizeLaunch{QuantizeKernel::kRows, kVec, tpr, grid};
  return cudaSuccess;
}

template <QuantIn kIn, QuantOut kOut, bool kVec>
cudaError_t launch_rows(const QuantizeParams& p, const QuantizeLaunch& l, cudaStream_t stream) {
  using quantize::RowsMode;
  const dim3 grid(unsigned(l.blocks));
  const dim3 block(l.threads_per_row, kRowsBlockThreads / l.threads_per_row);
  if (p.scale_kind == QuantScale::kDynamicRow) {
    quantize::quantize_rows_kernel<kIn, kOut, kVec, RowsMode::kDynamicRow><<<grid, block, 0, stream>>>(p);
  } else if (p.scale_kind == QuantScale::kDynamicGroup) {
    quantize::quantize_rows_kernel<kIn, kOut, kVec, RowsMode::kGroup><<<grid, block, 0, stream>>>(p);
  } else if (p.scale_kind == QuantScale::kColumn) {
    quantize::quantize_rows_kernel<kIn, kOut, kVec, RowsMode::kColumn><<<grid, block, 0, stream>>>(p);
  } else if (p.fold_counter_ptr != nullptr) {
    if constexpr (kOut != QuantOut::kInt8) {  // the fused fold: fp8 only (params_valid)
      using quantize::row_cache_steps;
      using quantize::rows_min_blocks;
      using quantize::rows_prefetch_default;
      quantize::quantize_rows_kernel<kIn, kOut, kVec, RowsMode::kStatic, rows_min_blocks<kIn, kVec, RowsMode::kStatic>(),
                                     rows_prefetch_default<RowsMode::kStatic>(), row_cache_steps(kIn), true>
          <<<grid, block, 0, stream>>>(p);
    }
  } else {
    quantize::quantize_rows_kernel<kIn, kOut, kVec, RowsMode::kStatic><<<grid, block, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

// 16-byte moves of the rows kernel: x and out 16-byte aligned, rows start 16-byte aligned, whole 16-element steps.
bool rows_vec_allowed(const QuantizeParams& p) {
  return vec_rows(p.x_ptr, p.x_row_stride, p.cols, p.in_type) && (p.out_ptr == nullptr || aligned16(p.out_ptr));
}

bool params_valid(const QuantizeParams& p) {
  if (p.rows < 0 || p.cols < 0 || p.x_row_stride < 0) return false;
  // An empty x may have null data (a fused fold still runs on it).
  const bool empty = p.rows == 0 || p.cols == 0;
  if (!empty && (p.x_ptr == nullptr || (p.out_ptr == nullptr && p.out_t_ptr == nullptr))) return false;
  if (int32_t(p.in_type) < 0 || int32_t(p.in_type) > 2 || int32_t(p.out_type) < 0 || int32_t(p.out_type) > 2) {
    return false;
  }
  const QuantScale k = p.scale_kind;
  const bool static_kind = k == QuantScale::kTensor || k == QuantScale::kRow || k == QuantScale::kColumn;
  if (static_kind && p.scale_ptr == nullptr) return false;
  if (k == QuantScale::kFromAmax && p.amax_in_ptr == nullptr) return false;
  if (k == QuantScale::kDynamicGroup && (p.group_cols != 128 || p.scale_inv_ptr == nullptr)) return false;
  if (int32_t(k) < 0 || int32_t(k) > 5) return false;
  if (p.amax_kind != QuantAmax::kNone && p.amax_ptr == nullptr) return false;
  if (p.fold_counter_ptr != nullptr && (p.scale_ptr == nullptr || p.amax_ptr == nullptr)) return false;
  if (int32_t(p.amax_kind) < 0 || int32_t(p.amax_kind) > 2) return false;
  if (!(p.qmax > 0.0f)) return false;
  if (p.out_t_ptr != nullptr) {
    if (p.out_type == QuantOut::kInt8) return false;
    if (k == QuantScale::kDynamicRow || k == QuantScale::kDynamicGroup) return false;
  }
  if (p.fold_counter_ptr != nullptr) {
    // Fused delayed scaling: one multiplier, the per-tensor amax, and a ring whose scale is that multiplier.
    if (k != QuantScale::kTensor || p.amax_kind != QuantAmax::kTensor || p.out_type == QuantOut::kInt8) return false;
    if (p.fold.ring_ptr == nullptr || p.fold.pos_ptr == nullptr || p.fold.len < 1 || p.fold.margin < 0) return false;
    if (p.fold.scale_ptr != p.scale_ptr || !(p.fold.qmax > 0.0f)) return false;
  }
  return true;
}

}  // namespace

cudaError_t quantize_plan(const QuantizeParams& p, QuantizeLaunch* plan) {
  *plan = QuantizeLaunch{QuantizeKernel::kRows, false, 0, 0};
  if (!params_valid(p)) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;  // no quantize kernel (a fused fold's own launch)
  if (p.out_t_ptr != nullptr) {
    return quantize_detail::quantize_transpose_plan(p, plan);
  }
  return quantize_detail::with_types<true>(p, rows_vec_allowed(p), [&](auto in, auto out, auto vec) {
    return plan_rows<decltype(in)::value, decltype(out)::value, decltype(vec)::value>(p, plan);
  });
}

std::string quantize_launch_unfit(const QuantizeParams& p, const QuantizeLaunch& l) {
  if (p.rows == 0 || p.cols == 0) return std::string();  // nothing to plan
  if (l.blocks < 1 || l.blocks > INT32_MAX) return "blocks must be in [1, 2^31), got " + std::to_string(l.blocks);
  if (l.kernel != QuantizeKernel::kRows) return quantize_detail::quantize_transpose_unfit(p, l);
  if (p.out_t_ptr != nullptr) return "a transposed output takes a transpose kernel, not the rows kernel";
  if (l.vec && !rows_vec_allowed(p)) {
    return "vec needs x and out 16-byte aligned, rows starting 16-byte aligned and cols a multiple of 16";
  }
  const int tpr = l.threads_per_row;
  if (tpr < 8 || tpr > kRowsBlockThreads || (tpr & (tpr - 1)) != 0) {
    return "threads_per_row must be a power of two in [8, 256], got " + std::to_string(tpr);
  }
  return std::string();
}

cudaError_t quantize_launch(const QuantizeParams& p, const QuantizeLaunch& l, cudaStream_t stream) {
  if (!params_valid(p)) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) {
    // Nothing to cast; a fused fold still takes this step's amax (0): one block of the fold kernel.
    if (p.fold_counter_ptr == nullptr) return cudaSuccess;
    AmaxHistoryParams f = p.fold;
    f.amax_ptr = p.amax_ptr;
    if (p.step_scale_inv_ptr != nullptr) {
      // 1 / this step's multiplier, as the kernels write it (tensor_multiplier).
      quantize::step_scale_inv_kernel<><<<dim3(1), dim3(32), 0, stream>>>(p.scale_ptr, p.step_scale_inv_ptr);
      ASTRAI_CUDA_TRY(cudaGetLastError());
    }
    return amax_history_fold_launch(f, stream);
  }
  if (!quantize_launch_unfit(p, l).empty()) return cudaErrorInvalidValue;
  if (l.kernel != QuantizeKernel::kRows) return quantize_detail::quantize_transpose_launch(p, l, stream);
  return quantize_detail::with_types<true>(p, l.vec, [&](auto in, auto out, auto vec) {
    return launch_rows<decltype(in)::value, decltype(out)::value, decltype(vec)::value>(p, l, stream);
  });
}

namespace {

template <QuantIn kIn, bool kVec>
cudaError_t launch_amax(const AmaxParams& p, const QuantizeGridLaunch& l, cudaStream_t stream) {
  quantize::amax_kernel<kIn, kVec><<<dim3(unsigned(l.blocks)), dim3(kRowsBlockThreads), 0, stream>>>(p);
  return cudaGetLastError();
}

template <QuantIn kIn>
cudaError_t launch_amax_vec(const AmaxParams& p, const QuantizeGridLaunch& l, cudaStream_t stream) {
  return l.vec ? launch_amax<kIn, true>(p, l, stream) : launch_amax<kIn, false>(p, l, stream);
}

bool amax_params_valid(const AmaxParams& p) {
  return p.rows >= 0 && p.cols >= 0 && p.x_row_stride >= 0 && p.x_ptr != nullptr && p.amax_ptr != nullptr &&
         int32_t(p.in_type) >= 0 && int32_t(p.in_type) <= 2;
}

}  // namespace

cudaError_t quantize_amax_plan(const AmaxParams& p, QuantizeGridLaunch* plan) {
  *plan = QuantizeGridLaunch{false, 0};
  if (!amax_params_valid(p)) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  // One thread a 16-element step of x, grid-stride past 16 full-occupancy waves.
  const int64_t steps = (p.cols + kStep - 1) / kStep * p.rows;
  int64_t grid = 0;
  ASTRAI_CUDA_TRY(quantize_detail::grid_for((steps + kRowsBlockThreads - 1) / kRowsBlockThreads,
                                            kRowsBlockThreads, p.max_blocks, &grid));
  *plan = QuantizeGridLaunch{vec_rows(p.x_ptr, p.x_row_stride, p.cols, p.in_type), grid};
  return cudaSuccess;
}

cudaError_t quantize_amax_launch(const AmaxParams& p, const QuantizeGridLaunch& l, cudaStream_t stream) {
  if (!amax_params_valid(p)) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (l.blocks < 1 || l.blocks > INT32_MAX || (l.vec && !vec_rows(p.x_ptr, p.x_row_stride, p.cols, p.in_type))) {
    return cudaErrorInvalidValue;
  }
  switch (p.in_type) {
    case QuantIn::kBF16: return launch_amax_vec<QuantIn::kBF16>(p, l, stream);
    case QuantIn::kF16: return launch_amax_vec<QuantIn::kF16>(p, l, stream);
    case QuantIn::kF32: return launch_amax_vec<QuantIn::kF32>(p, l, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t amax_history_fold_launch(const AmaxHistoryParams& p, cudaStream_t stream) {
  if (p.ring_ptr == nullptr || p.pos_ptr == nullptr || p.amax_ptr == nullptr || p.scale_ptr == nullptr ||
      p.len < 1 || p.margin < 0 || !(p.qmax > 0.0f)) {
    return cudaErrorInvalidValue;
  }
  quantize::amax_history_fold_kernel<><<<dim3(1), dim3(quantize::kFoldThreads), 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace astrai
