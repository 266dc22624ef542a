"""The delayed-scaling model the device ring replaced, and a training loop that compares the two bit for bit;
shared by the CPU (tests/quantize) and GPU (tests/gpu/quantize) tiers.

- `PythonRing`: `DelayedScaling`'s amax history before the fold op, verbatim (the slot a Python int, a tensor
  write per step, the multiplier recomputed from the ring); it takes `_History`'s arguments.
- `python_quantize_both`: `_quantize_both` before the fold op (`1.0 / mul` in Python for scale_inv).
- `stale_inverse_quantize_both`: a wrong variant for negative controls (scale_inv read after the fold).
- `train(recipe, device, steps, variant)`: a small MLP trained with SGD inside one fp8_autocast object.
"""

from __future__ import annotations

import pytest
import torch

import astrai.extension as ae
from astrai.extension.backend import quantize as backend

DELAYED = [ae.DelayedScaling(amax_history_len=4), ae.DelayedScaling(amax_history_len=3, margin=2, fp8_format="e4m3"),
           ae.DelayedScaling(amax_history_len=1)]
DELAYED_IDS = ["len4", "len3-margin2-e4m3", "len1"]


class PythonRing:
    """The model of `_History` before the fold op (see the module docstring)."""

    def __init__(self, length: int, device="cpu", *, qmax: float = 0.0, margin: int = 0):
        self.ring = torch.zeros(length, dtype=torch.float32, device=device)
        self.pos = 0
        self.steps = 0

    def scale(self, fp8_max: float, margin: int) -> torch.Tensor | None:
        if self.steps == 0:
            return None
        mul, _ = backend.scale_from_amax_torch(self.ring.amax().reshape(1), fp8_max, False)
        return mul / (2.0 ** margin)

    def fold(self, amax: torch.Tensor) -> None:
        self.ring[self.pos] = amax.reshape(())
        self.pos = (self.pos + 1) % self.ring.numel()
        self.steps += 1


def python_quantize_both(t, dtype, recipe, history):
    """The model of `_quantize_both` before the fold op, verbatim: `1.0 / mul` in Python for scale_inv."""
    mul = history.scale(backend.FP8_MAX[dtype], recipe.margin) if history is not None else None
    if mul is None:
        q, q_t, inv = backend.quantize_fp8_dynamic(t, out_dtype=dtype, granularity="tensor", layout="dual")
        if history is not None:
            history.fold(t.detach().abs().amax().float())
        return q, q_t, inv.reshape(())
    q, q_t, amax = backend.quantize_fp8(t, mul, out_dtype=dtype, layout="dual", amax="tensor", check_scale=False)
    history.fold(amax)
    return q, q_t, (1.0 / mul).reshape(())


_device_quantize_both = backend._quantize_both


def stale_inverse_quantize_both(t, dtype, recipe, history):
    """A wrong variant for the negative control: scale_inv read after the fold (the next step's)."""
    mul = history.scale() if history is not None else None
    if mul is None:
        return _device_quantize_both(t, dtype, recipe, history)
    q, q_t, amax = backend.quantize_fp8(t, mul, out_dtype=dtype, layout="dual", amax="tensor", check_scale=False)
    history.fold(amax)
    return q, q_t, history.scale_inv().reshape(())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _snapshot(t: torch.Tensor) -> torch.Tensor:
    """A host copy, floats as bits (the device state is updated in place by the next step)."""
    return (_bits(t) if t.is_floating_point() else t.detach()).to("cpu", copy=True)


def train(recipe, device: str, steps: int, variant: str = "device", *, widths=(64, 96, 32), batch=(2, 16)):
    """A small MLP (`widths`: in, hidden, out) trained with SGD inside one fp8_autocast object; inputs change scale
    and carry an outlier every third step, so the rings' maxima rise and roll out. variant "device": the code under
    test; "python": the Python ring and `_quantize_both` it replaced; "stale": the negative control. Returns per
    step the output and the gradients as bits, and the (scale, scale_inv, ring, pos) of every role of every layer,
    all on the host."""
    with pytest.MonkeyPatch.context() as patch:
        if variant == "python":
            patch.setattr(backend, "_History", PythonRing)
            patch.setattr(backend, "_quantize_both", python_quantize_both)
        elif variant == "stale":
            patch.setattr(backend, "_quantize_both", stale_inverse_quantize_both)
        gen = torch.Generator().manual_seed(5)
        torch.manual_seed(11)
        d_in, d_hidden, d_out = widths
        model = torch.nn.Sequential(torch.nn.Linear(d_in, d_hidden), torch.nn.GELU(),
                                    torch.nn.Linear(d_hidden, d_out)).to(device, torch.bfloat16)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        ctx = ae.fp8_autocast(recipe=recipe, devices=(torch.device(device).type,))
        fwd, bwd = (backend.FP8_MAX[d] for d in backend._FORMATS[recipe.fp8_format])
        record = []
        for step in range(steps):
            x = torch.randn(*batch, d_in, generator=gen) * (1.0 + 3.0 * (step % 4))
            if step % 3 == 0:
                x[0, 0, step % d_in] = 40.0 * (step + 1)
            x = x.to(device, torch.bfloat16)
            opt.zero_grad()
            with ctx:
                out = model(x)
            out.float().pow(2).mean().backward()
            states = []
            for layer in (model[0], model[2]):
                for role, qmax in (("x", fwd), ("w", fwd), ("g", bwd)):
                    h = ctx.states[id(layer.weight)][1][role]
                    if variant == "python":
                        mul = h.scale(qmax, recipe.margin)
                        states.append((mul, 1.0 / mul, h.ring, torch.tensor(h.pos)))
                    else:
                        states.append((h.scale(), h.scale_inv(), h.amax_history.ring, h.amax_history.pos))
            record.append(([_snapshot(out)] + [_snapshot(p.grad) for p in model.parameters()],
                           [[_snapshot(t) for t in s] for s in states]))
            opt.step()
        return record


def assert_same_training(got, want):
    for step, ((g_tensors, g_states), (w_tensors, w_states)) in enumerate(zip(got, want)):
        for i, (g, w) in enumerate(zip(g_tensors, w_tensors)):
            assert torch.equal(g, w), f"step {step}: {'output' if i == 0 else f'grad {i - 1}'} differs"
        for j, (gs, ws) in enumerate(zip(g_states, w_states)):
            for name, g, w in zip(("scale", "scale_inv", "ring", "pos"), gs, ws):
                assert torch.equal(g.reshape(-1), w.reshape(-1)), f"step {step}, history {j}: {name} differs"


# ---- a small transformer trained with and without fp8 ---------------------------------------------------------

class TinyLM(torch.nn.Module):
    """A pre-norm causal transformer LM: embedding, `layers` encoder layers (multi-head attention and a GELU MLP, every
    projection an nn.Linear / F.linear call), a vocabulary head."""

    def __init__(self, vocab=64, d=128, heads=4, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                                             norm_first=True) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        causal = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device, dtype=x.dtype)
        for block in self.blocks:
            x = block(x, src_mask=causal, is_causal=True)
        return self.head(x)


def markov_batches(steps: int, batch: int, seq: int, vocab: int, device, seed: int = 3):
    """Token sequences where the next token is a fixed permutation of the current one with probability 1/2, else
    uniform: the best achievable loss is ~2.73 nats at vocab 64, so a curve has a floor to track."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(vocab, generator=gen)
    out = []
    for _ in range(steps):
        ids = torch.empty(batch, seq, dtype=torch.long)
        ids[:, 0] = torch.randint(0, vocab, (batch,), generator=gen)
        for t in range(1, seq):
            follow = torch.rand(batch, generator=gen) < 0.5
            ids[:, t] = torch.where(follow, perm[ids[:, t - 1]], torch.randint(0, vocab, (batch,), generator=gen))
        out.append(ids.to(device))
    return out


def train_lm(recipe, device: str, steps: int, dtype: torch.dtype, *, batch=16, seq=32, vocab=64, lr=3e-3):
    """(per-step training losses, how many distinct weights went through fp8) of TinyLM (AdamW) on markov_batches,
    under one fp8_autocast object for `recipe` (None: no fp8). The same initial weights and data for every recipe."""
    torch.manual_seed(21)
    model = TinyLM(vocab).to(device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ctx = ae.fp8_autocast(recipe=recipe, devices=(torch.device(device).type,)) if recipe is not None else None
    routed = set()
    if ctx is not None:
        fp8_linear = ctx._fp8_linear
        ctx._fp8_linear = lambda x, w, b: (routed.add(id(w)), fp8_linear(x, w, b))[1]
    losses = []
    for ids in markov_batches(steps, batch, seq, vocab, device):
        opt.zero_grad()
        if ctx is not None:
            with ctx:
                logits = model(ids[:, :-1])
        else:
            logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, len(routed)


def window_means(losses: list[float], window: int) -> list[float]:
    return [sum(losses[i:i + window]) / window for i in range(0, len(losses) - window + 1, window)]


def curve_gap(got: list[float], want: list[float], window: int) -> float:
    """The largest |difference| of the two loss curves' window means, relative to the reference's window mean."""
    return max(abs(g - w) / w for g, w in zip(window_means(got, window), window_means(want, window)))
