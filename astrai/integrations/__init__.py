"""Integrations of astrai's kernels with other libraries; each imports its library only when called.

- `astrai.integrations.transformers`: `register()` adds `attn_implementation="astrai"` to Hugging Face transformers.
"""
