// Which device pass is compiling: the guard of the sm_90a architecture-specific instructions.
#pragma once

// 1 in the sm_90a device pass (wgmma, setmaxnreg): other passes, the compute_80 PTX and sm_120a included,
// compile those wrappers to nothing, and the launchers never run a kernel that needs them there.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ASTRAI_WGMMA 1
#else
#define ASTRAI_WGMMA 0
#endif
