"""Keyword renames of the public API, kept working for one release after the rename."""

from __future__ import annotations

import functools
import inspect
import warnings

import torch


def renamed_kwarg(old: str, new: str):
    """Decorator: a call passing `old=` runs as `new=` and warns `DeprecationWarning`; passing both (by keyword,
    or `new` positionally) raises TypeError. Calls that do not use `old` pay one dict lookup."""

    def decorate(fn):
        name = fn.__qualname__
        params = list(inspect.signature(fn).parameters)
        # Where `new` sits among the positional arguments (methods count self): a longer *args already holds it.
        position = params.index(new)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if old in kwargs:
                if new in kwargs or len(args) > position:
                    raise TypeError(f"{name}: got both '{old}' (deprecated) and '{new}'; pass only '{new}'")
                # Dynamo cannot trace warnings.warn: a traced call runs without the warning, an eager one warns.
                if not torch.compiler.is_compiling():
                    warnings.warn(f"{name}: the keyword '{old}' is deprecated and will be removed in the next "
                                  f"release; use '{new}'", DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper

    return decorate
