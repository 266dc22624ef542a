"""The README's user paths as code: the "Three ways in" block read from README.md and run as written, with the names
it leaves to the reader (model, data, x, path, inputs) bound to small stand-ins on a given device."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "### Three ways in"


def three_ways_block() -> str:
    """The first python block after the README's "Three ways in" heading."""
    text = README.read_text()
    start = text.index(HEADING)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    if match is None:
        raise AssertionError(f"README.md: no python block after {HEADING!r}")
    return match.group(1)


def run_three_ways(device: str, workdir: Path) -> dict:
    """Runs the block on `device` in `workdir` (it saves q.pt there); returns its namespace. The fp8 and quantized
    paths get a bf16 MLP whose sizes every mode takes, the transformers path a tiny random Llama saved to workdir
    (nothing is downloaded) and a padded batch of two prompts."""
    import transformers

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    mlp = mlp.to(device, torch.bfloat16)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=256, pad_token_id=0)
    transformers.LlamaForCausalLM(config).save_pretrained(workdir / "tiny-llama")
    ids = torch.randint(1, 128, (2, 9), device=device)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    namespace = {
        "torch": torch,
        "AutoModelForCausalLM": transformers.AutoModelForCausalLM,
        "model": mlp,
        "data": [torch.randn(16, 64, device=device, dtype=torch.bfloat16) for _ in range(3)],
        "x": torch.randn(16, 64, device=device, dtype=torch.bfloat16),
        "path": str(workdir / "tiny-llama"),
        "inputs": {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "do_sample": False},
    }
    code = three_ways_block()
    # from_pretrained loads on the CPU; the block's model is then moved where the test asks (a no-op on the CPU).
    load = 'attn_implementation="astrai", dtype=torch.bfloat16)\n'
    if code.count(load) != 1:
        raise AssertionError(f"README.md: the transformers path no longer loads with {load.strip()!r}; update "
                             "tests/support/readme.py")
    code = code.replace(load, load[:-1] + ".to(DEVICE)\n")
    namespace["DEVICE"] = device
    exec(compile(code, str(README) + ":three-ways", "exec"), namespace)  # noqa: S102 - our own README
    return namespace
