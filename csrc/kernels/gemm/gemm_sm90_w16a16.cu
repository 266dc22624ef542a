// Instantiation unit (issue 20, first cut): the sm_90a w16a16 mainloop (sm90_gemm.cuh) for bf16 x bf16 in layout nt,
// one batch. Experimental: gemm_launch.cu routes to it only with ASTRAI_GEMM_SM90=1 on a device and image that can
// run it; not yet run on a GPU.
#include <atomic>

#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/common/host/tensor_map.h"
#include "kernels/gemm/sm80_gemm_launch.cuh"
#include "kernels/gemm/sm90_gemm.cuh"

namespace astrai {
namespace gemm {

// The kernel's maps: [rows][k] bf16, boxes of 64 (k) x 128 (rows), 128-byte swizzle, zeros past the edges.
static bool k_major_map(CUtensorMap* map, const void* base, int rows, int k, int64_t row_stride) {
  const uint64_t dims[2] = {uint64_t(k), uint64_t(rows)};
  // One row: the op leaves its stride 0 (unread); any multiple of 16 bytes describes it.
  const int64_t strides[1] = {rows > 1 ? row_stride * 2 : (int64_t(k) * 2 + 15) / 16 * 16};
  const uint32_t box[2] = {uint32_t(Sm90Recipe::kBK), uint32_t(Sm90Recipe::kBM)};
  return encode_tensor_map_tiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

// cudaErrorNotSupported where this cannot run the call (device not sm_90, no sm_90a code in the image, batch > 1,
// K = 0, maps the TMA cannot describe): the caller then runs the portable mainloop.
cudaError_t sm90_launch_w16a16(const GemmParams& p, cudaStream_t stream) {
  using R = Sm90Recipe;
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  if (facts.cc_major != 9 || p.batch != 1 || p.k == 0 || p.split_k != 1) return cudaErrorNotSupported;
  auto* kernel = &gemm_sm90_w16a16_kernel<R>;
  cudaFuncAttributes attr{};
  ASTRAI_CUDA_TRY(cudaFuncGetAttributes(&attr, kernel));
  if (attr.ptxVersion < 90 || attr.binaryVersion < 90) return cudaErrorNotSupported;
  CUtensorMap map_a, map_b;
  if (!k_major_map(&map_a, p.a, p.m, p.k, p.a_row_stride) || !k_major_map(&map_b, p.b, p.n, p.k, p.b_row_stride))
    return cudaErrorNotSupported;
  static std::atomic<uint64_t> smem_set{0};
  ASTRAI_CUDA_TRY(allow_smem(kernel, R::kSmemBytes, smem_set));
  const dim3 grid(unsigned(ceil_div(p.n, R::kBN)), unsigned(ceil_div(p.m, R::kBM)));
  kernel<<<grid, R::kThreads, R::kSmemBytes, stream>>>(map_a, map_b, p);
  return cudaGetLastError();
}

}  // namespace gemm
}  // namespace astrai
