// The GEMM family's launcher interface: what the binding may ask before a launch, and the launch of a given plan.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/gemm/params.h"

namespace astrai {

// Tile recipes of the portable mma.sync mainloop, by the id the planner passes (docs/contracts.md, GEMM ops).
constexpr int kGemmRecipes = 3;

// The CTA tile of a recipe (rows of a, columns of b) and the K tile in elements for a pair.
int gemm_recipe_tile_m(int recipe);
int gemm_recipe_tile_n(int recipe);
int gemm_k_tile(GemmPair pair);

// Null when this image can run (pair, layout, recipe) on the current device, else why not (static text).
const char* gemm_unsupported(GemmPair pair, GemmLayout layout, int recipe);

// True when (pair, layout) runs as the "nn" kernel of the swapped pair on (b, a), storing y^T (layout tt of every
// pair whose (b, a) pair exists: all but w8a16). The CTA grid's rows then tile N, its columns M.
bool gemm_swaps_operands(GemmPair pair, GemmLayout layout);

// Bytes of fp32 / s32 workspace a launch with p.split_k > 1 needs (0 for split_k == 1).
int64_t gemm_workspace_bytes(const GemmParams& p);

// Launches the plan (pair, recipe, p.split_k) for params already checked by the binding, in layout p.layout (with
// p.transpose_out = 0: the launcher sets it where it swaps); p.workspace as above.
cudaError_t gemm_launch(GemmParams p, GemmPair pair, int recipe, cudaStream_t stream);

}  // namespace astrai
