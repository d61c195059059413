"""What the C++ binding is handed as its thread count: a spy on gdn._gdn's direct calls (the
functions gdn.torch's ops call, each ``(..., threads: int, reference: bool)``), which records the
count of every call and runs it unchanged. gdn.torch looks the functions up on the module at each
call, so a call made in eager mode, from a compiled graph or in a forked DataLoader worker goes
through the spy."""

import contextlib
import re

from gdn import _gdn

DIRECT_CALLS = ("core_forward", "core_backward", "conv_forward", "conv_backward", "conv_update",
                "step")
# conv_update has no float64 reference mode: its signature ends in (silu: bool, threads: int).
THREADS_LAST = ("conv_update",)


def _check_signature(name):
    # The spy reads the count from the argument the signature says: a binding whose signature no
    # longer ends in (threads: int, reference: bool) (or (threads: int)) fails here, not silently.
    first_line = getattr(_gdn, name).__doc__.splitlines()[0]
    tail = r"arg\d+: int, /\) -> None$" if name in THREADS_LAST else \
        r"arg\d+: int, arg\d+: bool, /\) -> None$"
    assert re.search(tail, first_line), first_line


@contextlib.contextmanager
def threads_received():
    """Inside, every direct call appends (function name, threads it was handed) to the list
    this yields."""
    seen = []
    originals = {name: getattr(_gdn, name) for name in DIRECT_CALLS}

    def spy(name, call):
        def recorded(*args):
            threads, reference = (args[-1], False) if name in THREADS_LAST else args[-2:]
            assert type(threads) is int and type(reference) is bool, (name, args[-2:])
            seen.append((name, threads))
            return call(*args)
        return recorded

    for name, call in originals.items():
        _check_signature(name)
        setattr(_gdn, name, spy(name, call))
    try:
        yield seen
    finally:
        for name, call in originals.items():
            setattr(_gdn, name, call)
