"""A bounded pool of clients per registry, shared by the threads of one run.

`status --via registry` over a fleet reads many manifests and configs side by side. Each
`Registry` client is one requests session (its keep-alive connection) and one oras auth state,
whose bearer token is for one repository scope at a time: two threads must never use one client
at once. So a thread borrows a client for one request (or one layer's stream) and gives it back;
at most `size` clients, so at most `size` connections, are open to one registry, and each is
reused by the next tag. The /v2/ challenge is asked once per registry: the pool's further
clients are given the first one's scheme. A registry that did not answer the first challenge is
that error for every later borrow, at once (a dead registry costs one timeout, not one per tag).

The size is `--registry-connections`, else $DSPARK_PATCH_REGISTRY_CONNECTIONS, else 8.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import BadInput, DsparkPatchError
from .index import Registry

CONNECTIONS_ENV = "DSPARK_PATCH_REGISTRY_CONNECTIONS"
DEFAULT_CONNECTIONS = 8
MAX_CONNECTIONS = 64


def pool_size(option: int | None = None) -> int:
    """`option` when given, else $DSPARK_PATCH_REGISTRY_CONNECTIONS (1 to 64), else 8."""
    if option is not None:
        return option
    raw = os.environ.get(CONNECTIONS_ENV, "").strip()
    if not raw:
        return DEFAULT_CONNECTIONS
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3) or not 1 <= int(raw) <= MAX_CONNECTIONS:
        raise BadInput(f"{CONNECTIONS_ENV}={raw!r} is not a number of connections from 1 to {MAX_CONNECTIONS}",
                       hint=f"set it to the connections opened to one registry at once (default {DEFAULT_CONNECTIONS}), "
                            "or unset it")
    return int(raw)


class _Host:
    def __init__(self) -> None:
        self.idle: list[Registry] = []
        self.made = 0
        self.scheme: str | None = None
        self.failed: DsparkPatchError | None = None


class RegistryPool:
    """At most `size` clients per registry host; `client(host)` lends one to one thread."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a pool holds at least one client")
        self.size = size
        self._hosts: dict[str, _Host] = {}
        self._ready = threading.Condition()

    @contextmanager
    def client(self, host: str) -> Iterator[Registry]:
        """A client of `host` for this thread alone until the block ends (waits while `size` are lent)."""
        registry = self._borrow(host)
        try:
            yield registry
        finally:
            with self._ready:
                self._hosts[host].idle.append(registry)
                self._ready.notify()

    def _borrow(self, host: str) -> Registry:
        with self._ready:
            slot = self._hosts.setdefault(host, _Host())
            while True:
                if slot.failed is not None:
                    raise slot.failed
                if slot.idle:
                    return slot.idle.pop()
                # The first client asks the challenge alone; the others wait for its scheme.
                if slot.made < self.size and (slot.scheme is not None or slot.made == 0):
                    slot.made += 1
                    scheme = slot.scheme
                    break
                self._ready.wait()
        try:
            registry = Registry(host, scheme=scheme)
        except BaseException as exc:
            with self._ready:
                slot.made -= 1
                if slot.scheme is None and isinstance(exc, DsparkPatchError):
                    slot.failed = exc
                self._ready.notify_all()
            raise
        with self._ready:
            slot.scheme = registry.scheme
            self._ready.notify_all()
        return registry


__all__ = ["CONNECTIONS_ENV", "DEFAULT_CONNECTIONS", "MAX_CONNECTIONS", "RegistryPool", "pool_size"]
