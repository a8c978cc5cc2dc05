"""Pause the cyclic garbage collector while the engine builds its (acyclic) objects.

Parsing a large diff and planning it allocate hundreds of thousands of small objects and no
reference cycles; the collector's generation-0 passes then cost 10-15 % of the run for
nothing. The previous state is restored on every path (the CLI is single-threaded).
"""

from __future__ import annotations

import gc
from contextlib import ContextDecorator


class gc_paused(ContextDecorator):
    def __enter__(self) -> "gc_paused":
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            gc.enable()
