// Helpers shared by the stable-ABI bindings: argument checks with uniform messages, the current CUDA
// stream, and the one place a CUDA status becomes an exception.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

// Defined only in libtorch_cuda.so. A weak reference keeps the library loadable on CPU-only torch,
// where the address resolves to null.
extern "C" __attribute__((weak)) AOTITorchError aoti_torch_get_current_cuda_stream(int32_t device_index,
                                                                                   void** ret_stream);

namespace astrai {
namespace binding {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// ---- messages -------------------------------------------------------------------------------------

// Throws std::runtime_error (Python: RuntimeError) with "<op>: <parts...>".
template <typename... Parts>
[[noreturn]] void fail(const char* op, const Parts&... parts) {
  std::ostringstream msg;
  msg << op << ": ";
  (msg << ... << parts);
  throw std::runtime_error(msg.str());
}

template <typename... Parts>
void check(bool cond, const char* op, const Parts&... parts) {
  if (!cond) fail(op, parts...);
}

inline const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Char: return "int8";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Bool: return "bool";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    default: return "another dtype";
  }
}

// Message text for a tensor's device, shape or strides, or a list: a reference printed (operator<<) only when a
// message is built. check()'s arguments are evaluated on every call, the passing ones too, and a std::string built
// there (an ostringstream each, ~0.2 us) cost several microseconds an op call: keep every part of a message cheap
// until fail() streams it.
struct DeviceText {
  const Tensor& t;
};
struct ShapeText {
  const Tensor& t;
  bool strides;
};
template <typename List>
struct ListText {
  const List& values;
};

inline DeviceText device_text(const Tensor& t) { return {t}; }
inline ShapeText shape_text(const Tensor& t) { return {t, false}; }
inline ShapeText strides_text(const Tensor& t) { return {t, true}; }
template <typename List>
ListText<List> list_text(const List& values) {
  return {values};
}

template <typename List>
void print_list(std::ostream& os, const List& values) {
  os << "[";
  for (size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  os << "]";
}

inline std::ostream& operator<<(std::ostream& os, const DeviceText& d) {
  const int32_t index = d.t.get_device_index();
  if (d.t.is_cpu()) return os << "cpu";
  os << (d.t.is_cuda() ? "cuda" : "a non-CUDA device");
  if (index >= 0) os << ":" << index;
  return os;
}

inline std::ostream& operator<<(std::ostream& os, const ShapeText& s) {
  if (s.strides) {
    print_list(os, s.t.strides());
  } else {
    print_list(os, s.t.sizes());
  }
  return os;
}

template <typename List>
std::ostream& operator<<(std::ostream& os, const ListText<List>& l) {
  print_list(os, l.values);
  return os;
}

// ---- argument checks (messages: "<op>: <name> must be ..., got ...") -------------------------------

// "<name> must be <expected>, got <got>": the words of a dtype rule, for check_dtype and for the tensor-free
// can_implement ops the policies ask (so a fallback's reason and the op's error say the same).
inline std::string dtype_rule(const char* name, ScalarType got, ScalarType expected) {
  return std::string(name) + " must be " + dtype_name(expected) + ", got " + dtype_name(got);
}

inline void check_dtype(const char* op, const char* name, const Tensor& t, ScalarType expected) {
  if (t.scalar_type() != expected) fail(op, dtype_rule(name, t.scalar_type(), expected));
}

// `layout` names the axes, e.g. "[T, H, D]".
inline void check_rank(const char* op, const char* name, const Tensor& t, int64_t rank, const char* layout) {
  check(t.dim() == rank, op, name, " must be ", rank, "-D ", layout, ", got ", t.dim(), "-D with shape ",
        shape_text(t));
}

// Stride 1 on the last axis (any stride is fine when that axis has one element); no negative strides.
inline void check_strides(const char* op, const char* name, const Tensor& t) {
  const int64_t last = t.dim() - 1;
  check(last < 0 || t.size(last) <= 1 || t.stride(last) == 1, op, name,
        " must have stride 1 in its last dimension, got strides ", strides_text(t), " for shape ", shape_text(t));
  for (int64_t d = 0; d < t.dim(); ++d) {
    check(t.stride(d) >= 0, op, name, " must have non-negative strides, got ", strides_text(t));
  }
}

inline void check_element_aligned(const char* op, const char* name, const Tensor& t) {
  check(reinterpret_cast<uintptr_t>(t.data_ptr()) % t.element_size() == 0, op, name,
        " must be aligned to its element size (", t.element_size(), " bytes)");
}

// True when no two in-bounds indices of `t` can address the same element. A sufficient test: taken in
// increasing order, each stride clears the extent of the smaller ones. Dims of size 1 never collide.
inline bool strides_non_overlapping(const Tensor& t) {
  constexpr int64_t kMaxDims = 16;
  if (t.dim() > kMaxDims) return false;
  int64_t order[kMaxDims];
  int64_t count = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) order[count++] = d;
  }
  for (int64_t i = 1; i < count; ++i) {
    for (int64_t j = i; j > 0 && t.stride(order[j]) < t.stride(order[j - 1]); --j) std::swap(order[j], order[j - 1]);
  }
  int64_t extent = 1;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t d = order[i];
    if (t.stride(d) < extent) return false;
    extent += t.stride(d) * (t.size(d) - 1);
  }
  return true;
}

inline void check_cuda_device(const char* op, const char* name, const Tensor& t) {
  check(t.is_cuda(), op, name, " must be a CUDA tensor, got ", device_text(t));
}

// `t` must live on the same CUDA device as `ref` (named `ref_name`).
inline void check_same_device(const char* op, const char* name, const Tensor& t, const char* ref_name,
                              const Tensor& ref) {
  check(t.is_cuda() && t.get_device_index() == ref.get_device_index(), op, name,
        " must be on the same device as ", ref_name, " (", device_text(ref), "), got ", device_text(t));
}

// ---- CUDA ---------------------------------------------------------------------------------------

// The current stream of `device_index`, as torch sees it (side streams, graph capture). Never
// Stream::id(): that is c10's stream id, not a cudaStream_t.
inline cudaStream_t current_cuda_stream(const char* op, int32_t device_index) {
  using GetStream = AOTITorchError (*)(int32_t, void**);
  static const GetStream get_stream = []() -> GetStream {
    if (&aoti_torch_get_current_cuda_stream != nullptr) return &aoti_torch_get_current_cuda_stream;
    // Weak binding may stay null when libtorch_cuda.so arrived after us; it is loaded if torch has CUDA.
    void* lib = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    return lib ? reinterpret_cast<GetStream>(dlsym(lib, "aoti_torch_get_current_cuda_stream")) : nullptr;
  }();
  check(get_stream != nullptr, op, "this torch build has no CUDA support (aoti_torch_get_current_cuda_stream ",
        "not found); a CUDA build of torch is required");
  void* stream = nullptr;
  check(get_stream(device_index, &stream) == AOTI_TORCH_SUCCESS, op,
        "could not get the current CUDA stream of device cuda:", device_index);
  return static_cast<cudaStream_t>(stream);
}

// The only place a CUDA status becomes an exception. `describe()` returns what was launched (printable); it is
// called only on an error (a launch's description is an ostringstream: not on every call).
template <typename Describe>
void check_cuda_status(cudaError_t status, const char* op, const Describe& describe) {
  if (status != cudaSuccess) {
    fail(op, "CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") launching ", describe());
  }
}

}  // namespace binding
}  // namespace astrai
