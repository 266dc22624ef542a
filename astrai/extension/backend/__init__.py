"""Policy layer, one module per op family: capability checks, choice of implementation, torch fallbacks; and
`paged_kv_cache`, the storage that attention reads.

Importing this package loads no kernel.
"""

from astrai.extension.backend import attention, gemm, paged_kv_cache, quantize, rotary

__all__ = ["attention", "gemm", "paged_kv_cache", "quantize", "rotary"]
