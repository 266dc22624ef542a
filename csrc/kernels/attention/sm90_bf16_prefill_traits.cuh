// sm_90a bf16 prefill (head_dim 128): the block shape, shared-memory layout, K/V tensor maps and timeline hooks
// that its parts (scheduler, producer, mainloop, mask, softmax, epilogue) share.
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap (a type only: the launcher reaches the driver through the runtime)
#include <cuda_bf16.h>

#include "kernels/attention/bf16_prefill.cuh"
#include "kernels/attention/params.h"
#include "kernels/attention/prefill_schedule.h"

#include "kernels/common/ptx/arch.cuh"
#include "kernels/common/ptx/async_copy.cuh"
#include "kernels/common/ptx/math.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/smem.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/common/ptx/tma.cuh"
#include "kernels/common/ptx/wgmma_sm90.cuh"

namespace astrai {
namespace attention {

// ---- block shape and shared memory -------------------------------------------------------------------------
// Shared memory: Q (128 x 128) 32 KB + 3 stages x (K, V: 128 x 128) 192 KB + mbarriers and page flags + 1 KB of
// alignment slack: 225 KB of the 227 KB a block may take; one block per SM. Every (rows x 128) operand is stored as
// two halves of 64 columns (128-byte rows, chunk c of row r at chunk c ^ (r % 8)): the canonical 128-byte-swizzle
// layout of wgmma, K-major for Q and K, MN-major for V.
struct PrefillSm90Traits {
  static constexpr int kHeadDim = 128;
  static constexpr int kConsumers = 2;                 // consumer warpgroups (64 packed rows each)
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBM = 128;                      // packed rows per block (the mma.sync kernel's tile)
  static constexpr int kBN = 128;                      // keys per K/V tile
  static constexpr int kStages = 3;                    // tiles j - 1 (P V), j (S), j + 1 (landing)
  static constexpr int kChunks = kHeadDim / 8;         // 16-byte chunks per row
  static constexpr int kGroupRows = 8;                 // consecutive K/V rows copied from one page id
  static constexpr int kGroups = kBN / kGroupRows;     // row groups per tile (page flags)
  // setmaxnreg: 128 x producer + 256 x consumer <= 128 x 504 (the 168 per thread the launch holds). Paged K/V's
  // producer (page ids, one tile ahead) spilled at 40, the contiguous one does not; the consumers fit 224 unspilled.
  static constexpr int producer_regs(bool paged) { return paged ? 56 : 40; }
  static constexpr int consumer_regs(bool paged) { return paged ? 224 : 232; }
  static constexpr uint32_t kHalfQ = kBM * 128;        // bytes of one 64-column half of Q
  static constexpr uint32_t kHalfKV = kBN * 128;       // bytes of one half of a K or V tile
  static constexpr uint32_t kQBytes = 2 * kHalfQ;
  static constexpr uint32_t kTileBytes = 2 * kHalfKV;  // one K or V tile
  // mbarriers: K, V full / empty [kStages] each, Q full / empty, work-item full / empty [2] each (18 x 8 bytes);
  // then the two work-item slots (int32).
  static constexpr uint32_t kBarOffset = kQBytes + kStages * 2 * kTileBytes;
  static constexpr uint32_t kItemOffset = kBarOffset + 4 * kStages * 8 + 2 * 8 + 4 * 8;
  static constexpr uint32_t kFlagOffset = kBarOffset + 256;  // page flags: [stage][group] bytes, 16-byte aligned
  static constexpr int kSmemBytes = int(kFlagOffset) + kStages * kGroups + 1024;  // + alignment slack
  static_assert(kBN == kBM && 128 / kChunks * 2 * kGroupRows == kBN, "a producer thread copies two row groups");
  static_assert(kItemOffset + 2 * 4 <= kFlagOffset, "barriers and item slots fit their region");
};
static_assert(PrefillSm90Traits::kBM == prefill_block_rows(128), "the sm_90a kernel takes the planned Q tiles");

// TMA descriptors of K and V, each a 4-D tensor (head_dim, kv heads, keys, sequences; paged: head_dim, kv heads,
// page slots, pages) read in boxes of 64 columns x 128 keys (paged: x min(page size, 128) slots of one page) with
// the 128-byte swizzle: a half of a K/V tile, or of one page's part of it. With `enabled`, every K/V tile that lies
// wholly below the sequence's key count is copied by TMA (per half one instruction from thread 0; paged, one per
// half of each page's part, spread over the lanes of the four producer warps; instead of 16 cp.async per producer
// thread); the tile past the last whole one by cp.async, which zero-fills the keys past the sequence (V rows there
// must be finite). Without it (the launcher could not encode them, or ASTRAI_PREFILL_SM90_TMA=0), every tile by
// cp.async: the same bits.
struct PrefillSm90KvMaps {  // 128-byte aligned (CUtensorMap)
  CUtensorMap k;
  CUtensorMap v;
  int enabled;
};

// Where the parts of the block's shared memory lie (carved by prefill_bf16_sm90; synchronization: see there).
struct PrefillSm90Smem {
  uint32_t base;                 // shared-window address of Q; the K/V stages follow (kQBytes on)
  uint64_t* k_full;              // [kStages] K tile landed
  uint64_t* k_empty;             // [kStages] both consumers' S of it done
  uint64_t* v_full;              // [kStages] V tile landed
  uint64_t* v_empty;             // [kStages] both consumers' P V of it done
  uint64_t* q_full;              // the item's Q landed
  uint64_t* q_empty;             // both consumers issued their last S of it
  uint64_t* item_full;           // [2] work-item slot published
  uint64_t* item_empty;          // [2] work-item slot read by every thread
  volatile int32_t* item_slot;   // [2] work items
  uint8_t* page_flags;           // [kStages][kGroups] paged: row group on an invalid page
};

// Byte offset of 16-byte chunk c (0..15) of row r in a two-half operand of `half_bytes` per half.
__device__ __forceinline__ uint32_t sm90_tile_offset(int r, int c, uint32_t half_bytes) {
  return uint32_t(c >> 3) * half_bytes + uint32_t(r) * 128u + (uint32_t((c & 7) ^ (r & 7)) << 4);
}

// ---- timeline hooks ----------------------------------------------------------------------------------------
// Fixed points of a work item where a hooks policy (the kernel's Hooks parameter) may look; the production
// kernel takes PrefillSm90NoHooks, whose empty members compile to nothing. csrc/tools/prefill_sm90_trace.cu
// supplies one that stamps clock64.
enum class PrefillSm90Point : int {
  kProducerItem,    // producer: the item read
  kProducerQ,       // producer: Q's buffer free, its copies start
  kProducerIssued,  // producer: every copy of the item issued
  kItem,            // consumer: the item read
  kQReady,          // consumer: Q landed
  kK0Ready,         // consumer: K of tile 0 landed
  kTurn0,           // consumer: its tensor-core turn for tile 0
  kFirstS,          // consumer: S of tile 0 done
  kLoopEnd,         // consumer: every tile's softmax done
  kLastPV,          // consumer: the last P V done
  kStored,          // consumer: O stored
};

struct PrefillSm90NoHooks {
  // Every thread of the warpgroup (producer or consumer) calls `at` at `point` of its item_no-th item.
  __device__ __forceinline__ void at(PrefillSm90Point /*point*/, int /*item_no*/) {}
  // Producer, every thread: the item's K/V tile count.
  __device__ __forceinline__ void tiles(int /*item_no*/, int /*n_tiles*/) {}
  // Consumer, every thread: tile j's P rounded (masked: it took the mask).
  __device__ __forceinline__ void tile_done(int /*item_no*/, int /*j*/, bool /*masked*/) {}
};

}  // namespace attention
}  // namespace astrai
