// Decode instantiations for head_dim 64 (contiguous and paged KV, the production tile).
#include "kernels/attention/decode_launch.cuh"

namespace astrai {
namespace attention {
template cudaError_t launch_decode_split_kv<64>(const DecodeParams& p, cudaStream_t stream, bool pdl);
}  // namespace attention
}  // namespace astrai
