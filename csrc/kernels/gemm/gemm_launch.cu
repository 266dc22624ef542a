// The GEMM family's launcher: recipe facts, what this image cannot run, and the launch of a given plan.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <sstream>
#include <string>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/sm80_gemm.cuh"
#include "kernels/gemm/sm80_groups.h"

namespace astrai {

namespace {
// In recipe-id order, as gemm::launch_pair (sm80_gemm_launch.cuh) maps the ids to types.
// Recipes 4 and 5 are the Hopper mainloop's 128 x 128 and 128 x 256 tiles (sm90_gemm.cuh's Sm90Recipe); recipe 6 the
// Hopper weight stream's blocks of 16 token rows x 64 weight rows (sm90_stream.cuh's Sm90StreamShape); recipes 7, 8
// and 9 Hopper w8a16's 128, 256 or 64 token rows x 128 weight rows (sm90_w8a16.cuh's Sm90W8a16Shape); recipe 10 the
// Hopper mainloop's 128 x 192 tile; recipe 11 Hopper w8a16's 192 token rows.
constexpr int kTileM[kGemmRecipes] = {gemm::RecipeM128N128::kBM, gemm::RecipeM64N128::kBM, gemm::RecipeM16N64::kBM,
                                      gemm::RecipeM128N64::kBM, 128, 128, 16, 128, 256, 64, 128, 192};
constexpr int kTileN[kGemmRecipes] = {gemm::RecipeM128N128::kBN, gemm::RecipeM64N128::kBN, gemm::RecipeM16N64::kBN,
                                      gemm::RecipeM128N64::kBN, 128, 256, 64, 128, 128, 128, 192, 128};

// Why `t` cannot run the sm_90a kernels (null when it can): `not_cc90` off a compute capability 9.0 GPU, `no_code`
// where the image holds no sm_90a code for it (a PTX-only image).
const char* sm90_unsupported(const GemmTarget& t, const char* not_cc90, const char* no_code) {
  if (t.cc != 90) return not_cc90;
  return t.sm90_code ? nullptr : no_code;
}

bool is_fp8(GemmPair pair) {
  return pair == GemmPair::kE4m3E4m3 || pair == GemmPair::kE5m2E4m3 || pair == GemmPair::kE4m3E5m2;
}
}  // namespace

namespace {
std::atomic<bool> g_pdl_allowed{true};
}  // namespace

void gemm_set_pdl_allowed(bool allowed) { g_pdl_allowed.store(allowed, std::memory_order_relaxed); }
bool gemm_pdl_allowed() { return g_pdl_allowed.load(std::memory_order_relaxed); }

int gemm_recipe_tile_m(int recipe) { return recipe >= 0 && recipe < kGemmRecipes ? kTileM[recipe] : 0; }
int gemm_recipe_tile_n(int recipe) { return recipe >= 0 && recipe < kGemmRecipes ? kTileN[recipe] : 0; }

int gemm_k_tile(GemmPair pair) {
  // The kernel's own K tile (128 bytes of a b row): 16-bit b for w16a16, 8-bit b for every other pair.
  static_assert(gemm::PairBf16Bf16::kKTile == gemm::PairF16F16::kKTile, "one K tile per b width");
  static_assert(gemm::PairBf16S8::kKTile == gemm::PairS8S8::kKTile &&
                    gemm::PairS8S8::kKTile == gemm::PairE4m3E4m3::kKTile,
                "one K tile per b width");
  return pair == GemmPair::kBf16Bf16 || pair == GemmPair::kF16F16 ? gemm::PairBf16Bf16::kKTile : gemm::PairS8S8::kKTile;
}

const char* gemm_unsupported_on(GemmPair pair, GemmLayout layout, int recipe, const GemmTarget& t) {
  if (recipe < 0 || recipe >= kGemmRecipes) return "recipe must be 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 or 11";
  if (int(layout) < 0 || int(layout) > 3) return "layout must be 0 (nt), 1 (nn), 2 (tn) or 3 (tt)";
  if (gemm_is_sm90_w8a16(recipe)) {
    if (layout != GemmLayout::kNT) return "recipes 7-9 and 11 (the sm_90a w8a16 kernels) run layout nt only";
    if (pair != GemmPair::kBf16S8 && pair != GemmPair::kF16S8) return "recipes 7-9 and 11 run w8a16 only";
    return sm90_unsupported(t,
                            "recipes 7-9 and 11 (the sm_90a w8a16 kernels) need a compute capability 9.0 GPU "
                            "(H100 / H200)",
                            "this image has no sm_90a code for this GPU (recipes 7-9 and 11 need it): use recipes 0-3");
  }
  if (recipe == kGemmSm90StreamRecipe) {
    if (layout != GemmLayout::kNT) return "recipe 6 (the sm_90a weight stream) runs layout nt only";
    return sm90_unsupported(t, "recipe 6 (the sm_90a weight stream) needs a compute capability 9.0 GPU (H100 / H200)",
                            "this image has no sm_90a code for this GPU (recipe 6 needs it): use recipe 2");
  }
  if (recipe == kGemmSm90N192Recipe) {
    if (layout != GemmLayout::kNT) return "recipe 10 (the sm_90a 128 x 192 tile) runs layout nt only";
    if (pair == GemmPair::kBf16S8 || pair == GemmPair::kF16S8)
      return "recipe 10 (the sm_90a 128 x 192 tile) has no w8a16 kernel: use recipes 7-9 and 11";
    return sm90_unsupported(t, "recipe 10 (the sm_90a 128 x 192 tile) needs a compute capability 9.0 GPU (H100 / H200)",
                            "this image has no sm_90a code for this GPU (recipe 10 needs it): use recipes 0-3");
  }
  if (recipe >= kGemmFirstSm90Recipe) {
    if (layout != GemmLayout::kNT) return "recipes 4 and 5 (the sm_90a wgmma mainloop) run layout nt only";
    if (pair == GemmPair::kBf16S8 || pair == GemmPair::kF16S8)
      return "recipes 4 and 5 (the sm_90a wgmma mainloop) have no w8a16 kernel: use recipes 0-3";
    if (is_fp8(pair) && recipe == 5)
      return "recipe 5 (the sm_90a 128 x 256 tile) has no fp8 kernel (its promoted fp32 accumulators do not fit): use "
             "recipe 4 or 10";
    return sm90_unsupported(t,
                            "recipes 4 and 5 (the sm_90a wgmma mainloop) need a compute capability 9.0 GPU (H100 / H200)",
                            "this image has no sm_90a code for this GPU (recipes 4 and 5 need it): use recipes 0-3");
  }
  if (!is_fp8(pair)) return nullptr;
  if (t.cc < 89) return "fp8 operands need an sm_89 or newer GPU";
  if (t.fp8_code_arch < 0) return "this image has no fp8 GEMM code for this GPU";
  // A compute_80 PTX image JIT-compiled here has no fp8 mma (the cell compiles to nothing below sm_89).
  if (t.fp8_code_arch < 89) return "this image runs compute_80 code on this GPU, which has no fp8 mma (sm_89+ code needed)";
  return nullptr;
}

const char* gemm_unsupported(GemmPair pair, GemmLayout layout, int recipe) {
  // The rules that hold on any device first (a target that has everything), then the current device's facts,
  // queried only where they decide.
  if (const char* why = gemm_unsupported_on(pair, layout, recipe, GemmTarget{90, true, 90})) return why;
  const bool sm90 = recipe >= kGemmFirstSm90Recipe;
  if (!sm90 && !is_fp8(pair)) return nullptr;
  DeviceFacts facts{};
  if (current_device_facts(&facts) != cudaSuccess) return "could not query the current device";
  GemmTarget t{facts.cc_major * 10 + facts.cc_minor, false, -1};
  if (sm90) {
    bool code = false;
    t.sm90_code = gemm::sm90_code_available(&code) == cudaSuccess && code;
  } else if (t.cc >= 89) {
    int ptx = 0;
    t.fp8_code_arch = gemm::sm80_fp8_code_arch(&ptx) == cudaSuccess ? ptx : -1;
  }
  return gemm_unsupported_on(pair, layout, recipe, t);
}

std::string gemm_plan_unfit(GemmPair pair, GemmLayout layout, int64_t recipe, int64_t split_k, int64_t m, int64_t n,
                            int64_t batch) {
  // Each failing branch builds its message (an ostringstream): this runs on every launch.
  if (recipe < 0 || recipe >= kGemmRecipes) {
    std::ostringstream why;
    why << "recipe must be in [0, " << kGemmRecipes << "), got " << recipe;
    return why.str();
  }
  const bool tail_recipe = gemm_is_sm90_mainloop(int(recipe)) || gemm_is_sm90_w8a16(int(recipe));
  if (!((split_k >= 1 && split_k <= kGemmMaxSplitK) || (split_k == 0 && tail_recipe))) {
    std::ostringstream why;
    why << "split_k must be " << (tail_recipe ? "0 (the last wave split along K) or " : "") << "in [1, "
        << kGemmMaxSplitK << "], got " << split_k
        << (split_k == 0 ? " (0, the last wave split along K, is for recipes 4, 5 and 7-11)" : "");
    return why.str();
  }
  if (recipe == kGemmSm90StreamRecipe && split_k > kGemmSm90StreamMaxSplit) {
    std::ostringstream why;
    why << "split_k must be in [1, " << kGemmSm90StreamMaxSplit << "] for recipe " << kGemmSm90StreamRecipe
        << " (the sm_90a weight stream runs its K slices as one cluster of CTAs), got " << split_k;
    return why.str();
  }
  if (recipe == kGemmSm90StreamRecipe && gemm_sm90_stream_grid_x(m, n, split_k) > kGemmMaxGridX) {
    std::ostringstream why;
    why << "recipe " << kGemmSm90StreamRecipe << " runs ceil(N / 64) * ceil(M / 16) * split_k CTAs in one grid row, at "
        << "most " << kGemmMaxGridX << ", got N = " << n << ", M = " << m << ", split_k = " << split_k
        << ": pick another recipe or split the call along N";
    return why.str();
  }
  const int64_t tm = gemm_recipe_tile_m(int(recipe));
  // The grid's rows tile M, or N where the layout runs as y^T = b a (gemm_swaps_operands).
  const bool swaps = gemm_swaps_operands(pair, layout);
  const int64_t grid_rows = swaps ? n : m;
  if ((grid_rows + tm - 1) / tm > kGemmMaxGridYZ) {
    std::ostringstream why;
    // Recipe 0's 128-row tiles reach the furthest of the recipes every device runs; the advice names it only where it
    // reaches further than this recipe.
    const int64_t tm0 = gemm_recipe_tile_m(0);
    const char* dim = swaps ? "N" : "M";
    why << dim << " = " << grid_rows << " needs more than " << kGemmMaxGridYZ << " tiles of " << tm
        << " rows for recipe " << recipe << (swaps ? " (layout tt runs as y^T = b a)" : "") << ": ";
    if (tm < tm0) why << "pick recipe 0 (up to " << kGemmMaxGridYZ * tm0 << " rows) or ";
    why << "split the call along " << dim << " (at most " << kGemmMaxGridYZ * tm << " rows a call with this recipe)";
    return why.str();
  }
  if (batch * std::max<int64_t>(split_k, 1) > kGemmMaxGridYZ) {  // split_k 0: w8a16's unsplit grid has z = batch
    std::ostringstream why;
    why << "batch * split_k must be <= " << kGemmMaxGridYZ << ", got " << batch << " * " << split_k;
    return why.str();
  }
  return std::string();
}

GemmTailPlan gemm_sm90_tail_plan(const GemmParams& p, int tile_m, int tile_n, int k_tile, int num_sms) {
  const int k_tiles = ceil_div(p.k, k_tile);
  const int64_t tiles = int64_t(ceil_div(p.m, tile_m)) * ceil_div(p.n, tile_n) * p.batch;
  GemmTailPlan t{int32_t(tiles), 0, 1, k_tiles};
  const int64_t rest = num_sms > 0 ? tiles % num_sms : 0;
  if (rest == 0) return t;
  int split = int(std::min<int64_t>({num_sms / rest, kGemmTailMaxSplit, k_tiles / kGemmTailMinKTiles}));
  if (split < 2) return t;
  const int per = ceil_div(k_tiles, split);
  split = ceil_div(k_tiles, per);  // the slices a split into `per` K tiles makes: none empty
  if (split < 2) return t;
  return {int32_t(tiles - rest), int32_t(rest), split, per};
}

int64_t gemm_workspace_bytes(const GemmParams& p, GemmPair pair, int recipe) {
  if (recipe == kGemmSm90StreamRecipe) return 0;  // its slices are summed inside their cluster
  if (p.split_k == 0) {  // recipes 4, 5 and 7-11: the tail's slices (0 where nothing splits or the device is unknown)
    DeviceFacts facts{};
    if (current_device_facts(&facts) != cudaSuccess) return 0;
    const GemmTailPlan t = gemm_sm90_tail_plan(p, gemm_recipe_tile_m(recipe), gemm_recipe_tile_n(recipe),
                                               gemm_k_tile(pair), facts.sm_count);
    if (t.split < 2) return 0;
    return int64_t(t.tail_tiles) * t.split * gemm_recipe_tile_m(recipe) * gemm_recipe_tile_n(recipe) * 4;
  }
  int64_t parts = p.split_k;
  if ((pair == GemmPair::kBf16S8 || pair == GemmPair::kF16S8) && p.layout == GemmLayout::kNT && recipe == 2)
    parts = ceil_div<int64_t>(p.split_k, kGemmStreamMaxWarpsK);  // the stream kernel's CTAs along K
  if (parts <= 1) return 0;
  return int64_t(p.batch) * parts * p.m * p.n * 4;  // fp32 or s32 partials
}

namespace {
// (b, a) as a pair: what y^T = b a runs on; false when no kernel takes it (w8a16's (int8, 16-bit)).
bool swapped_pair(GemmPair pair, GemmPair* swapped) {
  switch (pair) {
    case GemmPair::kBf16S8:
    case GemmPair::kF16S8: return false;
    case GemmPair::kE5m2E4m3: *swapped = GemmPair::kE4m3E5m2; return true;
    case GemmPair::kE4m3E5m2: *swapped = GemmPair::kE5m2E4m3; return true;
    default: *swapped = pair; return true;
  }
}

cudaError_t launch_other_layout(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  const bool nn = p.layout == GemmLayout::kNN;
  switch (pair) {
    case GemmPair::kBf16Bf16:
    case GemmPair::kF16F16:
      return nn ? gemm::sm80_launch_w16a16_nn(p, pair, recipe, stream)
                : gemm::sm80_launch_w16a16_tn(p, pair, recipe, stream);
    case GemmPair::kBf16S8:
    case GemmPair::kF16S8:
      if (p.layout == GemmLayout::kTT) return gemm::sm80_launch_w8a16_tt(p, pair, recipe, stream);
      return nn ? gemm::sm80_launch_w8a16_nn(p, pair, recipe, stream)
                : gemm::sm80_launch_w8a16_tn(p, pair, recipe, stream);
    case GemmPair::kS8S8:
      return nn ? gemm::sm80_launch_w8a8_nn(p, pair, recipe, stream)
                : gemm::sm80_launch_w8a8_tn(p, pair, recipe, stream);
    default:
      return nn ? gemm::sm80_launch_fp8_nn(p, pair, recipe, stream) : gemm::sm80_launch_fp8_tn(p, pair, recipe, stream);
  }
}
}  // namespace

bool gemm_swaps_operands(GemmPair pair, GemmLayout layout) {
  GemmPair swapped{};
  return layout == GemmLayout::kTT && swapped_pair(pair, &swapped);
}

cudaError_t gemm_launch(GemmParams p, GemmPair pair, int recipe, cudaStream_t stream) {
  if (recipe < 0 || recipe >= kGemmRecipes) return cudaErrorInvalidValue;
  const int k_tiles = ceil_div(p.k, gemm_k_tile(pair));
  // split_k 0 (recipes 4, 5 and 7-11, checked by the binding): the sm_90a launcher plans the tail; any kernel that
  // runs the call instead runs it unsplit.
  const bool tail_split = p.split_k == 0;
  if (tail_split && !gemm_is_sm90_mainloop(recipe) && !gemm_is_sm90_w8a16(recipe)) return cudaErrorInvalidValue;
  p.k_tiles_per_split = tail_split ? k_tiles : ceil_div(k_tiles, p.split_k);
  p.tail_from = 0;
  p.tail_split = 0;
  p.transpose_out = 0;
  GemmPair swapped{};
  if (p.layout == GemmLayout::kTT && swapped_pair(pair, &swapped)) {
    // tt: y^T = b a with b [n][k] as the K-major a and a [k][m] as the MN-major b, i.e. the nn kernel. Scales, bias
    // and out keep y's orientation (the kernel transposes its stores). The K tile is the same: both pairs' b width
    // is a's (equal widths in every swappable pair).
    GemmParams q = p;
    q.a = p.b;
    q.b = p.a;
    q.a_row_stride = p.b_row_stride;
    q.b_row_stride = p.a_row_stride;
    q.a_batch_stride = p.b_batch_stride;
    q.b_batch_stride = p.a_batch_stride;
    q.m = p.n;
    q.n = p.m;
    q.layout = GemmLayout::kNN;
    q.transpose_out = 1;
    return launch_other_layout(q, swapped, recipe, stream);
  }
  if (p.layout != GemmLayout::kNT) return launch_other_layout(p, pair, recipe, stream);
  if (gemm_is_sm90_w8a16(recipe)) {
    const cudaError_t st = gemm::sm90_launch_w8a16(p, pair, recipe, stream);
    if (st != cudaErrorNotSupported) return st;
    recipe = 0;  // an operand the TMA cannot describe: the portable mainloop, same split and workspace
    if (tail_split) p.split_k = 1;  // (unsplit for split_k 0)
  } else if (recipe == kGemmSm90StreamRecipe) {
    const cudaError_t st = gemm::sm90_launch_stream(p, pair, stream);
    if (st != cudaErrorNotSupported) return st;
    // An operand the TMA cannot describe (K = 0): recipe 2 without a split (it needs no workspace then).
    p.split_k = 1;
    p.k_tiles_per_split = k_tiles;
    recipe = 2;
  } else if (recipe >= kGemmFirstSm90Recipe) {  // layout nt, a pair it runs (gemm_unsupported)
    cudaError_t st = cudaErrorInvalidValue;
    switch (pair) {
      case GemmPair::kBf16Bf16:
      case GemmPair::kF16F16: st = gemm::sm90_launch_16bit(p, pair, recipe, stream); break;
      case GemmPair::kS8S8: st = gemm::sm90_launch_s8(p, recipe, stream); break;
      default: st = gemm::sm90_launch_fp8(p, pair, recipe, stream); break;
    }
    // An operand the TMA cannot describe (a base address not 16-byte aligned): the portable recipe of the same
    // tile rows runs it (same split, same workspace; unsplit for split_k 0).
    if (st != cudaErrorNotSupported) return st;
    recipe = 0;
    if (tail_split) p.split_k = 1;
  }
  switch (pair) {
    case GemmPair::kBf16Bf16:
    case GemmPair::kF16F16: return gemm::sm80_launch_w16a16(p, pair, recipe, stream);
    case GemmPair::kBf16S8:
    case GemmPair::kF16S8: return gemm::sm80_launch_w8a16(p, pair, recipe, stream);
    case GemmPair::kS8S8: return gemm::sm80_launch_w8a8(p, pair, recipe, stream);
    default: return gemm::sm80_launch_fp8(p, pair, recipe, stream);
  }
}

}  // namespace astrai
