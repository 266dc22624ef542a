"""Stateless wrappers over torch.ops.astrai.*, one module per op family; they run the kernel or raise.

Importing this package loads no kernel: each wrapper loads its family on first use.
"""

from astrai.extension.ops import attention, gemm, quantize, rotary

__all__ = ["attention", "gemm", "quantize", "rotary"]
