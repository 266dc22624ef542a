"""Policy layer, one module per op family: capability checks, choice of implementation, torch fallbacks.

Importing this package loads no kernel.
"""

from astrai.extension.backend import attention, quantize, rotary

__all__ = ["attention", "quantize", "rotary"]
