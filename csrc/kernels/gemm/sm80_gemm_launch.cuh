// Host side of the portable mainloop: the launch of one (pair, recipe, operand majors) and of the split-K reduction.
// Each gemm_sm80_<group>[_<layout>].cu instantiates it for its pairs, so the translation units compile in parallel.
#pragma once

#include <algorithm>
#include <atomic>

#include <cuda_runtime_api.h>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/pdl_launch.h"
#include "kernels/common/host/smem_optin.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/sm80_gemm.cuh"
#include "kernels/gemm/sm80_gemm_majors.cuh"

namespace astrai {
namespace gemm {

// kAMn / kBMn: a / b MN-major (sm80_gemm_majors.cuh); both false is the nt kernel.
template <class Pair, class R, bool kAMn, bool kBMn>
constexpr auto kernel_for() {
  if constexpr (kAMn || kBMn) {
    return &gemm_sm80_majors_kernel<Pair, R, kAMn, kBMn>;
  } else {
    return &gemm_sm80_kernel<Pair, R>;
  }
}

// Whether a GEMM kernel goes as a programmatic dependent of the stream's previous kernel (its launch and start
// overlap that kernel's tail; every GEMM kernel and reduction here waits with griddepcontrol.wait before any global
// access, and lets its own dependents in once past its mainloop). Launchers that measured a loss with it do not
// ask: recipe 6 above one CTA a SM, recipes 4 / 5 with the last wave split.
// The policy's switch (gemm_pdl_allowed: quant_gemm_set_pdl from Python, seeded by ASTRAI_GEMM_PDL=0 there, read
// once) off says never; otherwise only where this image's code for
// the current device is sm_90+ (ptxVersion >= 90: the kernel then holds the wait; a compute_80 PTX image
// JIT-compiled for an H200 does not). `known` caches the image's answer per device (fixed for the process): one a
// kernel.
template <class Kernel>
cudaError_t gemm_pdl(Kernel kernel, PdlCodeCache& known, bool* pdl) {
  *pdl = false;
  if (!gemm_pdl_allowed()) return cudaSuccess;
  return code_waits_for_grid(kernel, known, pdl);
}

// The split-K reduction of a kernel's partials, for params in the output's orientation, launched right after
// that kernel on `stream`.
template <class Acc>
cudaError_t launch_split_reduce(const GemmParams& r, cudaStream_t stream) {
  static PdlCodeCache known;
  bool pdl = false;
  ASTRAI_CUDA_TRY(gemm_pdl(gemm_reduce_kernel<Acc>, known, &pdl));
  if (r.m <= 0 || r.n <= 0 || r.batch <= 0) return cudaSuccess;
  const dim3 grid(unsigned(ceil_div(ceil_div(r.n, 4), kReduceCols)),
                  unsigned(std::min(ceil_div(r.m, kReduceRows), 65535)), unsigned(std::min(r.batch, 65535)));
  return launch_maybe_dependent(gemm_reduce_kernel<Acc>, grid, dim3(kReduceCols, kReduceRows), 0, stream, pdl, r);
}

template <class Pair, class R, bool kAMn = false, bool kBMn = false>
cudaError_t launch_recipe(const GemmParams& p, cudaStream_t stream) {
  using S = Shape<Pair, R>;
  static std::atomic<uint64_t> smem_set{0};
  auto* kernel = kernel_for<Pair, R, kAMn, kBMn>();
  ASTRAI_CUDA_TRY(allow_smem(kernel, S::kSmemBytes, smem_set));
  static PdlCodeCache known;
  bool pdl = false;
  ASTRAI_CUDA_TRY(gemm_pdl(kernel, known, &pdl));
  const dim3 grid(unsigned(ceil_div(p.n, R::kBN)), unsigned(ceil_div(p.m, R::kBM)), unsigned(p.batch * p.split_k));
  ASTRAI_CUDA_TRY(launch_maybe_dependent(kernel, grid, dim3(R::kThreads), S::kSmemBytes, stream, pdl, p));
  if (p.split_k > 1) {
    GemmParams r = p;  // a transposed kernel left its partials in the output's orientation: reduce in that one
    if (p.transpose_out) {
      r.m = p.n;
      r.n = p.m;
    }
    return launch_split_reduce<typename Pair::Acc>(r, stream);
  }
  return cudaSuccess;
}

template <class Pair, bool kAMn = false, bool kBMn = false>
cudaError_t launch_pair(const GemmParams& p, int recipe, cudaStream_t stream) {
  switch (recipe) {
    case 0: return launch_recipe<Pair, RecipeM128N128, kAMn, kBMn>(p, stream);
    case 1: return launch_recipe<Pair, RecipeM64N128, kAMn, kBMn>(p, stream);
    case 2: return launch_recipe<Pair, RecipeM16N64, kAMn, kBMn>(p, stream);
    case 3: return launch_recipe<Pair, RecipeM128N64, kAMn, kBMn>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

// ptxVersion of the code this image runs for (Pair, recipe 0) on the current device (80 for the compute_80 PTX), asked
// once per device (the fp8 policy asks at every call of a portable recipe).
template <class Pair>
cudaError_t code_arch(int* ptx_version) {
  static PdlCodeCache known;
  return code_ptx_version(&gemm_sm80_kernel<Pair, RecipeM128N128>, known, ptx_version);
}

}  // namespace gemm
}  // namespace astrai
