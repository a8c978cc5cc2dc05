"""The integrity check of an emulated image, whose files the host hashes from the engine's
archive (targets/docker/tree_hashes.py) while the image's own python walks them: a file whose
bytes differ from the published wheel's is still found, and named, when its size is the same
(only the hash can tell), and `apply` refuses the image before it writes anything.

The image is the arm64 fixture with one byte of one shared object flipped, made by writing the
file into a never-started container and committing it (nothing runs emulated to build it).
"""

from __future__ import annotations

import io
import secrets
import tarfile

import docker
import pytest

from tests.support.cli import run
from tests.support.index import arm64_fixture_image

pytestmark = [pytest.mark.engine, pytest.mark.emulation]

SITE = "/usr/local/lib/python3.13/dist-packages"
CHANGED = "vllm/spinloop.abi3.so"   # the smallest shared object of the aarch64 wheel


def _flipped_image(client: docker.DockerClient, source: str, tag: str) -> None:
    container = client.containers.create(source, entrypoint=["/nothing-runs"], network_disabled=True)
    try:
        stream, _ = container.get_archive(f"{SITE}/{CHANGED}")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.getmembers()[0]
            data = bytearray(tar.extractfile(member).read())  # type: ignore[union-attr]
        data[len(data) // 2] ^= 0xFF                            # same size, other bytes
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            tar.addfile(member, io.BytesIO(bytes(data)))
        assert container.put_archive(f"{SITE}/vllm", out.getvalue())
        # the source's config kept (its entrypoint, not the placeholder this container was made with)
        container.commit(repository=tag.rsplit(":", 1)[0], tag=tag.rsplit(":", 1)[1],
                         conf=dict(client.images.get(source).attrs["Config"]))
    finally:
        container.remove(force=True)


def test_an_emulated_image_with_a_changed_shared_object_is_refused_naming_it(tmp_path):
    client = docker.from_env()
    tag = f"dspark-patch-test/arm64-flipped:{secrets.token_hex(4)}"
    _flipped_image(client, arm64_fixture_image(), tag)
    try:
        res = run("apply", "--image", tag, "--pull", "never", "--tag", f"{tag}-patched", "--json",
                  "--report-dir", str(tmp_path / "a"))
        assert res.returncode == 1, res.stderr[-800:]
        doc = res.json
        assert doc["errors"][0]["kind"] == "modified-base"
        assert doc["integrity"]["mismatched"] == [CHANGED]
        assert doc["integrity"]["missing"] == [] and doc["integrity"]["added"] == []
        assert doc["integrity"]["reference"].endswith("_aarch64.whl")
        # every other file of the wheel was hashed and matched
        assert doc["integrity"]["checked"] > 5000
        assert CHANGED in res.stderr and "nothing was written" in res.stderr
        # refused before anything was written: no tag, no container left behind
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(f"{tag}-patched")
        assert client.containers.list(all=True, filters={"ancestor": tag}) == []
    finally:
        client.images.remove(tag, force=True)
