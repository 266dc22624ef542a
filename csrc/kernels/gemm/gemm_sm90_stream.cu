// Instantiation unit: the Hopper weight stream (sm90_stream.cuh), recipe 6, every pair, one and two token tiles.
#include <atomic>

#include <cuda_runtime.h>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/sm80_groups.h"
#include "kernels/gemm/sm90_gemm_launch.cuh"
#include "kernels/gemm/sm90_stream.cuh"

namespace astrai {
namespace gemm {
namespace {

template <class T>
constexpr CUtensorMapDataType stream_map_type() {
  return std::is_same<T, __nv_bfloat16>::value ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
         : std::is_same<T, __half>::value      ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                               : CU_TENSOR_MAP_DATA_TYPE_UINT8;
}

template <class Pair, int kTokenTiles>
cudaError_t launch_tiles(const GemmParams& p, cudaStream_t stream) {
  using S = Sm90StreamShape<Pair, kTokenTiles>;
  // One token tile runs M <= 8 only (launch_pair_stream): one block of tokens either way.
  static_assert(S::kRows == 64 && (kTokenTiles == 1 || S::kTokens == 16),
                "gemm_sm90_stream_grid_x counts blocks of 64 weight rows and 16 token rows");
  CUtensorMap map_w, map_x;
  if (!sm90_k_major_map(&map_w, stream_map_type<typename Pair::TB>(), Pair::kBBytes, p.b, p.n, p.k, p.b_row_stride,
                        p.batch, p.b_batch_stride, S::kRows) ||
      !sm90_k_major_map(&map_x, stream_map_type<typename Pair::TA>(), Pair::kABytes, p.a, p.m, p.k, p.a_row_stride,
                        p.batch, p.a_batch_stride, S::kTokens))
    return cudaErrorNotSupported;
  auto* kernel = &gemm_sm90_stream_kernel<Pair, kTokenTiles>;
  static std::atomic<uint64_t> smem_set{0};
  ASTRAI_CUDA_TRY(allow_smem(kernel, S::kSmemBytes, smem_set));
  cudaLaunchConfig_t config = {};
  // gemm_plan_unfit keeps x within 2^31 - 1 (gemm_sm90_stream_grid_x).
  config.gridDim = dim3(unsigned(gemm_sm90_stream_grid_x(p.m, p.n, p.split_k)), 1u, unsigned(p.batch));
  config.blockDim = dim3(S::kThreads);
  config.dynamicSmemBytes = S::kSmemBytes;
  config.stream = stream;
  // A programmatic dependent only while the grid is at most one CTA a SM: a larger grid (several CTAs a SM) let
  // in early was placed around the previous call's CTAs, unevenly, and ran 14-36% slower (H200, N = 14336: 224 CTAs).
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  static PdlCodeCache known;
  bool pdl = false;
  const int64_t ctas = int64_t(config.gridDim.x) * config.gridDim.y * config.gridDim.z;
  if (ctas <= facts.sm_count) ASTRAI_CUDA_TRY(gemm_pdl(kernel, known, &pdl));
  cudaLaunchAttribute attr[2];
  unsigned n_attr = 0;
  if (p.split_k > 1) {  // one slice: no cluster (the kernel reads no peer)
    attr[n_attr].id = cudaLaunchAttributeClusterDimension;
    attr[n_attr].val.clusterDim.x = unsigned(p.split_k);
    attr[n_attr].val.clusterDim.y = 1;
    attr[n_attr].val.clusterDim.z = 1;
    ++n_attr;
  }
  if (pdl) {  // a programmatic dependent of the previous kernel (gemm_pdl)
    attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n_attr].val.programmaticStreamSerializationAllowed = 1;
    ++n_attr;
  }
  config.attrs = attr;
  config.numAttrs = n_attr;
  ASTRAI_CUDA_TRY(cudaLaunchKernelEx(&config, kernel, map_w, map_x, p));
  return cudaGetLastError();
}

template <class Pair>
cudaError_t launch_pair_stream(const GemmParams& p, cudaStream_t stream) {
  return p.m <= 8 ? launch_tiles<Pair, 1>(p, stream) : launch_tiles<Pair, 2>(p, stream);
}

}  // namespace

cudaError_t sm90_launch_stream(const GemmParams& p, GemmPair pair, cudaStream_t stream) {
  if (p.split_k < 1 || p.split_k > kGemmSm90StreamMaxSplit) return cudaErrorInvalidValue;
  switch (pair) {
    case GemmPair::kBf16Bf16: return launch_pair_stream<PairBf16Bf16>(p, stream);
    case GemmPair::kF16F16: return launch_pair_stream<PairF16F16>(p, stream);
    case GemmPair::kBf16S8: return launch_pair_stream<PairBf16S8>(p, stream);
    case GemmPair::kF16S8: return launch_pair_stream<PairF16S8>(p, stream);
    case GemmPair::kS8S8: return launch_pair_stream<PairS8S8>(p, stream);
    case GemmPair::kE4m3E4m3: return launch_pair_stream<PairE4m3E4m3>(p, stream);
    case GemmPair::kE5m2E4m3: return launch_pair_stream<PairE5m2E4m3>(p, stream);
    case GemmPair::kE4m3E5m2: return launch_pair_stream<PairE4m3E5m2>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace gemm
}  // namespace astrai
