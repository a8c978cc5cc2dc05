"""A foreign platform on an engine that cannot emulate it: exit 3 naming qemu-user-static,
binfmt and the platform, and nothing left behind.

The fault is real: this machine's qemu-aarch64 binfmt_misc handler is switched off (`echo 0`)
for the few seconds of one CLI run and switched back on in `finally`. While it is off no arm64
program runs on this host, so this module must not run alongside anything that emulates arm64
(it is its own module and takes seconds). The images are tiny (a one-file arm64 "python3" that
is a 132-byte aarch64 program), published as a two-platform index in a loopback registry.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from dspark_patch.registry.index import DOCKER_LIST, Registry, compose_index
from tests.support.cli import run
from tests.support.images import ROOT
from tests.support.index import PLATFORMS, _push_image, remove_images_from
from tests.support.registry import loopback_registry

# It switches the host's qemu handler off for a moment: it belongs with the emulation tier.
pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.emulation]

HANDLER = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")


def _aarch64_exit_42() -> bytes:
    """A minimal static aarch64 ELF: exit(42) (scripts/aarch64-exit-42, which ensure-binfmt runs)."""
    loader = importlib.machinery.SourceFileLoader("dspark_patch_aarch64_exit_42", str(ROOT / "scripts" / "aarch64-exit-42"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return bytes(module.program())


def _tiny(platform: str, where: Path) -> str:
    rootfs = where / f"{uuid.uuid4().hex}.tar"
    with tarfile.open(rootfs, mode="w") as tar:
        payload = _aarch64_exit_42()
        info = tarfile.TarInfo("usr/bin/python3")
        info.size, info.mode = len(payload), 0o755
        tar.addfile(info, io.BytesIO(payload))
    ref = f"dspark-patch-test/tiny-python:{uuid.uuid4().hex[:10]}"
    archive = subprocess.run([str(ROOT / "scripts" / "rootfs-image"), "--platform", platform, "--tag", ref,
                              "--env", "PATH=/usr/bin", str(rootfs)], check=True, capture_output=True).stdout
    subprocess.run(["docker", "load", "--quiet"], input=archive, check=True, capture_output=True)
    return ref


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory):
    with loopback_registry(tmp_path_factory.mktemp("registry")) as host:
        registry = Registry(host)
        images = []
        for platform in PLATFORMS:
            name = f"{platform['os']}/{platform['architecture']}/{platform.get('variant', '')}".rstrip("/")
            local = _tiny(name, tmp_path_factory.mktemp("tiny"))
            remote = f"{host}/tiny/python:{platform['architecture']}"
            try:
                _push_image(local, remote)
            finally:
                subprocess.run(["docker", "rmi", local], check=False, capture_output=True)
            images.append((registry.fetch(remote), platform))
        ref = f"{host}/tiny/python:both"
        registry.push(ref, compose_index(media_type=DOCKER_LIST, images=images), DOCKER_LIST)
        try:
            yield ref
        finally:
            remove_images_from(host)


def _emulation_checks() -> set[str]:
    """Containers of the emulation check (other sessions' containers come and go meanwhile)."""
    return set(subprocess.run(["docker", "ps", "-aq", "--filter", "name=dspark-patch--emulation"],
                              capture_output=True, text=True, check=True).stdout.split())


def test_a_foreign_platform_without_an_emulator_is_exit_3_naming_the_fix(tiny_index, tmp_path):
    if not HANDLER.exists():
        pytest.fail(f"{HANDLER} is not registered; run scripts/ensure-binfmt first")
    before = _emulation_checks()
    HANDLER.write_text("0")
    try:
        result = run("probe", "--image", tiny_index, "--platform", "linux/arm64", "--report-dir", str(tmp_path))
    finally:
        HANDLER.write_text("1")
    line = result.assert_clean_error(3)
    assert "linux/arm64" in line and "qemu-user-static" in line and "binfmt" in line
    assert _emulation_checks() <= before  # the emulation check's container is gone
    assert HANDLER.read_text().startswith("enabled")
