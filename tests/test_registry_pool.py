"""The registry client's pool and its waits, without a registry: `Retry-After` read as RFC 9110
says, the pool's size from its option or environment, and the pool's bound and reuse (a stand-in
client; tests/test_status_registry.py reads a real registry through the pool and a faulty proxy)."""

from __future__ import annotations

import threading
import time

import pytest

from dspark_patch.errors import BadInput
from dspark_patch.registry import pool as pool_module
from dspark_patch.registry.index import RegistryUnreachable, retry_after
from dspark_patch.registry.pool import DEFAULT_CONNECTIONS, RegistryPool, pool_size


def test_retry_after_reads_seconds_and_http_dates_and_nothing_else() -> None:
    now = 1_700_000_000.0
    assert retry_after("0") == 0 and retry_after(" 7 ") == 7 and retry_after("9" * 5000) == float("inf")
    assert retry_after("Tue, 14 Nov 2023 22:13:40 GMT", now=now) == 20  # 22:13:20 is `now`
    assert retry_after("Tue, 14 Nov 2023 22:13:00 GMT", now=now) == 0   # already past
    for said in (None, "", "-1", "1.5", "²", "soon", "Tue, 14 Nov 2023 22:13:40"):
        assert retry_after(said, now=now) is None, said


def test_the_pool_size_is_the_option_else_the_environment_else_eight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSPARK_PATCH_REGISTRY_CONNECTIONS", raising=False)
    assert pool_size() == DEFAULT_CONNECTIONS == 8
    monkeypatch.setenv("DSPARK_PATCH_REGISTRY_CONNECTIONS", "3")
    assert pool_size() == 3 and pool_size(1) == 1
    for bad in ("0", "65", "two", "-1", "²", "9" * 5000):
        monkeypatch.setenv("DSPARK_PATCH_REGISTRY_CONNECTIONS", bad)
        with pytest.raises(BadInput, match="DSPARK_PATCH_REGISTRY_CONNECTIONS"):
            pool_size()


class _Client:
    made: list[_Client] = []
    challenges = 0
    fail = False

    def __init__(self, host: str, *, scheme: str | None = None) -> None:
        if scheme is None:
            type(self).challenges += 1
            if type(self).fail:
                raise RegistryUnreachable(f"registry {host} does not answer")
        self.host, self.scheme = host, scheme or "basic"
        type(self).made.append(self)


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> type[_Client]:
    monkeypatch.setattr(_Client, "made", [])
    monkeypatch.setattr(_Client, "challenges", 0)
    monkeypatch.setattr(_Client, "fail", False)
    monkeypatch.setattr(pool_module, "Registry", _Client)
    return _Client


def test_the_pool_lends_at_most_its_size_at_once_and_reuses_them(client: type[_Client]) -> None:
    pool = RegistryPool(3)
    lent, most, guard = set(), 0, threading.Lock()

    def use(_: int) -> None:
        nonlocal most
        with pool.client("127.0.0.1:5000") as registry:
            with guard:
                assert id(registry) not in lent, "one client lent to two threads"
                lent.add(id(registry))
                most = max(most, len(lent))
            time.sleep(0.01)
            with guard:
                lent.discard(id(registry))

    threads = [threading.Thread(target=use, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most <= 3 and len(client.made) <= 3
    assert client.challenges == 1  # the others were given its scheme


def test_a_registry_that_does_not_answer_is_asked_once(client: type[_Client]) -> None:
    client.fail = True
    pool = RegistryPool(4)
    for _ in range(5):
        with pytest.raises(RegistryUnreachable), pool.client("127.0.0.1:9"):
            pass
    assert client.challenges == 1
