// wgmma cells of the Hopper GEMM (sm_90a): m64n128 and m64n256, both operands K-major in shared memory (128-byte
// swizzle descriptors of wgmma_sm90.cuh), for every operand pair the GEMM family runs there: bf16 and fp16 (k16,
// fp32 accumulators), e4m3 / e5m2 in any combination (k32, fp32) and s8 (k32, s32 with .satfinite). One call is one
// wgmma of the executing warpgroup; `accumulate` false overwrites d (scale-d 0).
//
// Accumulator layout (every cell): thread (warp w of the warpgroup, lane 4 g + t) holds d[4 j + e] =
// D[16 w + g + 8 (e / 2)][8 j + 2 t + e % 2], j = 0 .. N / 8 - 1.
#pragma once

#include <cstdint>

#include "kernels/common/ptx/arch.cuh"

namespace astrai {

// The 64 accumulator registers %0..%63 of an m64n128 cell.
#define ASTRAI_WGMMA_DLIST64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63"
#define ASTRAI_WGMMA_D64F(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
  "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), \
  "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
  "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
  "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
  "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
  "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
  "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define ASTRAI_WGMMA_D64R(d) \
  "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), \
  "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), \
  "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), \
  "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), \
  "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), \
  "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), \
  "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), \
  "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
// The 128 accumulator registers %0..%127 of an m64n256 cell.
#define ASTRAI_WGMMA_DLIST128 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101" \
  ", %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %1" \
  "18, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define ASTRAI_WGMMA_D128F(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
  "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), \
  "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
  "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
  "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
  "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
  "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
  "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), \
  "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), \
  "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), \
  "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), \
  "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), \
  "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), \
  "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), \
  "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), \
  "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define ASTRAI_WGMMA_D128R(d) \
  "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), \
  "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), \
  "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), \
  "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), \
  "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), \
  "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), \
  "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), \
  "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]), "+r"(d[64]), \
  "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]), "+r"(d[72]), \
  "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]), "+r"(d[80]), \
  "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]), "+r"(d[88]), \
  "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]), "+r"(d[96]), \
  "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]), "+r"(d[104]), \
  "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]), "+r"(d[112]), \
  "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]), "+r"(d[120]), \
  "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])

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

ASTRAI_WGMMA_CELL(wgmma_m64n128_bf16_ss, float, 64, F, "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", ", 1, 1, 0, 0", "%64", "%65", "%66")
ASTRAI_WGMMA_CELL(wgmma_m64n128_f16_ss, float, 64, F, "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", ", 1, 1, 0, 0", "%64", "%65", "%66")
ASTRAI_WGMMA_CELL(wgmma_m64n128_e4m3e4m3_ss, float, 64, F, "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3", ", 1, 1", "%64", "%65", "%66")
ASTRAI_WGMMA_CELL(wgmma_m64n128_e5m2e4m3_ss, float, 64, F, "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e4m3", ", 1, 1", "%64", "%65", "%66")
ASTRAI_WGMMA_CELL(wgmma_m64n128_e4m3e5m2_ss, float, 64, F, "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e5m2", ", 1, 1", "%64", "%65", "%66")
ASTRAI_WGMMA_CELL(wgmma_m64n128_s8_ss, int32_t, 64, R, "wgmma.mma_async.sync.aligned.m64n128k32.satfinite.s32.s8.s8", "", "%64", "%65", "%66")
ASTRAI_WGMMA_CELL(wgmma_m64n256_bf16_ss, float, 128, F, "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", ", 1, 1, 0, 0", "%128", "%129", "%130")
ASTRAI_WGMMA_CELL(wgmma_m64n256_f16_ss, float, 128, F, "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", ", 1, 1, 0, 0", "%128", "%129", "%130")
ASTRAI_WGMMA_CELL(wgmma_m64n256_e4m3e4m3_ss, float, 128, F, "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3", ", 1, 1", "%128", "%129", "%130")
ASTRAI_WGMMA_CELL(wgmma_m64n256_e5m2e4m3_ss, float, 128, F, "wgmma.mma_async.sync.aligned.m64n256k32.f32.e5m2.e4m3", ", 1, 1", "%128", "%129", "%130")
ASTRAI_WGMMA_CELL(wgmma_m64n256_e4m3e5m2_ss, float, 128, F, "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e5m2", ", 1, 1", "%128", "%129", "%130")
ASTRAI_WGMMA_CELL(wgmma_m64n256_s8_ss, int32_t, 128, R, "wgmma.mma_async.sync.aligned.m64n256k32.satfinite.s32.s8.s8", "", "%128", "%129", "%130")

#undef ASTRAI_WGMMA_CELL

}  // namespace astrai
