"""astrai: CUDA kernels for LLM inference and training in PyTorch."""
