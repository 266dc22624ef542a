// Standalone correctness table for paged decode (page sizes 1..128, ragged lengths, invalid page ids) and
// the paged KV append (bitwise): attn_test.cu built with the paged KV source.
// Usage: attn_paged_test [--small] [--seed N]. Exit status: 0 all pass, 1 a case failed, 2 a CUDA error.
#define ASTRAI_ATTN_TEST_PAGED 1
#include "tests/attn_test.cu"
