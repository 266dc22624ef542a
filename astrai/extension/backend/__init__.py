"""Policy layer, one module per op family: capability checks, choice of implementation, torch fallbacks.

Importing this package loads no kernel.
"""

from astrai.extension.backend import rotary

__all__ = ["rotary"]
