"""Our containers' names, and who owns a container: the one place that decides both.

Our containers are marked by name, not by label: a commit copies the container's labels into
the image (the engine merges them into the commit config), so a marker label would end up in
every patched image. Name: dspark-patch--ROLE--HOST--PID--STARTTIME--RANDOM.

Liveness is judged on the client's side, always: HOST and PID name the process that made the
container on the machine running this tool, which need not be the engine's machine (a remote
DOCKER_HOST, Podman's service), so nothing here looks at the engine's processes. A killed run
whose process is not yet reaped (a zombie) is gone: it will never remove its container.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

NAME_PREFIX = "dspark-patch--"
KEEP_ENV = "DSPARK_PATCH_KEEP_CONTAINER"


def keep_requested() -> bool:
    """The user asked to keep containers for debugging (`gc` removes them later)."""
    return os.environ.get(KEEP_ENV) == "1"


def container_name(role: str) -> str:
    """A fresh name saying who made the container: role (`-kept` when kept), host, pid, start."""
    if keep_requested():
        role += "-kept"
    pid = os.getpid()
    return f"{NAME_PREFIX}{role}--{_this_host()}--{pid}--{_start_time(pid)}--{secrets.token_hex(3)}"


@dataclass(frozen=True, kw_only=True)
class Owner:
    """The run that made a container, read back from its name."""

    role: str
    host: str
    pid: int
    start: str

    @classmethod
    def parse(cls, name: str) -> Owner | None:
        bare = name.lstrip("/")
        parts = bare.removeprefix(NAME_PREFIX).split("--")
        if not bare.startswith(NAME_PREFIX) or len(parts) != 5 or not parts[2].isdigit():
            return None
        return cls(role=parts[0], host=parts[1], pid=int(parts[2]), start=parts[3])

    @property
    def kept(self) -> bool:
        return self.role.endswith("-kept")

    @property
    def here(self) -> bool:
        return self.host == _this_host()

    @property
    def mine(self) -> bool:
        """Made by this very process (host, pid and the pid's start time)."""
        return self.here and self.pid == os.getpid() and self.start == _start_time(self.pid)

    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[0] != "Z" and stat[19] == self.start


def _this_host() -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in socket.gethostname())


def _start_time(pid: int) -> str:
    # A pid alone can be reused; pid plus its start time names one process.
    stat = _stat(pid)
    return "?" if stat is None else stat[19]


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), on this host."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()
