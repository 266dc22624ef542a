"""Tier 0 (CPU): `attn_implementation="astrai"` in transformers (the pinned version), on the CPU through our
attention's torch path. Covers: registration; greedy generation from a left-padded batch equal to sdpa's for a
GQA Llama, a sliding-window Mistral and a head_dim 256 Gemma, with our attention really called in prefill (a
[B, Lq, L] mask or causal) and decode; the calls we do not compute (soft-capping, dropout, float or per-head masks)
sent to sdpa with their reason; quantized linears under a transformers model, their q / k / v and gate / up
fused (and a BART model's cross-attention groups breaking up).
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

transformers = pytest.importorskip("transformers")

import astrai.extension as ae  # noqa: E402
import astrai.integrations.transformers as astrai_hf  # noqa: E402
from astrai.extension.backend import attention as attention_backend  # noqa: E402

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0)


def _model(kind: str, dtype=torch.float32):
    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    elif kind == "mistral":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**TINY, sliding_window=5))
    elif kind == "gemma":  # head_dim 256 with a small hidden size, as Gemma's configurations have
        model = transformers.GemmaForCausalLM(transformers.GemmaConfig(**{**TINY, "head_dim": 256}))
    elif kind == "gemma2":  # logit soft-capping: not ours
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**TINY, attn_logit_softcapping=50.0,
                                                                         sliding_window=8))
    return model.to(dtype).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 128, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.fixture
def calls(monkeypatch):
    """Each astrai attention call made through the integration: (q_len, mask shape or None, is_causal)."""
    seen = []
    real = attention_backend.attention

    def counting(q, k=None, v=None, **kw):
        mask = kw.get("attn_mask")
        seen.append((q.shape[1], None if mask is None else tuple(mask.shape), kw.get("is_causal")))
        return real(q, k, v, **kw)

    monkeypatch.setattr(ae, "attention", counting)
    astrai_hf.reset()
    return seen


def _generate(model, impl, ids, mask, tokens=12):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False)


def test_register_is_idempotent_and_named():
    assert astrai_hf.register() == "astrai" and astrai_hf.register() == "astrai"
    assert transformers.AttentionInterface._global_mapping["astrai"] is astrai_hf.attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    assert AttentionMaskInterface._global_mapping["astrai"] is sdpa_mask


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma"])
def test_greedy_generation_equals_sdpa(kind, calls):
    astrai_hf.register()
    model = _model(kind)
    ids, mask = _batch()
    want = _generate(model, "sdpa", ids, mask)
    assert not calls
    got = _generate(model, "astrai", ids, mask)
    assert torch.equal(got, want)
    assert astrai_hf.fallback_reasons() == {}
    layers = model.config.num_hidden_layers
    assert len(calls) == layers * 12  # one prefill and eleven decode steps, every layer
    assert calls[0] == (11, (3, 11, 11), False)  # the padded prefill: a keep mask [B, Lq, L]
    # decode: [B, L] (the sliding-window cache keeps the window's keys only)
    assert calls[layers] == (1, (3, 5 if kind == "mistral" else 12), False)


def test_unpadded_prefill_is_causal_without_a_mask(calls):
    astrai_hf.register()
    model = _model("llama")
    ids = torch.randint(1, 128, (2, 9))
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        want = model(ids).logits
        model.set_attn_implementation("astrai")
        got = model(ids).logits
    assert calls[0] == (9, None, True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_soft_capping_runs_sdpa_with_the_reason(calls):
    astrai_hf.register()
    model = _model("gemma2")
    ids, mask = _batch()
    want = _generate(model, "sdpa", ids, mask, tokens=4)
    got = _generate(model, "astrai", ids, mask, tokens=4)
    assert torch.equal(got, want) and not calls
    assert list(astrai_hf.fallback_reasons()) == ["logit soft-capping (softcap) is not supported"]


def test_unsupported_reasons():
    q, k = torch.zeros(1, 4, 3, 16), torch.zeros(1, 2, 3, 16)
    why = astrai_hf.unsupported_reason
    assert why(q, k, None, 0.0, {}) is None
    assert why(q, k, torch.ones(1, 1, 3, 3, dtype=torch.bool), 0.0, {"softcap": None, "sliding_window": 4}) is None
    assert "dropout 0.1" in why(q, k, None, 0.1, {})
    assert "additive torch.float32 mask" in why(q, k, torch.zeros(1, 1, 3, 3), 0.0, {})
    assert "per-head mask" in why(q, k, torch.ones(1, 4, 3, 3, dtype=torch.bool), 0.0, {})
    assert "attention sinks" in why(q, k, None, 0.0, {"s_aux": torch.zeros(4)})
    assert "attention weights" in why(q, k, None, 0.0, {"output_attentions": True})
    assert "head_dim 8 differs" in why(q, torch.zeros(1, 2, 3, 8), None, 0.0, {})


@pytest.mark.parametrize("mode", ["w8a16", "fp8"])
def test_quantized_linears_under_a_transformers_model(mode):
    astrai_hf.register()
    model = _model("llama", torch.bfloat16)
    ids, mask = _batch()
    model.set_attn_implementation("astrai")
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        ae.quantize_linear_(model, mode, skip=["lm_head"])
        got = model(input_ids=ids, attention_mask=mask).logits
    assert isinstance(model.model.layers[0].self_attn.q_proj, ae.QuantLinear)
    assert type(model.lm_head) is torch.nn.Linear
    keep = mask.bool()
    rel = ((got[keep].float() - want[keep].float()).norm() / want[keep].float().norm()).item()
    assert rel < {"w8a16": 0.03, "fp8": 0.1}[mode], rel


@pytest.mark.parametrize("grad", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("kind", ["llama", "gemma"])
@pytest.mark.parametrize("mode", ["w8a16", "w8a8", "fp8"])
def test_fused_projections_generate_what_the_unfused_layers_do(kind, mode, grad, monkeypatch):
    """quantize_linear_(..., fuse=True) on a transformers model: every q / k / v and gate / up group stacked (4 GEMMs
    a layer instead of 7), the same logits and greedy tokens as the unfused layers on the torch path."""
    from astrai.extension.backend import linear as linear_backend
    astrai_hf.register()
    base = _model(kind, torch.bfloat16)
    base.set_attn_implementation("astrai")
    apart = ae.quantize_linear_(copy.deepcopy(base), mode, skip=["lm_head"])
    fused = ae.quantize_linear_(copy.deepcopy(base), mode, skip=["lm_head"], fuse=True)
    for layer in fused.model.layers:
        assert layer.self_attn.q_proj._siblings.names == ("q_proj", "k_proj", "v_proj")
        assert layer.mlp.gate_proj._siblings.names == ("gate_proj", "up_proj")
    ids, mask = _batch()
    gemms = []
    real = linear_backend.quant_gemm
    monkeypatch.setattr(linear_backend, "quant_gemm", lambda a, b, **kw: gemms.append(b.shape[0]) or real(a, b, **kw))
    no_grad = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[grad]
    with no_grad():
        want = apart(input_ids=ids, attention_mask=mask).logits
        n = len(gemms)
        got = fused(input_ids=ids, attention_mask=mask).logits
        assert n == 7 * TINY["num_hidden_layers"] and len(gemms) - n == 4 * TINY["num_hidden_layers"]
        assert torch.equal(got, want)  # the torch path computes a column alike whatever N
        fused.set_attn_implementation("astrai")
        apart.set_attn_implementation("astrai")
        got = fused.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
        assert torch.equal(got, apart.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False))


def test_fused_projections_in_an_encoder_decoder_model(caplog):
    """BART's cross-attention reads its k / v off the encoder's states (once; later steps take them from the cache),
    not off its q's input: those groups break up (logged), the self-attention ones stay stacked, and greedy generation
    equals the unfused layers'."""
    config = transformers.BartConfig(vocab_size=128, d_model=64, encoder_layers=1, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                     decoder_ffn_dim=128, max_position_embeddings=64, pad_token_id=1, bos_token_id=0,
                                     eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
    torch.manual_seed(0)
    base = transformers.BartForConditionalGeneration(config).to(torch.bfloat16).eval()
    apart = ae.quantize_linear_(copy.deepcopy(base), "w8a16")
    fused = ae.quantize_linear_(copy.deepcopy(base), "w8a16", fuse=True)
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="astrai.extension"):
        got = fused.generate(input_ids=ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
        want = apart.generate(input_ids=ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert torch.equal(got, want)
    for layer in fused.model.decoder.layers:
        assert layer.encoder_attn.q_proj._siblings.apart
        assert not layer.self_attn.q_proj._siblings.apart
    assert not fused.model.encoder.layers[0].self_attn.q_proj._siblings.apart
    assert caplog.text.count("q_proj+k_proj+v_proj now run apart") == config.decoder_layers


@pytest.fixture
def rotary_patched():
    report = astrai_hf.patch_rotary()
    yield report
    astrai_hf.unpatch_rotary()


def test_patch_rotary_routes_llama_family_models_and_unpatches(rotary_patched, monkeypatch):
    from transformers.models.llama import modeling_llama
    from transformers.models.phi3 import modeling_phi3
    assert rotary_patched["llama"] == "patched" and rotary_patched["gemma"] == "patched"
    assert hasattr(modeling_llama.apply_rotary_pos_emb, "astrai_original")
    assert "differs from Llama's" in astrai_hf.patch_rotary(["phi3"])["phi3"]  # partial rotary: another layout
    assert not hasattr(modeling_phi3.apply_rotary_pos_emb, "astrai_original")
    seen = []
    real = ae.apply_rotary_emb_qk
    monkeypatch.setattr(ae, "apply_rotary_emb_qk", lambda *a, **kw: seen.append(a[0].shape) or real(*a, **kw))
    astrai_hf.register()
    model = _model("llama")
    ids, mask = _batch()
    got = _generate(model, "astrai", ids, mask, tokens=4)
    assert len(seen) == 2 * 4 and seen[0] == (3, 11, 4, 16)  # [B, L, H, D] views, every layer and step
    astrai_hf.unpatch_rotary()
    assert not hasattr(modeling_llama.apply_rotary_pos_emb, "astrai_original")
    assert torch.equal(got, _generate(model, "astrai", ids, mask, tokens=4))  # float32: the same tokens


def test_patched_rotary_matches_transformers_numerically(rotary_patched):
    from transformers.models.llama import modeling_llama
    q, k = torch.randn(2, 4, 9, 32), torch.randn(2, 2, 9, 32)
    freqs = torch.randn(2, 9, 16)
    cos, sin = torch.cat([freqs.cos(), freqs.cos()], -1), torch.cat([freqs.sin(), freqs.sin()], -1)
    got = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    want = modeling_llama.apply_rotary_pos_emb.astrai_original(q, k, cos, sin)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    # positions shared by the batch (a forward without position_ids): cos / sin [1, L, D]
    got = modeling_llama.apply_rotary_pos_emb(q, k, cos[:1], sin[:1])
    want = modeling_llama.apply_rotary_pos_emb.astrai_original(q, k, cos[:1], sin[:1])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    # layouts it does not take go to transformers' own function, bitwise
    bits = modeling_llama.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)
    ref = modeling_llama.apply_rotary_pos_emb.astrai_original(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 2)
    assert all(torch.equal(a, b) for a, b in zip(bits, ref))


def test_torch_compile_fullgraph_matches_eager():
    """The model's forward with our attention traced whole (aot_eager on the CPU; the GPU tier runs inductor)."""
    astrai_hf.register()
    model = _model("llama")
    model.set_attn_implementation("astrai")
    ids, mask = _batch()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_torch_compile_fullgraph_takes_the_stacked_gemms(kind, monkeypatch):
    """quantize_linear_(..., fuse=True) traced whole: transformers' attention and MLP forwards pass the source rule
    (`calls_on_one_input`), so the graph holds 4 GEMMs a layer, and its logits equal eager's."""
    from astrai.extension.backend import linear as linear_backend
    astrai_hf.register()
    model = ae.quantize_linear_(_model(kind, torch.bfloat16), "w8a16", skip=["lm_head"], fuse=True)
    model.set_attn_implementation("astrai")
    layer = model.model.layers[0]
    assert layer.self_attn.q_proj._siblings.traced_ok and layer.mlp.gate_proj._siblings.traced_ok
    ids, mask = _batch()
    gemms = []
    real = linear_backend.quant_gemm
    monkeypatch.setattr(linear_backend, "quant_gemm", lambda a, b, **kw: gemms.append(b.shape[0]) or real(a, b, **kw))
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(input_ids=ids, attention_mask=mask).logits
        assert len(gemms) == 4 * TINY["num_hidden_layers"]  # counted while tracing: the graph's GEMMs
        assert torch.equal(got, model(input_ids=ids, attention_mask=mask).logits)


class _FakePagedCache:
    """Stands in for transformers' PagedAttentionCache: `update` returns the packed K / V of every sequence."""

    def __init__(self, k, v):
        self.k, self.v, self.calls = k, v, 0

    def update(self, key_states, value_states, layer_idx, read_index, write_index):
        self.calls += 1
        return self.k, self.v


def test_paged_forward_matches_transformers_paged_sdpa():
    """Packed q of three sequences (a prefill, a chunk after cached keys, a decode token) against the keys read from
    the cache: our packed causal call equals transformers' paged sdpa given the equivalent block-causal mask."""
    from transformers.integrations.sdpa_paged import sdpa_attention_paged_forward
    astrai_hf.register()
    q_lens, k_lens = [5, 3, 1], [5, 7, 9]
    hq, hkv, d = 4, 2, 16
    tq, tk = sum(q_lens), sum(k_lens)
    q = torch.randn(1, hq, tq, d)
    k, v = torch.randn(tk, hkv, d), torch.randn(tk, hkv, d)
    cu_q = torch.tensor([0, 5, 8, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 12, 21], dtype=torch.int32)
    keep = torch.zeros(1, 1, tq, tk, dtype=torch.bool)
    for b, (lq, lk) in enumerate(zip(q_lens, k_lens)):
        for i in range(lq):
            end = cu_k[b] + lk - lq + i + 1
            keep[0, 0, cu_q[b] + i, cu_k[b]:end] = True
    module = torch.nn.Module()
    module.layer_idx, module.num_key_value_groups = 0, hq // hkv
    kwargs = dict(cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k, read_index=[], write_index=[])
    cache = _FakePagedCache(k, v)
    got, _ = astrai_hf.paged_attention_forward(module, q, k[None].transpose(1, 2), v[None].transpose(1, 2), keep,
                                               scaling=d ** -0.5, cache=cache, **kwargs)
    want, _ = sdpa_attention_paged_forward(module, q, k[None].transpose(1, 2), v[None].transpose(1, 2), keep,
                                           scaling=d ** -0.5, cache=_FakePagedCache(k, v), **kwargs)
    assert cache.calls == 1 and got.shape == (tq, hq, d)
    torch.testing.assert_close(got, want.reshape(tq, hq, d), rtol=1e-5, atol=1e-5)
    assert transformers.AttentionInterface._global_mapping["paged|astrai"] is astrai_hf.paged_attention_forward
    astrai_hf.reset()
    module.sliding_window = 4  # a sliding layer: transformers' paged sdpa
    astrai_hf.paged_attention_forward(module, q, k[None].transpose(1, 2), v[None].transpose(1, 2), keep,
                                      scaling=d ** -0.5, cache=_FakePagedCache(k, v),
                                      **dict(kwargs, cu_seq_lens_k={"sliding_attention": cu_k}))
    assert list(astrai_hf.fallback_reasons()) == ["sliding-window layers (continuous batching)"]
