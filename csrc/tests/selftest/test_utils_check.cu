// Host-only dump of test_utils.cuh's bf16/fp8 conversions, compared with torch's casts by
// tests/harness/test_cu_harness.py (no GPU needed). Prints "<fmt> <float bits hex> <code hex> <decoded>" lines.
#include <cstdio>
#include <cstring>

#include "csrc/tests/test_utils.cuh"

using namespace astrai_test;

static unsigned bits_of(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

int main() {
  for (int code = 0; code < 256; ++code) {
    std::printf("dec_e4m3 %02x %08x\n", code, bits_of(e4m3_to_float(uint8_t(code))));
    std::printf("dec_e5m2 %02x %08x\n", code, bits_of(e5m2_to_float(uint8_t(code))));
  }
  Rng rng(1234);
  for (int i = 0; i < 4000; ++i) {
    const float wide = float(rng.uniform(-480.0, 480.0));
    const float narrow = float(rng.uniform(-0.05, 0.05));  // subnormals and the smallest normals
    for (float f : {wide, narrow}) {
      std::printf("enc_e4m3 %08x %02x\n", bits_of(f), float_to_e4m3(f));
      std::printf("enc_e5m2 %08x %02x\n", bits_of(f), float_to_e5m2(f));
      std::printf("enc_bf16 %08x %04x\n", bits_of(f), float_to_bf16(f));
    }
  }
  return 0;
}
