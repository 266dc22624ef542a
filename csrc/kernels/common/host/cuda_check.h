// Status propagation for launchers: return the first failing CUDA runtime status, never throw.
#pragma once

#include <cuda_runtime_api.h>

#define ASTRAI_CUDA_TRY(expr)                     \
  do {                                            \
    const cudaError_t astrai_status_ = (expr);    \
    if (astrai_status_ != cudaSuccess) {          \
      return astrai_status_;                      \
    }                                             \
  } while (0)
