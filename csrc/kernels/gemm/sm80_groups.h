// The mainloops' instantiation units, one per pair group (gemm_sm80_<group>.cu, gemm_sm90_<group>.cu), as
// gemm_launch.cu calls them. Each returns cudaErrorInvalidValue for a pair or recipe it does not hold.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/gemm/params.h"

namespace astrai {
namespace gemm {

cudaError_t sm80_launch_w16a16(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_w8a16(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_w8a8(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_fp8(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
// The other layouts (gemm_sm80_<group>_<layout>.cu). tt runs natively for w8a16 only: every other pair's tt is its
// swapped pair's nn (gemm_launch.cu).
cudaError_t sm80_launch_w16a16_nn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_w16a16_tn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_w8a16_nn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_w8a16_tn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_w8a16_tt(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_w8a8_nn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_w8a8_tn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_fp8_nn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm80_launch_fp8_tn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
// The Hopper mainloop's units (gemm_sm90_<group>.cu): recipes 4 and 5 (fp8: 4 and 10) in layout nt;
// cudaErrorNotSupported where the TMA cannot describe an operand (gemm_launch then runs the call on the portable
// mainloop).
cudaError_t sm90_launch_16bit(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm90_launch_fp8(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
cudaError_t sm90_launch_s8(const GemmParams& p, int recipe, cudaStream_t stream);
// The Hopper weight stream (gemm_sm90_stream.cu): recipe 6 in layout nt, every pair, split_k <= 8 (one cluster);
// cudaErrorNotSupported where the TMA cannot describe an operand.
cudaError_t sm90_launch_stream(const GemmParams& p, GemmPair pair, cudaStream_t stream);
// Hopper W8A16 (gemm_sm90_w8a16.cu): recipe 7, 8, 9 or 11 in layout nt, w8a16 pairs; cudaErrorNotSupported where the TMA
// cannot describe an operand.
cudaError_t sm90_launch_w8a16(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream);
// Whether this image holds sm_90a code for the current device (false on other GPUs and for PTX-only images).
cudaError_t sm90_code_available(bool* available);
// The PTX arch (ptxVersion) of the fp8 code this image runs on the current device: < 89 has no fp8 mma.
cudaError_t sm80_fp8_code_arch(int* ptx_version);

}  // namespace gemm
}  // namespace astrai
