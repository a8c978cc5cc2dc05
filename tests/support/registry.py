"""A real registry on a loopback port: Debian's `docker-registry` (distribution), started per test session.

With `login=(user, password)` it asks for that login (htpasswd, bcrypt, made with apache2-utils'
`htpasswd`); `docker_login` then writes the credentials into a DOCKER_CONFIG folder the way
`docker login` does, which is where the Docker SDK reads them from.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""

AUTH = """\
auth:
  htpasswd:
    realm: dspark-patch-tests
    path: {htpasswd}
"""


# host:port -> storage folder, for the loopback registries running now (tests/support/seed.py
# puts an image straight into one of them).
_STORAGE: dict[str, Path] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def loopback_registry(workdir: Path, login: tuple[str, str] | None = None, port: int | None = None) -> Iterator[str]:
    """Yields 'host:port' of a running registry (asking for `login` if given; on a free port
    unless `port` is given); stops it afterwards."""
    binary = shutil.which("docker-registry")
    if binary is None:
        raise RuntimeError("docker-registry is not installed (scripts/ensure-docker installs it)")
    port = port or _free_port()
    (workdir / "storage").mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yml"
    text = CONFIG.format(root=workdir / "storage", port=port)
    if login is not None:
        htpasswd = workdir / "htpasswd"
        _write_htpasswd(htpasswd, *login)
        text += AUTH.format(htpasswd=htpasswd)
    config.write_text(text)
    log = open(workdir / "registry.log", "wb")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except urllib.error.HTTPError as err:
                # 401 is the answer of a registry that is up and wants the login.
                if err.code == 401 and login is not None:
                    break
                raise
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the registry did not start: {(workdir / 'registry.log').read_text()[-2000:]}")
                time.sleep(0.2)
        _STORAGE[f"127.0.0.1:{port}"] = workdir / "storage"
        yield f"127.0.0.1:{port}"
    finally:
        _STORAGE.pop(f"127.0.0.1:{port}", None)
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _write_htpasswd(path: Path, user: str, password: str) -> None:
    binary = shutil.which("htpasswd")
    if binary is None:
        raise RuntimeError("htpasswd is not installed (scripts/ensure-docker installs apache2-utils)")
    # -B: distribution accepts only bcrypt entries. -i: the password comes on stdin, not argv.
    subprocess.run([binary, "-B", "-i", "-c", str(path), user], input=password, text=True,
                   check=True, capture_output=True)


class LoginRegistry(NamedTuple):
    address: str        # 127.0.0.1:PORT
    config: Path        # a DOCKER_CONFIG folder holding the login
    log: Path           # the registry's own log (one line per request: what was fetched)


@contextmanager
def login_registry_in(work: Path, user: str, password: str) -> Iterator[LoginRegistry]:
    """A loopback registry asking for `user`'s login, and a DOCKER_CONFIG folder holding it: what
    the `login_registry` fixtures of the test modules give (tests/support/tiers.py marks a test
    that takes a fixture of that name `registry`)."""
    with loopback_registry(work / "registry", login=(user, password)) as address:
        config = work / "docker-config"
        docker_login(config, address, user, password)
        yield LoginRegistry(address, config, work / "registry" / "registry.log")


def docker_login(config_dir: Path, registry: str, user: str, password: str) -> None:
    """`docker login` into `registry`, storing the credentials in `config_dir` (a DOCKER_CONFIG)."""
    config_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["docker", "--config", str(config_dir), "login", "--username", user, "--password-stdin", registry],
        input=password, text=True, check=True, capture_output=True,
    )


def put_image(local: str, remote: str, config_dir: Path | None = None) -> str:
    """What `docker push` of local image `local` as `remote` leaves in the registry, without the
    engine's second compression of every layer when the registry is a loopback one of this
    session (tests/support/seed.py); a real push otherwise. Returns the digest ref."""
    host, _, rest = remote.partition("/")
    repository, _, tag = rest.rpartition(":")
    storage = _STORAGE.get(host)
    if storage is not None:
        from tests.support.seed import put

        return f"{host}/{repository}@{put(local, storage, repository, tag)}"
    config = ["--config", str(config_dir)] if config_dir is not None else []
    subprocess.run(["docker", "tag", local, remote], check=True, capture_output=True)
    try:
        subprocess.run(["docker", *config, "push", "--quiet", remote], check=True, capture_output=True, text=True)
        digests = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{json .RepoDigests}}", remote],
            check=True, capture_output=True, text=True,
        ).stdout
        digest = next(d for d in json.loads(digests) if d.startswith(f"{host}/{repository}@"))
    finally:
        # The remote name is only a means to push; leaving it would make the engine think the
        # image is already local when a test pulls it back.
        subprocess.run(["docker", "rmi", remote], check=False, capture_output=True)
    return digest


def push_only_to_registry(source: str, target: str, config_dir: Path) -> str:
    """Push local image `source` as `target` (with the login in `config_dir`), leaving no local
    `target` name, so the engine has to pull it to use it. Returns the pushed digest ref."""
    return put_image(source, target, config_dir)
