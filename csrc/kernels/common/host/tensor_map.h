// CUtensorMap encoding (TMA descriptors) through the runtime's driver entry point: the image links no driver library.
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap and its enums (types only)
#include <cuda_runtime_api.h>

namespace astrai {

using TensorMapEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                          const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                          CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                          CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled of the driver, null if it has none. Looked up once per process.
inline TensorMapEncodeTiled tensor_map_encoder() {
  static const TensorMapEncodeTiled encoder = []() -> TensorMapEncodeTiled {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // clear a failed lookup's error
      return nullptr;
    }
    return reinterpret_cast<TensorMapEncodeTiled>(fn);
  }();
  return encoder;
}

// A tiled map of a rank-`rank` tensor (dims innermost first; byte_strides of dims 1..rank-1) in boxes of `box`
// elements, every element stride 1, zeros for a box's part outside the tensor. False without an encoder, or where
// TMA cannot describe the tensor (a base address or a stride not a multiple of 16 bytes, a stride of 2^40 bytes or
// more, a zero dimension; the encoder checks the rest).
inline bool encode_tensor_map_tiled(CUtensorMap* map, CUtensorMapDataType type, int rank, const void* ptr,
                                    const uint64_t* dims, const int64_t* byte_strides, const uint32_t* box,
                                    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion) {
  constexpr int kMaxRank = 5;
  const TensorMapEncodeTiled encode = tensor_map_encoder();
  if (encode == nullptr || rank < 1 || rank > kMaxRank || reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  cuuint64_t dims_[kMaxRank], strides_[kMaxRank - 1];
  cuuint32_t box_[kMaxRank], element_strides[kMaxRank];
  for (int d = 0; d < rank; ++d) {
    if (dims[d] == 0) return false;
    dims_[d] = cuuint64_t(dims[d]);
    box_[d] = cuuint32_t(box[d]);
    element_strides[d] = 1;
  }
  for (int d = 0; d + 1 < rank; ++d) {
    const int64_t stride = byte_strides[d];
    if (stride <= 0 || stride % 16 != 0 || stride >= (int64_t(1) << 40)) return false;
    strides_[d] = cuuint64_t(stride);
  }
  return encode(map, type, cuuint32_t(rank), const_cast<void*>(ptr), dims_, strides_, box_, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, l2_promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace astrai
