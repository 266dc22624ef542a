// wgmma cells of the Hopper GEMM (sm_90a): m64n128, m64n192 and m64n256, both operands K-major in shared memory
// (128-byte swizzle descriptors of wgmma_sm90.cuh), for every operand pair the GEMM family runs there: bf16 and fp16
// (k16, fp32 accumulators), e4m3 / e5m2 in any combination (k32, fp32) and s8 (k32, s32 with .satfinite). One call is
// one wgmma of the executing warpgroup; `accumulate` false overwrites d (scale-d 0).
//
// Accumulator layout (every cell): thread (warp w of the warpgroup, lane 4 g + t) holds d[4 j + e] =
// D[16 w + g + 8 (e / 2)][8 j + 2 t + e % 2], j = 0 .. N / 8 - 1.
#pragma once

#include <cstdint>

#include "kernels/common/ptx/arch.cuh"
#include "kernels/common/ptx/wgmma_sm90.cuh"

namespace astrai {

// The first 32 of a cell's accumulator operands (the last third of m64n192's).
#define ASTRAI_WGMMA_OPS32(C, d) \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), C(d[10]), C(d[11]), \
  C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), \
  C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31])
// Accumulator operands of a cell: 64 (m64n128), 96 (m64n192) or 128 (m64n256) registers, fp32 (F) or s32 (R).
#define ASTRAI_WGMMA_D64F(d) ASTRAI_WGMMA_OPS64("+f", d)
#define ASTRAI_WGMMA_D96F(d) ASTRAI_WGMMA_OPS64("+f", d), ASTRAI_WGMMA_OPS32("+f", (d + 64))
#define ASTRAI_WGMMA_D64R(d) ASTRAI_WGMMA_OPS64("+r", d)
#define ASTRAI_WGMMA_D96R(d) ASTRAI_WGMMA_OPS64("+r", d), ASTRAI_WGMMA_OPS32("+r", (d + 64))
#define ASTRAI_WGMMA_D128F(d) ASTRAI_WGMMA_OPS64("+f", d), ASTRAI_WGMMA_OPS64("+f", (d + 64))
#define ASTRAI_WGMMA_D128R(d) ASTRAI_WGMMA_OPS64("+r", d), ASTRAI_WGMMA_OPS64("+r", (d + 64))

// The 64 accumulator registers %0..%63 of an m64n128 cell.
#define ASTRAI_WGMMA_DLIST64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63"
// The 96 accumulator registers %0..%95 of an m64n192 cell.
#define ASTRAI_WGMMA_DLIST96 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
// The 128 accumulator registers %0..%127 of an m64n256 cell.
#define ASTRAI_WGMMA_DLIST128 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101" \
  ", %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %1" \
  "18, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// One cell: NAME(acc (&d)[N / 2], desc_a, desc_b, accumulate) running `INSTR {d}, desc_a, desc_b, p TAIL;`.
#if ASTRAI_WGMMA
#define ASTRAI_WGMMA_CELL(NAME, ACC, NREG, CONS, INSTR, TAIL, IA, IB, IP)                                      \
  __device__ __forceinline__ void NAME(ACC (&d)[NREG], uint64_t desc_a, uint64_t desc_b, bool accumulate) {    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IP ", 0;\n" INSTR " {" ASTRAI_WGMMA_DLIST##NREG "}, " IA   \
                 ", " IB ", p" TAIL ";\n}\n"                                                                    \
                 : ASTRAI_WGMMA_D##NREG##CONS(d)                                                              \
                 : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));                                            \
  }
#else
#define ASTRAI_WGMMA_CELL(NAME, ACC, NREG, CONS, INSTR, TAIL, IA, IB, IP) \
  __device__ __forceinline__ void NAME(ACC (&)[NREG], uint64_t, uint64_t, bool) {}
#endif


// The cells of an operand pair: wgmma_m64n128_<NAME>_ss, wgmma_m64n192_<NAME>_ss and wgmma_m64n256_<NAME>_ss.
#define ASTRAI_WGMMA_CELLS(NAME, ACC, CONS, K, TYPES, TAIL)                                                       \
  ASTRAI_WGMMA_CELL(wgmma_m64n128_##NAME##_ss, ACC, 64, CONS, "wgmma.mma_async.sync.aligned.m64n128k" K TYPES, TAIL, \
                    "%64", "%65", "%66")                                                                          \
  ASTRAI_WGMMA_CELL(wgmma_m64n192_##NAME##_ss, ACC, 96, CONS, "wgmma.mma_async.sync.aligned.m64n192k" K TYPES, TAIL, \
                    "%96", "%97", "%98")                                                                          \
  ASTRAI_WGMMA_CELL(wgmma_m64n256_##NAME##_ss, ACC, 128, CONS, "wgmma.mma_async.sync.aligned.m64n256k" K TYPES, TAIL, \
                    "%128", "%129", "%130")
ASTRAI_WGMMA_CELLS(bf16, float, F, "16", ".f32.bf16.bf16", ", 1, 1, 0, 0")
ASTRAI_WGMMA_CELLS(f16, float, F, "16", ".f32.f16.f16", ", 1, 1, 0, 0")
ASTRAI_WGMMA_CELLS(e4m3e4m3, float, F, "32", ".f32.e4m3.e4m3", ", 1, 1")
ASTRAI_WGMMA_CELLS(e5m2e4m3, float, F, "32", ".f32.e5m2.e4m3", ", 1, 1")
ASTRAI_WGMMA_CELLS(e4m3e5m2, float, F, "32", ".f32.e4m3.e5m2", ", 1, 1")
ASTRAI_WGMMA_CELLS(s8, int32_t, R, "32", ".satfinite.s32.s8.s8", "")

#undef ASTRAI_WGMMA_CELLS
#undef ASTRAI_WGMMA_CELL

}  // namespace astrai
