"""astrai.extension: the supported public API of astrai-kernels.

Importing it never fails and loads no kernel; the first call that needs one loads its family from the
image the loader picks (`python -m astrai.extension info` explains the choice).

Example::

    import torch
    from astrai.extension import apply_rotary_emb_qk, rotary_cos_sin_cache

    cos, sin = rotary_cos_sin_cache(4096, 128, device="cuda")          # float32 [4096, 64]
    q = torch.randn(19, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(19, 8, 128, device="cuda", dtype=torch.bfloat16)
    q, k = apply_rotary_emb_qk(q, k, (cos, sin), torch.arange(19, device="cuda"))
"""

from astrai.extension import loader
from astrai.extension.backend.rotary import apply_rotary_emb, apply_rotary_emb_qk, rotary_cos_sin_cache

__all__ = ["apply_rotary_emb", "apply_rotary_emb_qk", "rotary_cos_sin_cache", "loader"]

if hasattr(loader, "info"):
    info = loader.info
    __all__.append("info")
