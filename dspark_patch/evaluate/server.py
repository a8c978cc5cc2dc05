"""One server run for `evaluate`: start the image with its own entrypoint, follow its log until
the KV figures are in (or it exits, or the time is up), then stop and remove it.

The engine is a parameter (`ContainerEngine`: what `targets.docker.DockerEngine.started`
offers), so this module never touches Docker itself; the container is removed by the engine on
every way out, SIGTERM included.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol


class ContainerStateLike(Protocol):
    @property
    def running(self) -> bool: ...
    @property
    def exit_code(self) -> int | None: ...


class RunningContainer(Protocol):
    @property
    def id(self) -> str: ...
    def state(self) -> ContainerStateLike: ...
    def logs(self) -> str: ...


class ContainerEngine(Protocol):
    def started(
        self, image_id: str, *, role: str, command: Sequence[str], env: Mapping[str, str], gpus: bool,
    ) -> AbstractContextManager[RunningContainer]: ...


@dataclass(frozen=True, kw_only=True)
class ServerRun:
    log: str
    container_id: str
    image_id: str
    env: tuple[tuple[str, str], ...]
    args: tuple[str, ...]
    exit_code: int | None         # None: still running when stopped (pattern seen or timeout)
    matched: bool                 # `until` returned True
    timed_out: bool


def run_server(
    engine: ContainerEngine,
    image_id: str,
    *,
    env: Mapping[str, str],
    command_args: Sequence[str],
    gpus: bool,
    until: Callable[[str], bool],
    timeout: float,
    poll_s: float = 0.5,
) -> ServerRun:
    """Start `image_id` with its own entrypoint, `command_args` and `env`; follow its log until
    `until(log)` holds, the timeout passes or it exits; then stop and remove it."""
    log = ""
    exit_code = None
    matched = timed_out = False
    with engine.started(image_id, role="server", command=command_args, env=env, gpus=gpus) as container:
        deadline = time.monotonic() + timeout
        while True:
            state = container.state()
            log = container.logs()
            if until(log):
                matched = True
                break
            if not state.running:
                exit_code = state.exit_code
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(poll_s)
        container_id = container.id
    return ServerRun(
        log=log,
        container_id=container_id,
        image_id=image_id,
        env=tuple(sorted(env.items())),
        args=tuple(command_args),
        exit_code=exit_code,
        matched=matched,
        timed_out=timed_out,
    )
