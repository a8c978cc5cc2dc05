"""The test images, built by the project's own scripts (scripts/build-images), never pulled.

The first call in a test session runs the script (a few minutes on a fresh machine: debootstrap,
pip, docker build; seconds once the content tags exist) and reads the refs it prints. A missing
or broken engine makes the script fail, and so the tests that need an image fail too: they are
never skipped.
"""

from __future__ import annotations

import contextlib
import functools
import io
import subprocess
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def built_images() -> dict[str, str]:
    """name -> content-tagged ref, for every image scripts/build-images makes."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-images")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"scripts/build-images failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    refs = {}
    for line in done.stdout.splitlines():
        name, _, ref = line.partition(" ")
        refs[name] = ref
    return refs


def fixture_image() -> str:
    """The serving image with the real vLLM 0.33.0 wheel and CPU torch installed."""
    return built_images()["vllm-fixture"]


def no_python_image() -> str:
    """Debian with python removed: the tool must refuse it."""
    return built_images()["no-python"]


def no_vllm_image() -> str:
    """Debian with python3 but no vLLM: locating vLLM must fail."""
    return built_images()["no-vllm"]


def server_double_image() -> str:
    """A test double of a serving image: its entrypoint only logs a few lines, then waits."""
    return built_images()["server-double"]


def base_image() -> str:
    return built_images()["base"]


# --- image shapes (docs/testing.md); see images/<name>/Dockerfile for what each one stands for -------

def trixie_venv_image() -> str:
    """Root, Debian trixie / Python 3.13, Debian's torch, vLLM in /opt/venv (not on PATH)."""
    return built_images()["trixie-venv"]


def two_pythons_image() -> str:
    """Default python3 without vLLM; vLLM and torch in /opt/vllm-env's own interpreter."""
    return built_images()["two-pythons"]


def non_writable_image() -> str:
    """The fixture run as USER 10001:0 (no passwd entry), which cannot write vLLM's folder."""
    return built_images()["non-writable"]


def no_shell_image() -> str:
    """The fixture with every shell removed."""
    return built_images()["no-shell"]


SHAPES = ("trixie-venv", "two-pythons", "non-writable", "no-shell")


def fixture_032_image() -> str:
    """The serving image with the real vLLM 0.32.0 wheel and CPU torch."""
    return built_images()["vllm-fixture-0.32.0"]


def fixture_034_image() -> str:
    """The serving image with the real vLLM 0.34.0 wheel and CPU torch (pip, USER vllm): the
    release that has dspark-skip-mtp-buffer's change upstream, in its own form."""
    return built_images()["vllm-fixture-0.34.0"]


def official_image() -> str:
    """The official image's shape (images/vllm-official): the real vLLM 0.33.0 wheel and torch
    installed by uv (`uv pip install --system`), no bytecode, USER 2000 with GID 0, `vllm serve`."""
    return built_images()["vllm-official"]


def official_032_image() -> str:
    """The same recipe on the real vLLM 0.32.0 wheel."""
    return built_images()["vllm-official-0.32.0"]


def official_034_image() -> str:
    """The official image's shape (uv, no bytecode, USER 2000) on the real vLLM 0.34.0 wheel."""
    return built_images()["vllm-official-0.34.0"]


def official_upgraded_image() -> str:
    """vllm-official-0.32.0 with `uv pip install --system -U` of the real 0.33.0 wheel in a later
    layer (0.32.0's dist-info and dropped files whited out)."""
    return built_images()["vllm-official-upgraded"]


def official_reinstalled_image() -> str:
    """vllm-official (0.33.0) with the same wheel reinstalled in a later layer."""
    return built_images()["vllm-official-reinstalled"]


def tiny_layer(path: str, data: bytes) -> bytes:
    """A layer tar holding one root-owned file (and no folder entries: its folder exists)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:") as tar:
        member = tarfile.TarInfo(path.lstrip("/"))
        member.size, member.mode = len(data), 0o644
        tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


@contextlib.contextmanager
def official_variants(cases: Mapping[str, Sequence[str]], name: str) -> Iterator[dict[str, str]]:
    """One image per case: the official shape with the case's Dockerfile lines run as root (USER
    2000 after them), tagged dspark-patch/test-NAME:CASE-…; removed when the block ends."""
    import uuid

    import docker

    client = docker.from_env()
    made: dict[str, str] = {}
    try:
        for case, lines in cases.items():
            dockerfile = "\n".join([f"FROM {official_image()}", "USER root", *lines, "USER 2000"]) + "\n"
            tag = f"dspark-patch/test-{name}:{case}-{uuid.uuid4().hex[:6]}"
            client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, network_mode="none", rm=True,
                                forcerm=True)
            made[case] = tag
        yield made
    finally:
        for tag in made.values():
            try:
                client.images.remove(tag, force=True)
            except docker.errors.ImageNotFound:
                pass
