"""Checks of the ops' Python-level options, shared by gdn.jax and gdn.torch: the message names
the argument, the expected and the given value, as the library's do."""

from __future__ import annotations

import operator


def static_int(value, name):
    """An integer option (a Python int or NumPy integer within int32), else ValueError; the
    library checks its range."""
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"gdn: argument '{name}': expected an integer, given {value!r}") from None
    if not -2**31 <= v < 2**31:
        raise ValueError(f"gdn: argument '{name}': expected a 32-bit integer, given {v}")
    return v


def check_choice(value, choices, name):
    if value not in choices:
        raise ValueError(f"gdn: argument '{name}': expected one of {choices}, given {value!r}")
