// The L2-prefetch experiment's launcher (l2_prefetch.cu): its own header, so the GEMM kernels do not depend on it.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace astrai {

// Asks the L2 to fetch `run` bytes at the start of every `period` bytes of [data, data + bytes) (run == period: all
// of it), clipped inward to 16-byte boundaries; returns once the requests are issued. run and period are multiples
// of 16 with 0 <= run <= period (else cudaErrorInvalidValue); nothing to fetch is a no-op.
constexpr int64_t kL2PrefetchPiece = 4096;  // bytes a request at most
cudaError_t gemm_l2_prefetch_launch(const void* data, int64_t bytes, int64_t run, int64_t period,
                                    cudaStream_t stream);

}  // namespace astrai
