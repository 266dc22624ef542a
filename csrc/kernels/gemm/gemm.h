// The GEMM family's launcher interface: what the binding may ask before a launch, and the launch of a given plan.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "kernels/gemm/params.h"

namespace astrai {

// Tile recipes by the id the planner passes (docs/contracts.md, GEMM ops): 0-3 the portable mma.sync mainloop, 4
// and 5 the Hopper wgmma + TMA mainloop (sm_90 GPUs with sm_90a code in the image, layout nt, every pair but w8a16),
// 6 the Hopper weight stream (same devices and layout, every pair; small M), 7, 8 and 9 Hopper w8a16 on wgmma (same
// devices and layout, w8a16 only; 128 weight rows x 128, 256 or 64 tokens), 10 the Hopper mainloop's 128 x 192 tile
// (same devices and layout, every pair but w8a16; fp8's widest tile, whose promoted accumulators fit), 11 Hopper w8a16
// with 192 tokens (as 7-9).
constexpr int kGemmRecipes = 12;
constexpr int kGemmFirstSm90Recipe = 4;
constexpr int kGemmSm90StreamRecipe = 6;
constexpr int kGemmSm90W8a16Recipe = 7;
constexpr int kGemmSm90W8a16WideRecipe = 8;
constexpr int kGemmSm90W8a16NarrowRecipe = 9;
constexpr int kGemmSm90N192Recipe = 10;
constexpr int kGemmSm90W8a16Tokens192Recipe = 11;
// The Hopper mainloop (sm90_gemm.cuh): 128 x 128, 128 x 256 (not fp8) and 128 x 192 tiles; split_k 0 runs on these.
constexpr bool gemm_is_sm90_mainloop(int recipe) {
  return recipe == kGemmFirstSm90Recipe || recipe == kGemmFirstSm90Recipe + 1 || recipe == kGemmSm90N192Recipe;
}
constexpr bool gemm_is_sm90_w8a16(int recipe) {
  return recipe == kGemmSm90W8a16Recipe || recipe == kGemmSm90W8a16WideRecipe || recipe == kGemmSm90W8a16NarrowRecipe ||
         recipe == kGemmSm90W8a16Tokens192Recipe;
}
// Recipe 6 runs its K slices as the CTAs of one cluster: at most the portable cluster size.
constexpr int kGemmSm90StreamMaxSplit = 8;
// Recipe 6's grid x: its blocks of 64 weight rows x its blocks of 16 token rows (one block at M <= 8) x split_k, in
// one grid row (sm90_stream.cuh's order), which may hold at most kGemmMaxGridX CTAs.
constexpr int64_t kGemmMaxGridX = 2147483647;
constexpr int64_t gemm_sm90_stream_grid_x(int64_t m, int64_t n, int64_t split_k) {
  return (n + 63) / 64 * ((m + 15) / 16) * split_k;
}

// The CTA tile of a recipe (rows of a, columns of b) and the K tile in elements for a pair.
int gemm_recipe_tile_m(int recipe);
int gemm_recipe_tile_n(int recipe);
int gemm_k_tile(GemmPair pair);

// The op's limits on a plan: split_k (0 only on recipes 4, 5 and 7-11) and the grid's y / z extents.
constexpr int64_t kGemmMaxSplitK = 64;
constexpr int64_t kGemmMaxGridYZ = 65535;

// A device as a plan's feasibility depends on it, so that a planner can ask about devices other than the current one.
struct GemmTarget {
  int cc;             // compute capability: major * 10 + minor
  bool sm90_code;     // this image holds sm_90a code for it (recipes 4-11)
  int fp8_code_arch;  // the arch of this image's fp8 code for it (SASS, or the PTX JIT-compiled); -1: none
};

// Null when this image can run (pair, layout, recipe) on `target`, else why not (static text).
const char* gemm_unsupported_on(GemmPair pair, GemmLayout layout, int recipe, const GemmTarget& target);

// Null when this image can run (pair, layout, recipe) on the current device, else why not (static text).
const char* gemm_unsupported(GemmPair pair, GemmLayout layout, int recipe);

// Empty when recipe and split_k are in range and the grid fits for a problem of batch x m x n (its rows tile n where
// the layout runs swapped), else why not: the op's message (after "astrai.quant_gemm: ").
std::string gemm_plan_unfit(GemmPair pair, GemmLayout layout, int64_t recipe, int64_t split_k, int64_t m, int64_t n,
                            int64_t batch);

// True when (pair, layout) runs as the "nn" kernel of the swapped pair on (b, a), storing y^T (layout tt of every
// pair whose (b, a) pair exists: all but w8a16). The CTA grid's rows then tile N, its columns M.
bool gemm_swaps_operands(GemmPair pair, GemmLayout layout);

// Bytes of fp32 / s32 workspace the launch of (pair, recipe) with p.split_k needs for its partials (0 where the
// kernel sums every split itself: split_k == 1, and w8a16's weight stream up to kGemmStreamMaxWarpsK splits).
int64_t gemm_workspace_bytes(const GemmParams& p, GemmPair pair, int recipe);

// split_k = 0 on recipes 4, 5 and 10 ("the last wave split"; also on the w8a16 recipes 7-9 and 11, a CTA a unit):
// the grid runs the first `tail_from` tiles (whole waves of num_sms) whole and each of the `tail_tiles` left as
// `split` K slices of `k_tiles_per_split` K tiles (no slice empty), so the last wave fills the GPU; split 1 (nothing
// to split) runs every tile whole. The slices' partials go to a [tail_tiles][split][tile_m][tile_n] workspace, summed
// in slice order by a second kernel.
struct GemmTailPlan {
  int32_t tail_from, tail_tiles, split, k_tiles_per_split;
};
constexpr int kGemmTailMaxSplit = 16;
constexpr int kGemmTailMinKTiles = 8;  // K tiles a slice at least
GemmTailPlan gemm_sm90_tail_plan(const GemmParams& p, int tile_m, int tile_n, int k_tile, int num_sms);

// w8a16's recipe 2 in layout nt (the weight-stream kernel) runs up to this many K splits as the warps of one CTA,
// summed in split order inside it; a larger split_k adds CTAs along K and a reduction of their partials.
constexpr int kGemmStreamMaxWarpsK = 24;

// Whether the GEMM kernels may launch as programmatic dependents where the image's code allows it (on by default).
// The policy sets it (quant_gemm_set_pdl); no launcher reads the environment.
void gemm_set_pdl_allowed(bool allowed);
bool gemm_pdl_allowed();

// Launches the plan (pair, recipe, p.split_k) for params already checked by the binding, in layout p.layout (with
// p.transpose_out = 0: the launcher sets it where it swaps); p.workspace as above.
cudaError_t gemm_launch(GemmParams p, GemmPair pair, int recipe, cudaStream_t stream);

}  // namespace astrai
