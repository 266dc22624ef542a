// Launcher knobs read from the environment at each launch (so a test or a benchmark may flip them per call).
#pragma once

#include <cstdlib>
#include <cstring>

namespace astrai {

// Whether the environment variable `name` is set to exactly "0" (the knob is off); unset or anything else: on.
inline bool env_knob_off(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::strcmp(value, "0") == 0;
}

}  // namespace astrai
