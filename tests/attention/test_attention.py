"""Tier 0 (CPU): the torch attention backend against a float64 reference (ragged, paged, masks, causal
offsets, every GQA ratio), the PagedKVCache on CPU, the selection policy, and the real image's attention ops
without a GPU: schemas, validation messages, fake (meta) implementations.

Tests marked `requires_cuda_kernels("attention")` need the image (`nox -s build`); without it they skip.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from reference import attention as ref

import astrai.extension as ext
from astrai.extension import ATTN_BACKEND, PagedKVCache, attention, attn_backend, set_op
from astrai.extension.backend import attention as backend
from astrai.extension.ops import attention as ops

kernels = pytest.mark.requires_cuda_kernels("attention")

CONTRACT_SCHEMAS = {
    "attn_decode": "attn_decode(Tensor q, Tensor k, Tensor v, Tensor? kv_lens, Tensor? mask, float scale, "
                   "int kv_split_size) -> Tensor",
    "attn_paged_decode": "attn_paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, "
                         "Tensor kv_lens, Tensor? mask, float scale, int kv_split_size) -> Tensor",
    "paged_kv_append": "paged_kv_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, "
                       "Tensor page_table, Tensor seq_ids, Tensor positions) -> ()",
}
GQA = [(4, 4), (8, 4), (8, 2), (8, 1), (16, 2), (12, 1)]  # ratios 1, 2, 4, 8, 8, MQA 12


@pytest.fixture(autouse=True)
def clean_selection():
    """Every test starts and ends with automatic selection and no environment seed pending."""
    saved = (backend._process_choice, backend._env_seed_read)
    backend._process_choice, backend._env_seed_read = None, True
    yield
    backend._process_choice, backend._env_seed_read = saved


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def close64(out, want, tol=2e-5):
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


# --- the torch backend against the float64 reference ---------------------------------------------------------

@pytest.mark.parametrize("heads", GQA, ids=[f"{a}-{b}" for a, b in GQA])
@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_backend_contiguous(heads, q_len, causal):
    hq, hkv = heads
    q, k, v = rand(3, q_len, hq, 32), rand(3, 19, hkv, 32), rand(3, 19, hkv, 32)
    kv_lens = torch.tensor([19, 7, 5], dtype=torch.int32)
    with attn_backend("torch"):
        out = attention(q, k, v, kv_lens=kv_lens, is_causal=causal)
    close64(out, ref.attention(q, k, v, kv_lens=kv_lens, is_causal=causal))


@pytest.mark.parametrize("mask_rank", [2, 3])
def test_torch_backend_masks_and_fully_masked_rows(mask_rank):
    q, k, v = rand(2, 4, 8, 16), rand(2, 11, 2, 16), rand(2, 11, 2, 16)
    mask = torch.rand(2, 4, 11) > 0.4 if mask_rank == 3 else torch.rand(2, 11) > 0.4
    mask[1] = False  # sequence 1 keeps nothing: zeros
    out = backend.BACKENDS["torch"].forward(backend._canonical(q, k, v, None, None, None, False, mask, 0.3, None))
    want = ref.attention(q, k, v, attn_mask=mask, scale=0.3)
    close64(out, want)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_torch_backend_causal_is_aligned_to_the_end():
    """Query i of a sequence with n keys sees keys j <= n - Lq + i (decode with prior context)."""
    q, k, v = rand(1, 3, 2, 8), rand(1, 10, 2, 8), rand(1, 10, 2, 8)
    out = attention(q, k, v, is_causal=True)
    for i in range(3):
        last = 10 - 3 + i
        want = ref.attention(q[:, i:i + 1], k[:, :last + 1], v[:, :last + 1])
        close64(out[:, i:i + 1], want)


def test_decode_3d_q_and_default_scale():
    q, k, v = rand(2, 8, 64), rand(2, 9, 2, 64), rand(2, 9, 2, 64)
    out = attention(q, k, v)
    assert out.shape == (2, 8, 64)
    close64(out, ref.attention(q[:, None], k, v)[:, 0])
    close64(attention(q, k, v, scale=0.5), ref.attention(q[:, None], k, v, scale=0.5)[:, 0])


def test_torch_backend_bf16_within_2x_baseline():
    q, k, v = rand(2, 1, 32, 128, dtype=torch.bfloat16), rand(2, 300, 8, 128, dtype=torch.bfloat16), \
        rand(2, 300, 8, 128, dtype=torch.bfloat16)
    truth = ref.attention(q, k, v)
    out = attention(q, k, v)
    base = ref.attention(q, k, v, upcast=False)
    assert out.dtype == torch.bfloat16
    assert (out.double() - truth).abs().max() <= 2 * (base.double() - truth).abs().max() + 1e-3


def test_torch_backend_gradients_match_reference():
    q, k, v = rand(2, 3, 4, 8), rand(2, 6, 2, 8), rand(2, 6, 2, 8)
    for t in (q, k, v):
        t.requires_grad_()
    call = backend._canonical(q, k, v, None, None, None, True, None, None, None)
    assert backend.select_backend(call).name in ("flash", "torch")  # training call: never the kernels
    out = attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    (out * grad).sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    (ref.attention(q64, k64, v64, is_causal=True) * grad.double()).sum().backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


# --- PagedKVCache on CPU ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_paged_cache_prefill_then_decode_matches_reference(page_size):
    hkv, d = 2, 16
    cache = PagedKVCache(2, hkv, d, num_pages=400 // page_size + 8, page_size=page_size, max_batch_size=4,
                         max_pages_per_seq=max(1, 300 // page_size + 2), dtype=torch.float32)
    cache.reset(3)
    prompt = [70, 10, 130]
    ks = [rand(n, hkv, d) for n in prompt]
    vs = [rand(n, hkv, d) for n in prompt]
    cache.extend(prompt)
    for layer in range(2):
        cache.append(layer, torch.cat(ks) * (layer + 1), torch.cat(vs) * (layer + 1))
    cache.extend(1)
    k_tok, v_tok = rand(3, 1, hkv, d), rand(3, 1, hkv, d)
    for layer in range(2):
        cache.append(layer, k_tok * (layer + 1), v_tok * (layer + 1))
    assert cache.lengths() == [71, 11, 131]
    assert cache.kv_lens[:3].tolist() == [71, 11, 131]

    q = rand(3, 1, 8, d)
    for layer in range(2):
        got_k, valid = ref.gather_paged(cache.k[layer], cache.page_table[:3], cache.kv_lens[:3])
        gk, gv, gvalid = cache.gather(layer)
        assert torch.equal(valid, gvalid)
        assert torch.equal(gk[gvalid], got_k[valid])
        # contiguous truth built from the inputs directly
        length = gk.shape[1]
        k_full = torch.zeros(3, length, hkv, d)
        v_full = torch.zeros(3, length, hkv, d)
        for b, n in enumerate(prompt):
            k_full[b, :n], v_full[b, :n] = ks[b] * (layer + 1), vs[b] * (layer + 1)
            k_full[b, n], v_full[b, n] = k_tok[b, 0] * (layer + 1), v_tok[b, 0] * (layer + 1)
        out = attention(q, kv_cache=cache, layer_id=layer, fwd="decode")
        close64(out, ref.attention(q, k_full, v_full, kv_lens=cache.kv_lens[:3]))
        out_c = attention(q, kv_cache=cache, layer_id=layer, is_causal=True)  # decode: causal is a no-op
        close64(out_c, ref.attention(q, k_full, v_full, kv_lens=cache.kv_lens[:3]))


def test_paged_append_reference_is_bitwise_and_drops_out_of_range():
    k_cache = rand(8, 4, 2, 8, dtype=torch.bfloat16)
    v_cache = rand(8, 4, 2, 8, dtype=torch.bfloat16)
    page_table = torch.tensor([[3, 1, -1], [0, 9, 5]], dtype=torch.int32)
    seq_ids = torch.tensor([0, 0, 1, 1, 1, 2, -1, 0], dtype=torch.int32)
    positions = torch.tensor([0, 5, 2, 6, 11, 0, 0, 9], dtype=torch.int32)  # (1,6): page 9 invalid; (0,9): page -1
    k_new, v_new = rand(8, 2, 8, dtype=torch.bfloat16), rand(8, 2, 8, dtype=torch.bfloat16)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    ref.paged_append(want_k, want_v, k_new, v_new, page_table, seq_ids, positions)
    backend.append_reference(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions)
    assert torch.equal(k_cache.view(torch.int16), want_k.view(torch.int16))
    assert torch.equal(v_cache.view(torch.int16), want_v.view(torch.int16))
    assert torch.equal(k_cache[3, 0], k_new[0]) and torch.equal(k_cache[5, 3], k_new[4])


def test_paged_cache_errors():
    with pytest.raises(ValueError, match="page_size must be a power of two"):
        PagedKVCache(1, 2, 8, num_pages=4, page_size=24, max_batch_size=1)
    cache = PagedKVCache(1, 2, 8, num_pages=2, page_size=4, max_batch_size=2, max_pages_per_seq=2,
                         dtype=torch.float32)
    cache.reset(2)
    with pytest.raises(RuntimeError, match="call extend"):
        cache.append(0, rand(2, 2, 8), rand(2, 2, 8))
    with pytest.raises(ValueError, match="more than max_pages_per_seq"):
        cache.extend([9, 0])
    with pytest.raises(RuntimeError, match="out of pages"):
        cache.extend([8, 1])
    cache.extend([3, 2])
    with pytest.raises(ValueError, match=r"k_new must be \[5, 2, 8\]"):
        cache.append(0, rand(4, 2, 8), rand(4, 2, 8))
    with pytest.raises(ValueError, match="needs every sequence to have reserved T tokens"):
        cache.append(0, rand(2, 3, 2, 8), rand(2, 3, 2, 8))
    with pytest.raises(ValueError, match="layer_id must be in"):
        cache.layer(1)


# --- the public API's arguments and the selection policy ---------------------------------------------------------

BAD_CALLS = {
    "fwd": (dict(fwd="train"), "fwd must be one of"),
    "q rank": (dict(q=rand(2, 8)), r"q must be \[B, Lq, Hq, D\]"),
    "decode q_len": (dict(q=rand(2, 3, 8, 16), fwd="decode"), "one query token per sequence"),
    "heads": (dict(q=rand(2, 1, 6, 16)), r"multiple of kv heads \(4\)"),
    "head_dim": (dict(q=rand(2, 1, 8, 32)), "head_dim 32 differs"),
    "k missing": (dict(k=None), "k and v are required"),
    "mask dtype": (dict(attn_mask=torch.ones(2, 5)), "attn_mask must be bool"),
    "mask shape": (dict(attn_mask=torch.ones(2, 4, dtype=torch.bool)), r"attn_mask must be \[B, L\]"),
    "kv_lens": (dict(kv_lens=torch.tensor([1, 2])), "kv_lens must be int32"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_public_api_rejects_bad_calls(case):
    args = dict(q=rand(2, 1, 8, 16), k=rand(2, 5, 4, 16), v=rand(2, 5, 4, 16))
    change, message = BAD_CALLS[case]
    args.update(change)
    with pytest.raises(ValueError, match=message):
        attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_cache_and_kv_are_exclusive():
    cache = PagedKVCache(1, 2, 8, num_pages=2, page_size=4, max_batch_size=1, dtype=torch.float32)
    cache.reset(1)
    with pytest.raises(ValueError, match="either k and v or kv_cache"):
        attention(rand(1, 1, 2, 8), rand(1, 4, 2, 8), rand(1, 4, 2, 8), kv_cache=cache, layer_id=0)
    with pytest.raises(ValueError, match="kv_cache needs layer_id"):
        attention(rand(1, 1, 2, 8), kv_cache=cache)


def _call(q_len=1, *, grad=False, cache=False):
    q = rand(2, q_len, 8, 128, dtype=torch.bfloat16).requires_grad_(grad)
    k, v = rand(2, 16, 2, 128, dtype=torch.bfloat16), rand(2, 16, 2, 128, dtype=torch.bfloat16)
    return backend._canonical(q, k, v, None, None, None, False, None, None, None)


def test_auto_on_cpu_picks_torch_and_names_blockers():
    call = _call()
    assert backend.select_backend(call).name == "torch"
    assert "CUDA tensors" in backend.BACKENDS["cuda"].blocker(call)
    assert "prefill kernels are not built yet" in backend.BACKENDS["cuda"].blocker(_call(4))


def test_explicit_selection_is_strict():
    q, k, v = rand(2, 1, 8, 128, dtype=torch.bfloat16), rand(2, 16, 2, 128), rand(2, 16, 2, 128)
    with attn_backend(ATTN_BACKEND.CUDA):
        with pytest.raises(ValueError, match=r"selected backend 'cuda' cannot run this call: q and K/V must be CUDA"):
            attention(q, k, v)
    set_op("attention", "cuda")
    with pytest.raises(ValueError, match="selected backend 'cuda'"):
        attention(q, k, v)
    with attn_backend("auto"):  # the context manager overrides the process choice
        assert attention(q, k.bfloat16(), v.bfloat16()).shape == q.shape
    set_op("attention", ATTN_BACKEND.TORCH)
    assert attention(q, k.bfloat16(), v.bfloat16()).shape == q.shape
    with pytest.raises(ValueError, match="unknown attention backend"):
        set_op("attention", "triton")
    with pytest.raises(ValueError, match="unknown op 'gemm'"):
        set_op("gemm", "torch")
    assert ext.set_op is set_op


def test_auto_priority_cuda_then_flash_then_torch(monkeypatch):
    call = _call()
    monkeypatch.setattr(backend.CudaBackend, "blocker", lambda self, c, check_available=True: None)
    assert backend.select_backend(call).name == "cuda"
    monkeypatch.setattr(backend.FlashAttnBackend, "blocker", lambda self, c: None)
    assert backend.select_backend(call).name == "cuda"
    monkeypatch.setattr(backend.CudaBackend, "blocker", lambda self, c, check_available=True: "no")
    assert backend.select_backend(call).name == "flash"
    # training calls (grad, no cache) never consider the kernels
    monkeypatch.setattr(backend.CudaBackend, "blocker", lambda self, c, check_available=True: None)
    assert backend.select_backend(_call(grad=True)).name == "flash"
    monkeypatch.setattr(backend.FlashAttnBackend, "blocker", lambda self, c: "no")
    assert backend.select_backend(_call(grad=True)).name == "torch"


def test_cuda_backend_prefill_raises_not_implemented():
    with pytest.raises(NotImplementedError, match="prefill kernels are not built yet"):
        backend.BACKENDS["cuda"].forward(_call(4))


def test_astr_backend_env_is_a_deprecated_seed(monkeypatch):
    monkeypatch.setenv("ASTR_BACKEND", "cuda")
    backend._env_seed_read = False
    with pytest.warns(DeprecationWarning, match="ASTR_BACKEND is deprecated"):
        with pytest.raises(ValueError, match="selected backend 'cuda'"):
            attention(rand(1, 1, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8))
    monkeypatch.setenv("ASTR_BACKEND", "torch")  # read once: a later change is ignored
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="selected backend 'cuda'"):
            attention(rand(1, 1, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8))


def test_custom_backend_instance():
    class Zeros(backend.AttentionBackend):
        name = "zeros"

        def forward(self, call):
            return torch.zeros_like(call.q)

    with attn_backend(Zeros()):
        assert torch.equal(attention(rand(1, 2, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8)), torch.zeros(1, 2, 2, 8))
    with pytest.raises(TypeError):
        backend.AttentionBackend()


# --- the real image on a CPU machine --------------------------------------------------------------------------

@kernels
@pytest.mark.parametrize("name", list(CONTRACT_SCHEMAS))
def test_schema_matches_contract(name):
    ops.load()
    schema = getattr(torch.ops.astrai, name).default._schema
    assert str(schema) == str(torch._C.parse_schema("astrai::" + CONTRACT_SCHEMAS[name]))


def _valid_decode(paged=False):
    q = rand(3, 8, 128, dtype=torch.bfloat16)
    if paged:
        k = rand(10, 16, 2, 128, dtype=torch.bfloat16)
        return dict(q=q, k=k, v=k.clone(), page_table=torch.zeros(3, 4, dtype=torch.int32),
                    kv_lens=torch.tensor([5, 64, 1], dtype=torch.int32), mask=None)
    k = rand(3, 40, 2, 128, dtype=torch.bfloat16)
    return dict(q=q, k=k, v=k.clone(), kv_lens=torch.tensor([5, 40, 1], dtype=torch.int32), mask=None)


def _call_decode(a, paged):
    if paged:
        return torch.ops.astrai.attn_paged_decode(a["q"], a["k"], a["v"], a["page_table"], a["kv_lens"], a["mask"],
                                                  a.get("scale", 0.1), a.get("split", 0))
    return torch.ops.astrai.attn_decode(a["q"], a["k"], a["v"], a["kv_lens"], a["mask"], a.get("scale", 0.1),
                                        a.get("split", 0))


# (paged, argument the message must name, what, change, message fragment)
BAD_OPS = [
    (False, "q", "dtype", lambda a: a.update(q=a["q"].float()), "must be bfloat16"),
    (False, "k", "dtype", lambda a: a.update(k=a["k"].half()), "must be bfloat16"),
    (False, "q", "rank", lambda a: a.update(q=a["q"][None]), "must be 3-D"),
    (False, "head_dim", "unsupported", lambda a: a.update(q=a["q"][..., :96], k=a["k"][..., :96], v=a["v"][..., :96]),
     "must be 64, 128 or 256"),
    (False, "heads", "mismatch", lambda a: a.update(q=a["q"][:, :7]), "must be a positive multiple"),
    (False, "k", "head_dim", lambda a: a.update(k=a["k"][..., :64], v=a["v"][..., :64]), "must equal head_dim"),
    (False, "v", "shape", lambda a: a.update(v=a["v"][:, :30]), "must have the shape of k"),
    (False, "k", "batch", lambda a: a.update(k=a["k"][:2], v=a["v"][:2]), "must equal the batch"),
    (False, "kv_lens", "dtype", lambda a: a.update(kv_lens=a["kv_lens"].long()), "must be int32"),
    (False, "kv_lens", "size", lambda a: a.update(kv_lens=a["kv_lens"][:2]), "must have 3 elements"),
    (False, "mask", "dtype", lambda a: a.update(mask=torch.ones(3, 40)), "must be bool"),
    (False, "mask", "shape", lambda a: a.update(mask=torch.ones(3, 39, dtype=torch.bool)), "must equal the keys"),
    (False, "scale", "value", lambda a: a.update(scale=float("nan")), "must be finite"),
    (False, "kv_split_size", "value", lambda a: a.update(split=-1), "must be >= 0"),
    (False, "k", "layout", lambda a: a.update(k=rand(3, 40, 2, 129, dtype=torch.bfloat16)[..., 1:]),
     "must be 16-byte aligned"),
    (True, "page_size", "not a power of two", lambda a: a.update(k=a["k"][:, :12], v=a["v"][:, :12]),
     "must be a power of two"),
    (True, "page_table", "dtype", lambda a: a.update(page_table=a["page_table"].long()), "must be int32"),
    (True, "page_table", "batch", lambda a: a.update(page_table=a["page_table"][:2]), "must equal the batch"),
    (True, "page_table", "rank", lambda a: a.update(page_table=a["page_table"][0]), "must be 2-D"),
    (True, "kv_lens", "size", lambda a: a.update(kv_lens=a["kv_lens"][:1]), "must have 3 elements"),
    (True, "mask", "rank", lambda a: a.update(mask=torch.ones(3, 4, 5, dtype=torch.bool)), "must be 2-D"),
    (True, "v_cache", "shape", lambda a: a.update(v=a["v"][:9]), "must have the shape of k_cache"),
]


@kernels
@pytest.mark.parametrize("paged,argument,what,change,message", BAD_OPS,
                         ids=[f"{'paged' if p else 'contig'}-{arg}-{w}" for p, arg, w, _, _ in BAD_OPS])
def test_op_validation_names_op_and_argument(paged, argument, what, change, message):
    ops.load()
    args = _valid_decode(paged)
    change(args)
    with pytest.raises(RuntimeError) as info:
        _call_decode(args, paged)
    text = str(info.value)
    name = "attn_paged_decode" if paged else "attn_decode"
    assert re.search(rf"astrai\.{name}\b", text), f"op name not in: {text}"
    assert argument in text and message in text, f"expected {argument!r} and {message!r} in: {text}"
    assert "must be a CUDA tensor" not in text, f"validation ran after the device check: {text}"


@kernels
@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_decode_on_cpu_raises_must_be_cuda(paged):
    ops.load()
    with pytest.raises(RuntimeError, match=r"astrai\.attn_(paged_)?decode: q must be a CUDA tensor"):
        _call_decode(_valid_decode(paged), paged)


APPEND_BAD = [
    ("k_new", lambda a: a.update(k_new=a["k_new"].float()), "must be bfloat16"),
    ("k_new", lambda a: a.update(k_new=a["k_new"][:, :1], v_new=a["v_new"][:, :1]), "to match k_cache"),
    ("v_new", lambda a: a.update(v_new=a["v_new"][:2]), "must have the shape of k_new"),
    ("seq_ids", lambda a: a.update(seq_ids=a["seq_ids"][:2]), "must have 3 elements"),
    ("positions", lambda a: a.update(positions=a["positions"].long()), "must be int32"),
    ("page_table", lambda a: a.update(page_table=a["page_table"].float()), "must be int32"),
    ("page_size", lambda a: a.update(k_cache=a["k_cache"][:, :3], v_cache=a["v_cache"][:, :3]),
     "must be a power of two"),
]


def _valid_append():
    k_cache = rand(10, 16, 2, 128, dtype=torch.bfloat16)
    return dict(k_cache=k_cache, v_cache=k_cache.clone(), k_new=rand(3, 2, 128, dtype=torch.bfloat16),
                v_new=rand(3, 2, 128, dtype=torch.bfloat16), page_table=torch.zeros(2, 4, dtype=torch.int32),
                seq_ids=torch.zeros(3, dtype=torch.int32), positions=torch.arange(3, dtype=torch.int32))


@kernels
@pytest.mark.parametrize("argument,change,message", APPEND_BAD, ids=[f"{a}-{m}" for a, _, m in APPEND_BAD])
def test_append_validation(argument, change, message):
    ops.load()
    a = _valid_append()
    change(a)
    with pytest.raises(RuntimeError) as info:
        torch.ops.astrai.paged_kv_append(*a.values())
    text = str(info.value)
    assert "astrai.paged_kv_append" in text and argument in text and message in text, text
    assert "must be a CUDA tensor" not in text


@kernels
def test_append_on_cpu_raises_must_be_cuda():
    ops.load()
    with pytest.raises(RuntimeError, match=r"astrai\.paged_kv_append: k_cache must be a CUDA tensor"):
        torch.ops.astrai.paged_kv_append(*_valid_append().values())


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@kernels
def test_fakes_on_meta():
    ops.load()
    q = _meta(4, 1, 32, 128)
    k = _meta(4, 100, 8, 128)
    out = ops.attn_decode(q, k, k, _meta(4, dtype=torch.int32))
    assert out.shape == (4, 1, 32, 128) and out.is_meta and out.dtype == torch.bfloat16
    cache = _meta(50, 16, 8, 128)
    out = ops.attn_paged_decode(q[:, 0], cache, cache, _meta(4, 7, dtype=torch.int32), _meta(4, dtype=torch.int32))
    assert out.shape == (4, 32, 128)
    assert ops.paged_kv_append(cache, cache, _meta(4, 8, 128), _meta(4, 8, 128), _meta(4, 7, dtype=torch.int32),
                               _meta(4, dtype=torch.int32), _meta(4, dtype=torch.int32)) is None
    with pytest.raises(ValueError, match=r"a 4-D q must be \[B, 1, Hq, D\]"):
        ops.attn_decode(_meta(4, 2, 32, 128), k, k)


@kernels
@pytest.mark.parametrize("name", list(CONTRACT_SCHEMAS))
def test_opcheck_on_meta(name):
    """opcheck returns early on meta inputs; this proves the op and its fake accept these arguments."""
    ops.load()
    i32 = torch.int32
    args = {
        "attn_decode": (_meta(4, 32, 128), _meta(4, 64, 8, 128), _meta(4, 64, 8, 128), _meta(4, dtype=i32), None,
                        0.1, 0),
        "attn_paged_decode": (_meta(4, 32, 128), _meta(9, 16, 8, 128), _meta(9, 16, 8, 128), _meta(4, 3, dtype=i32),
                              _meta(4, dtype=i32), _meta(4, 40, dtype=torch.bool), 0.1, 64),
        "paged_kv_append": (_meta(9, 16, 8, 128), _meta(9, 16, 8, 128), _meta(5, 8, 128), _meta(5, 8, 128),
                            _meta(4, 3, dtype=i32), _meta(5, dtype=i32), _meta(5, dtype=i32)),
    }[name]
    torch.library.opcheck(getattr(torch.ops.astrai, name).default, args, test_utils=("test_schema", "test_faketensor"))


@kernels
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: tests/gpu runs the smoke test")
def test_smoke_test_without_gpu_raises():
    with pytest.raises(RuntimeError, match="no CUDA device is visible"):
        ops.smoke_test()
