// Instantiation unit: Hopper W8A16 (sm90_w8a16.cuh), recipes 7, 8, 9 and 11, bf16 and fp16 activations.
#include <atomic>

#include <cuda_runtime.h>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/sm80_groups.h"
#include "kernels/gemm/sm90_gemm_launch.cuh"
#include "kernels/gemm/sm90_w8a16.cuh"

namespace astrai {
namespace gemm {
namespace {

template <bool kF16, class S>
cudaError_t launch_w8a16(const GemmParams& p, cudaStream_t stream) {
  CUtensorMap map_w, map_x;
  if (!sm90_k_major_map(&map_w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.b, p.n, p.k, p.b_row_stride, p.batch,
                        p.b_batch_stride, S::kRows, S::kBK) ||
      !sm90_k_major_map(&map_x, kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.a, p.m,
                        p.k, p.a_row_stride, p.batch, p.a_batch_stride, S::kTokens))
    return cudaErrorNotSupported;
  auto* kernel = &gemm_sm90_w8a16_kernel<kF16, S>;
  static std::atomic<uint64_t> smem_set{0};
  ASTRAI_CUDA_TRY(allow_smem(kernel, S::kSmemBytes, smem_set));
  const int64_t tiles = int64_t(ceil_div(p.n, S::kRows)) * ceil_div(p.m, S::kTokens);
  if (tiles * p.batch > 0x7fffffff) return cudaErrorNotSupported;
  GemmParams q = p;
  dim3 grid(unsigned(tiles), 1, unsigned(p.batch * p.split_k));
  if (p.split_k == 0) {  // the last wave split (gemm.h), planned for this device's SMs as recipes 4, 5 and 10 do
    DeviceFacts facts{};
    ASTRAI_CUDA_TRY(current_device_facts(&facts));
    const GemmTailPlan t = gemm_sm90_tail_plan(p, S::kTokens, S::kRows, 128, facts.sm_count);
    q.split_k = 1;
    q.k_tiles_per_split = t.k_tiles_per_split;
    q.tail_from = t.tail_from;
    q.tail_split = t.split > 1 ? t.split : 0;
    if (q.tail_split > 1) grid = dim3(unsigned(int64_t(t.tail_from) + int64_t(t.tail_tiles) * t.split), 1, 1);
    else grid.z = unsigned(p.batch);
  }
  // A programmatic dependent except with the last wave split (as the Hopper mainloop).
  static PdlCodeCache known;
  bool pdl = false;
  if (q.tail_split <= 1) ASTRAI_CUDA_TRY(gemm_pdl(kernel, known, &pdl));
  ASTRAI_CUDA_TRY(launch_maybe_dependent(kernel, grid, dim3(S::kThreads), S::kSmemBytes, stream, pdl, map_w, map_x, q));
  if (q.tail_split > 1) {  // the tail tiles' slices, added in order, then the epilogue
    using T = Sm90W8a16TailTile<S>;
    constexpr int kBlocksPerTile = T::kBM * T::kBN / (4 * kTailReduceThreads);
    auto* reduce = &gemm_sm90_tail_reduce_kernel<float, T>;
    static PdlCodeCache known_reduce;
    ASTRAI_CUDA_TRY(gemm_pdl(reduce, known_reduce, &pdl));
    return launch_maybe_dependent(reduce, dim3(unsigned(tiles * p.batch - q.tail_from), kBlocksPerTile),
                                  dim3(kTailReduceThreads), 0, stream, pdl, q);
  }
  if (q.split_k > 1) return launch_split_reduce<float>(q, stream);
  return cudaSuccess;
}

template <class S>
cudaError_t launch_shape(const GemmParams& p, GemmPair pair, cudaStream_t stream) {
  return pair == GemmPair::kF16S8 ? launch_w8a16<true, S>(p, stream) : launch_w8a16<false, S>(p, stream);
}

}  // namespace

cudaError_t sm90_launch_w8a16(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  // p.k_tiles_per_split counts gemm_launch's K tiles of 128 for an int8 b; the kernel converts to its own.
  switch (recipe) {
    case kGemmSm90W8a16WideRecipe: return launch_shape<Sm90W8a16Tokens256>(p, pair, stream);
    case kGemmSm90W8a16NarrowRecipe: return launch_shape<Sm90W8a16Tokens64>(p, pair, stream);
    case kGemmSm90W8a16Tokens192Recipe: return launch_shape<Sm90W8a16Tokens192>(p, pair, stream);
    default: return launch_shape<Sm90W8a16Tokens128>(p, pair, stream);
  }
}

}  // namespace gemm
}  // namespace astrai
