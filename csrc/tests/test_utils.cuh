// Host-side helpers for the standalone .cu tests: CUDA checks, bf16/fp8 bits, timing, options and exit status,
// device buffers, seeded inputs, tables.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace astrai_test {

#define TEST_CUDA_CHECK(expr)                                                                         \
  do {                                                                                                \
    const cudaError_t test_status_ = (expr);                                                          \
    if (test_status_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "CUDA error %s (%s) at %s:%d: %s\n", cudaGetErrorName(test_status_),      \
                   cudaGetErrorString(test_status_), __FILE__, __LINE__, #expr);                      \
      std::exit(2);                                                                                   \
    }                                                                                                 \
  } while (0)

// ---- bf16 on the host ---------------------------------------------------------------------------

inline float bf16_to_float(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even, like cvt.rn.bf16.f32.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Spacing of bf16 values (8 significant bits) at magnitude |x|; subnormal spacing below the normal range.
inline double bf16_ulp(double x) {
  x = std::fabs(x);
  if (x < std::ldexp(1.0, -126)) return std::ldexp(1.0, -133);
  int e = 0;
  std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

// ---- fp8 on the host (OCP e4m3fn: no infinities, NaN 0x7f/0xff; e5m2: IEEE-like) ------------------------

// Decodes an fp8 code with `mbits` mantissa bits and exponent bias `bias`.
inline float fp8_bits_to_float(uint8_t bits, int mbits, int bias, bool e4m3fn) {
  const int ebits = 7 - mbits;
  const int sign = bits >> 7;
  const int e = (bits >> mbits) & ((1 << ebits) - 1);
  const int m = bits & ((1 << mbits) - 1);
  float v;
  if (e4m3fn && e == 15 && m == 7) {
    v = NAN;
  } else if (!e4m3fn && e == 31) {
    v = m == 0 ? INFINITY : NAN;
  } else if (e == 0) {
    v = std::ldexp(float(m), 1 - bias - mbits);
  } else {
    v = std::ldexp(float((1 << mbits) | m), e - bias - mbits);
  }
  return sign ? -v : v;
}

inline float e4m3_to_float(uint8_t bits) { return fp8_bits_to_float(bits, 3, 7, true); }
inline float e5m2_to_float(uint8_t bits) { return fp8_bits_to_float(bits, 2, 15, false); }

// Round to nearest even with saturation to the largest finite value (like cvt.rn.satfinite); NaN stays NaN.
inline uint8_t float_to_fp8(float f, bool e4m3) {
  if (std::isnan(f)) return e4m3 ? 0x7f : 0x7e;
  uint8_t best = 0;
  double best_err = INFINITY;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const double a = std::fabs(double(f));
  for (int code = 0; code < 128; ++code) {  // exhaustive: 128 magnitudes, exact ties to the even code
    const float v = e4m3 ? e4m3_to_float(uint8_t(code)) : e5m2_to_float(uint8_t(code));
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(a - double(v));
    if (err < best_err || (err == best_err && (code & 1) == 0)) {
      best_err = err;
      best = uint8_t(code);
    }
  }
  return uint8_t(sign | best);
}

inline uint8_t float_to_e4m3(float f) { return float_to_fp8(f, true); }
inline uint8_t float_to_e5m2(float f) { return float_to_fp8(f, false); }

// ---- timing ---------------------------------------------------------------------------------------

// CUDA events around work on one stream; milliseconds between start() and stop().
class GpuTimer {
 public:
  explicit GpuTimer(cudaStream_t stream = nullptr) : stream_(stream) {
    TEST_CUDA_CHECK(cudaEventCreate(&start_));
    TEST_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;
  ~GpuTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void start() { TEST_CUDA_CHECK(cudaEventRecord(start_, stream_)); }
  float stop() {
    TEST_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    TEST_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.f;
    TEST_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// ---- command line and exit status ------------------------------------------------------------------

// The options every standalone test takes: --small (the sanitizer's short table) and --seed N.
struct TestOptions {
  bool small = false;
  uint64_t seed = 0;
  bool ok = true;  // false: unknown argument (print usage, exit 2)
};

inline TestOptions parse_test_options(int argc, char** argv) {
  TestOptions o;
  o.seed = std::random_device{}();
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--small") == 0) {
      o.small = true;
    } else if (std::strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      o.seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--small] [--seed N]\n", argv[0]);
      o.ok = false;
    }
  }
  return o;
}

// First line of every standalone test: the device it runs on and how to repeat the run. Returns the
// device's properties.
inline cudaDeviceProp print_test_banner(const char* name, const TestOptions& o) {
  int device = 0;
  cudaDeviceProp prop{};
  TEST_CUDA_CHECK(cudaGetDevice(&device));
  TEST_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::printf("%s: %s (sm_%d%d), seed %llu%s\n", name, prop.name, prop.major, prop.minor,
              static_cast<unsigned long long>(o.seed), o.small ? ", --small" : "");
  return prop;
}

// Exit status of every standalone test: 0 all cases passed, 1 a case failed (2 is TEST_CUDA_CHECK's).
inline int test_exit_status(int failed_cases, int total_cases, uint64_t seed) {
  std::printf("%d cases, %d failed (seed %llu): %s\n", total_cases, failed_cases,
              static_cast<unsigned long long>(seed), failed_cases == 0 ? "PASS" : "FAIL");
  return failed_cases == 0 ? 0 : 1;
}

// ---- inputs ---------------------------------------------------------------------------------------

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen_); }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }
  // Random bf16 in [-4, 4], never zero or tiny: a dropped or zeroed element must show.
  uint16_t nonzero_bf16() {
    for (;;) {
      const double v = uniform(-4.0, 4.0);
      if (std::fabs(v) >= 1.0 / 64) return float_to_bf16(float(v));
    }
  }

 private:
  std::mt19937_64 gen_;
};

// ---- device memory --------------------------------------------------------------------------------

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0) TEST_CUDA_CHECK(cudaMalloc(&ptr_, count_ * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), count_(o.count_) { o.ptr_ = nullptr; o.count_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& host) {
    if (count_ > 0) TEST_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(std::vector<T>& host) const {
    host.resize(count_);
    if (count_ > 0) TEST_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// ---- results --------------------------------------------------------------------------------------

struct ErrorStats {
  double max_abs = 0.0;      // max |got - ref| over finite expectations
  double max_ulp = 0.0;      // max |got - ref| / bf16_ulp(ref)
  double max_tol_ratio = 0;  // max |got - ref| / tolerance; <= 1 passes
  int64_t checked = 0;       // elements compared
  int64_t failures = 0;      // elements out of tolerance, unwritten, or written where they must not be
  std::string first_failure; // description of the first failure
  void fail(const std::string& what) {
    if (failures++ == 0) first_failure = what;
  }
};

inline void print_table_header() {
  std::printf("%-4s %-62s %11s %8s %8s %10s  %s\n", "#", "case", "max_abs", "max_ulp", "err/tol", "checked",
              "result");
}

inline void print_table_row(int index, const std::string& name, const ErrorStats& s) {
  std::printf("%-4d %-62s %11.3e %8.3f %8.3f %10lld  %s\n", index, name.c_str(), s.max_abs, s.max_ulp,
              s.max_tol_ratio, static_cast<long long>(s.checked), s.failures == 0 ? "PASS" : "FAIL");
  if (s.failures > 0) {
    std::printf("     %lld failures; first: %s\n", static_cast<long long>(s.failures), s.first_failure.c_str());
  }
}

}  // namespace astrai_test
