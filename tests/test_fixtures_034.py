"""The vLLM 0.34.0 fixtures hold what each shape promises, read without running them.

0.34.0 has dspark-skip-mtp-buffer's change upstream, in its own form (`needs_mtp_hidden_buffer`
in vllm/models/deepseek_v4/common/spec_decode.py, no flag): the pip fixture (USER vllm), the
official shape (uv, USER 2000) and its arm64 twin, the second platform of the 0.34.0 index. Each
image's dist-info and that module are copied out of a container that is created and never started
(so the arm64 one needs no qemu), and the container is removed on every path.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable

import docker
import pytest

from tests.support.images import fixture_034_image, official_034_image
from tests.support.index import arm64_official_034_image

pytestmark = pytest.mark.engine

SITE311 = "/usr/local/lib/python3.11/dist-packages"
SITE313 = "/usr/local/lib/python3.13/dist-packages"
UPSTREAM = "vllm/models/deepseek_v4/common/spec_decode.py"


def _files(image: str, folder: str) -> dict[str, bytes]:
    """The regular files under `folder` in `image`, by their path below it."""
    client = docker.from_env()
    container = client.containers.create(image, network_disabled=True)
    try:
        chunks, _ = container.get_archive(folder)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            return {m.name.split("/", 1)[1] if "/" in m.name else m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                    for m in tar.getmembers() if m.isfile()}
    finally:
        container.remove(force=True)


@pytest.mark.parametrize("source, site, installer, user, arch", [
    pytest.param(fixture_034_image, SITE311, b"pip", "vllm", "amd64", id="pip"),
    pytest.param(official_034_image, SITE311, b"uv", "2000", "amd64", id="official"),
    pytest.param(arm64_official_034_image, SITE313, b"uv", "2000", "arm64", id="official-arm64",
                 marks=pytest.mark.emulation),
])
def test_the_034_fixtures_hold_vllm_034_in_their_shape(source: Callable[[], str], site: str, installer: bytes,
                                                       user: str, arch: str) -> None:
    image = source()
    attrs = docker.from_env().images.get(image).attrs
    assert (attrs["Config"]["User"], attrs["Architecture"]) == (user, arch)
    assert attrs["Config"]["Entrypoint"] == ["vllm", "serve"]
    info = _files(image, f"{site}/vllm-0.34.0.dist-info")
    assert b"\nVersion: 0.34.0\n" in info["METADATA"]
    assert info["INSTALLER"].strip() == installer
    assert ("uv_cache.json" in info) == (installer == b"uv")
    # The release's own form of our change: the helper upstream added in its place.
    module = _files(image, f"{site}/{UPSTREAM}")
    assert b"def needs_mtp_hidden_buffer(" in module["spec_decode.py"]
