"""Garbage-collector settings a command may choose for its own process."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while loading bots.

    Loading a big bot allocates hundreds of thousands of small objects and no cycles
    worth collecting; the collector would otherwise run hundreds of times (2-3x slower).
    A command owns its process and may do this; the library (`load_config`) never does.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
