// Internal: the quantize launchers' one dispatch from a call's runtime types to a kernel's template arguments (plain
// C++; the plan and the launch of a call go through the same one).
#pragma once

#include <type_traits>

#include <cuda_runtime_api.h>

#include "kernels/quantize/params.h"

namespace astrai {
namespace quantize_detail {

// f(in, out, vec) with p's input and output types and `vec` as integral constants; cudaErrorInvalidValue for a
// type outside the enums, or for int8 output unless kInt8Out (the transpose kernels are fp8 only: never instantiated
// for int8).
template <bool kInt8Out, class F>
cudaError_t with_types(const QuantizeParams& p, bool vec, F&& f) {
  auto with_vec = [&](auto in, auto out) {
    return vec ? f(in, out, std::true_type{}) : f(in, out, std::false_type{});
  };
  auto with_out = [&](auto in) {
    switch (p.out_type) {
      case QuantOut::kE4M3: return with_vec(in, std::integral_constant<QuantOut, QuantOut::kE4M3>{});
      case QuantOut::kE5M2: return with_vec(in, std::integral_constant<QuantOut, QuantOut::kE5M2>{});
      case QuantOut::kInt8:
        if constexpr (kInt8Out) {
          return with_vec(in, std::integral_constant<QuantOut, QuantOut::kInt8>{});
        } else {
          return cudaErrorInvalidValue;
        }
    }
    return cudaErrorInvalidValue;
  };
  switch (p.in_type) {
    case QuantIn::kBF16: return with_out(std::integral_constant<QuantIn, QuantIn::kBF16>{});
    case QuantIn::kF16: return with_out(std::integral_constant<QuantIn, QuantIn::kF16>{});
    case QuantIn::kF32: return with_out(std::integral_constant<QuantIn, QuantIn::kF32>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace quantize_detail
}  // namespace astrai
