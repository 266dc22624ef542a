"""Tier 0 (CPU): the output element type is `out_dtype` in every public quantize function, as in the ops layer.
The old keyword `dtype=` still works for one release with a DeprecationWarning naming the function; passing
both names raises TypeError; positional calls are unchanged; and the rename traces under torch.compile.
"""

from __future__ import annotations

import inspect
import re
import warnings

import pytest
import torch

import astrai.extension as ae
from astrai.extension import quantize as aq

E5M2 = torch.float8_e5m2  # not the default, so a call that dropped the argument would show


def _history_quantize(x, *args, **kwargs):
    return aq.AmaxHistory(4, qmax=57344.0, path="torch").quantize(x, *args, **kwargs)


# name (as messages spell it) -> call(x, *positional out_dtype, **keywords); every call takes the torch path.
CALLS = {
    "quantize_fp8": lambda x, *a, **k: aq.quantize_fp8(x, torch.tensor([2.0]), *a, path="torch", **k),
    "quantize_fp8_dynamic": lambda x, *a, **k: aq.quantize_fp8_dynamic(x, *a, granularity="row", path="torch", **k),
    "quantize_fp8_block": lambda x, *a, **k: aq.quantize_fp8_block(x, *a, path="torch", **k),
    "AmaxHistory.quantize": _history_quantize,
}
FUNCTIONS = {"quantize_fp8": aq.quantize_fp8, "quantize_fp8_dynamic": aq.quantize_fp8_dynamic,
             "quantize_fp8_block": aq.quantize_fp8_block, "AmaxHistory.quantize": aq.AmaxHistory.quantize}


def _x() -> torch.Tensor:
    return (torch.randn(19, 256, generator=torch.Generator().manual_seed(5)) * 3).bfloat16()


def _assert_same(got: tuple, want: tuple) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:
            assert g is None, f"output {i}: {type(g).__name__} where None was expected"
            continue
        assert g.dtype == w.dtype and g.shape == w.shape, f"output {i}: {g.dtype}{list(g.shape)} vs " \
                                                          f"{w.dtype}{list(w.shape)}"
        b = torch.uint8 if g.element_size() == 1 else torch.int32
        assert torch.equal(g.view(b), w.view(b)), f"output {i} differs"


@pytest.mark.parametrize("name", list(CALLS))
def test_out_dtype_keyword_and_positional_agree(name):
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither spelling warns
        by_keyword = CALLS[name](x, out_dtype=E5M2)
        by_position = CALLS[name](x, E5M2)
    assert by_keyword[0].dtype == E5M2
    _assert_same(by_keyword, by_position)


@pytest.mark.parametrize("name", list(CALLS))
def test_dtype_keyword_is_deprecated_but_works(name):
    x = _x()
    want = CALLS[name](x, out_dtype=E5M2)
    message = rf"^{re.escape(name)}: the keyword 'dtype' is deprecated .*; use 'out_dtype'$"
    with pytest.warns(DeprecationWarning, match=message) as record:
        got = CALLS[name](x, dtype=E5M2)
    assert len(record) == 1
    assert record[0].filename == __file__, f"the warning points at {record[0].filename}, not at the caller"
    _assert_same(got, want)


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("new", ["keyword", "positional"])
def test_dtype_and_out_dtype_together_raise(name, new):
    x = _x()
    message = rf"^{re.escape(name)}: got both 'dtype' \(deprecated\) and 'out_dtype'; pass only 'out_dtype'$"
    with pytest.raises(TypeError, match=message):
        if new == "keyword":
            CALLS[name](x, out_dtype=E5M2, dtype=E5M2)
        else:
            CALLS[name](x, E5M2, dtype=E5M2)


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_signature_names_out_dtype(name):
    params = inspect.signature(FUNCTIONS[name]).parameters
    assert "out_dtype" in params and "dtype" not in params
    assert params["out_dtype"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


def test_package_reexports_are_the_renamed_functions():
    for name in ("quantize_fp8", "quantize_fp8_dynamic", "quantize_fp8_block"):
        assert getattr(ae, name) is getattr(aq, name) is FUNCTIONS[name]


@pytest.mark.parametrize("name", ["quantize_fp8", "quantize_fp8_dynamic", "quantize_fp8_block"])
@pytest.mark.parametrize("spelling", ["out_dtype", "dtype", "positional"])
def test_rename_traces_fullgraph(name, spelling):
    """The rename costs no graph break; the deprecated keyword still traces (dynamo cannot trace
    warnings.warn, so a traced call does not warn)."""
    call = CALLS[name]

    def f(x):
        if spelling == "positional":
            return call(x, E5M2)
        return call(x, **{spelling: E5M2})

    torch.compiler.reset()  # each case retraces f: without a reset the cases would run into dynamo's recompile limit
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _assert_same(torch.compile(f, fullgraph=True, backend="eager")(x), call(x, out_dtype=E5M2))
