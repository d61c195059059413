"""Checks of the ops' Python-level options, shared by gdn.jax and gdn.torch: the message names
the argument, the expected and the given value, as the library's do."""

from __future__ import annotations

import contextlib
import operator
import re


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


@contextlib.contextmanager
def library_names(names):
    """Inside, a ValueError of the library naming its own argument or option (``options.hv``,
    ``recurrent_state``) is raised again naming the caller's (``num_v_heads``, ``ssm_state``):
    ``names`` maps the library's names to the entry point's. The message is otherwise the
    library's."""
    try:
        yield
    except ValueError as e:
        message = str(e)
        renamed = message
        for ours, theirs in names.items():
            renamed = re.sub(r"(?<![\w.])" + re.escape(ours) + r"(?!\w)", theirs, renamed)
        if renamed == message:
            raise
        raise ValueError(renamed) from None
