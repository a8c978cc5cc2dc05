"""Image indexes in a real loopback registry: read, list platforms, compose, republish.

The images behind the indexes here are real but tiny (one file, imported by the engine as
linux/amd64 and linux/arm64) so that every index shape can be tried in seconds; the full
two-platform fixture is published once by `test_the_fixture_index_*` at the end.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import uuid

import pytest

from dspark_patch.errors import BadInput, TargetNotFound
from dspark_patch.registry.index import (
    DOCKER_LIST,
    OCI_INDEX,
    Manifest,
    Registry,
    RegistryUnreachable,
    compose_index,
    republish,
)
from dspark_patch.registry.platform_select import Platform, UnknownPlatform, select
from tests.support.images import ROOT
from tests.support.index import (
    INDEX_ANNOTATIONS,
    PLATFORMS,
    _attestation,
    _push_image,
    publish_index,
)
from tests.support.registry import loopback_registry

AMD64 = Platform(os="linux", architecture="amd64")
ARM64 = Platform(os="linux", architecture="arm64", variant="v8")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with loopback_registry(tmp_path_factory.mktemp("registry")) as address:
        yield address


def _tiny_image(platform: str, content: str, where) -> str:
    """A one-file image for `platform`, loaded into the engine (nothing in it is run)."""
    rootfs = where / f"{uuid.uuid4().hex}.tar"
    with tarfile.open(rootfs, mode="w") as tar:
        payload = content.encode()
        info = tarfile.TarInfo("etc/which-image")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    ref = f"dspark-patch-test/tiny:{uuid.uuid4().hex[:10]}"
    archive = subprocess.run([str(ROOT / "scripts" / "rootfs-image"), "--platform", platform,
                              "--tag", ref, str(rootfs)], check=True, capture_output=True).stdout
    subprocess.run(["docker", "load", "--quiet"], input=archive, check=True, capture_output=True)
    return ref


@pytest.fixture(scope="module")
def tiny(registry, tmp_path_factory):
    """Two pairs of pushed single-platform manifests: 'source' and 'patched' per platform."""
    reg = Registry(registry)
    pushed: dict[str, Manifest] = {}
    for generation in ("source", "patched"):
        for platform in ("linux/amd64", "linux/arm64"):
            local = _tiny_image(platform, f"{generation} {platform}", tmp_path_factory.mktemp("tiny"))
            remote = f"{registry}/tiny/app:{generation}-{platform.split('/')[1]}"
            try:
                _push_image(local, remote)
            finally:
                subprocess.run(["docker", "rmi", local], check=False, capture_output=True)
            pushed[f"{generation}-{platform.split('/')[1]}"] = reg.fetch(remote)
    return pushed


def _publish(registry: str, tiny, kind: str, tag: str, *, attestation: bool = False) -> str:
    reg = Registry(registry)
    images = [(tiny["source-amd64"], PLATFORMS[0]), (tiny["source-arm64"], PLATFORMS[1])]
    extra = [_attestation(reg, f"{registry}/tiny/app", tiny["source-amd64"])] if attestation else []
    body = compose_index(media_type=kind, images=images, annotations=INDEX_ANNOTATIONS, attestations=extra)
    reg.push(f"{registry}/tiny/app:{tag}", body, kind)
    return f"{registry}/tiny/app:{tag}"


@pytest.mark.engine
@pytest.mark.parametrize("kind", [DOCKER_LIST, OCI_INDEX])
def test_a_published_index_reads_back_with_both_platforms_in_order(registry, tiny, kind):
    ref = _publish(registry, tiny, kind, f"two-{kind.rsplit('.', 2)[-2]}")
    index = Registry(registry).fetch_index(ref)
    assert index is not None
    assert index.manifest.media_type == kind
    assert index.platforms == (AMD64, ARM64)
    # platform fields exactly as written, the annotations kept
    assert [dict(e.raw["platform"]) for e in index.images] == list(PLATFORMS)
    assert index.annotations == INDEX_ANNOTATIONS
    # each platform resolves, by digest, to the manifest that was pushed for it
    assert Registry(registry).fetch_platform(index, ARM64).digest == tiny["source-arm64"].digest
    assert Registry(registry).fetch_platform(index, AMD64).digest == tiny["source-amd64"].digest


@pytest.mark.engine
def test_the_engine_pulls_the_arm64_image_through_the_index(registry, tiny):
    # What a Grace node does with the tag: the engine must accept the index we wrote.
    ref = _publish(registry, tiny, DOCKER_LIST, "engine-pull")
    try:
        subprocess.run(["docker", "pull", "--quiet", "--platform", "linux/arm64", ref],
                       check=True, capture_output=True)
        arch = subprocess.run(["docker", "image", "inspect", "-f", "{{.Architecture}}", ref],
                              check=True, capture_output=True, text=True).stdout.strip()
        assert arch == "arm64"
    finally:
        subprocess.run(["docker", "rmi", ref], check=False, capture_output=True)


@pytest.mark.engine
def test_attestation_manifests_are_listed_but_are_not_platforms(registry, tiny):
    ref = _publish(registry, tiny, OCI_INDEX, "with-attestation", attestation=True)
    index = Registry(registry).fetch_index(ref)
    assert index is not None
    assert len(index.entries) == 3
    assert index.platforms == (AMD64, ARM64)
    assert index.entries[2].is_attestation


@pytest.mark.engine
@pytest.mark.parametrize("kind", [DOCKER_LIST, OCI_INDEX])
def test_republish_swaps_digests_and_keeps_everything_else(registry, tiny, kind):
    reg = Registry(registry)
    source = reg.fetch_index(_publish(registry, tiny, kind, f"src-{kind.rsplit('.', 2)[-2]}",
                                      attestation=kind == OCI_INDEX))
    assert source is not None
    body = republish(source, {AMD64: tiny["patched-amd64"], ARM64: tiny["patched-arm64"]})
    pushed = reg.push(f"{registry}/tiny/app:patched-{kind.rsplit('.', 2)[-2]}", body, kind)
    again = reg.fetch_index(pushed.reference)
    assert again is not None
    assert again.manifest.media_type == kind
    assert again.manifest.digest == pushed.digest
    assert again.platforms == (AMD64, ARM64)
    assert [e.digest for e in again.entries] == [tiny["patched-amd64"].digest, tiny["patched-arm64"].digest]
    assert [dict(e.raw["platform"]) for e in again.entries] == list(PLATFORMS)
    assert again.annotations == INDEX_ANNOTATIONS
    # the source index is untouched
    assert reg.fetch(source.manifest.reference).digest == source.manifest.digest


@pytest.mark.engine
def test_republish_refuses_an_index_with_a_platform_left_unpatched(registry, tiny):
    source = Registry(registry).fetch_index(_publish(registry, tiny, DOCKER_LIST, "half"))
    assert source is not None
    with pytest.raises(BadInput, match="no patched image for linux/arm64/v8"):
        republish(source, {AMD64: tiny["patched-amd64"]})


@pytest.mark.engine
def test_a_single_platform_image_is_not_an_index(registry, tiny):
    assert Registry(registry).fetch_index(tiny["source-amd64"].reference) is None


def test_a_missing_tag_is_bad_input(registry):
    with pytest.raises(TargetNotFound) as caught:
        Registry(registry).fetch(f"{registry}/tiny/app:no-such-tag")
    assert caught.value.exit_code == 2


def test_a_registry_that_does_not_answer_is_an_environment_problem_at_once():
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RegistryUnreachable) as caught:
        Registry(f"127.0.0.1:{port}")
    assert caught.value.exit_code == 3
    assert f"127.0.0.1:{port}" in caught.value.line()


def test_a_registry_that_hangs_up_is_tried_once():
    """One try, no back-off: a loopback server that accepts and closes every connection counts
    exactly one (a timed assertion would depend on the machine's load)."""
    import socket
    import threading

    accepted: list[int] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]

        def serve() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                accepted.append(1)
                conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with pytest.raises(RegistryUnreachable) as caught:
            Registry(f"127.0.0.1:{port}")
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not, on Linux)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert caught.value.exit_code == 3 and f"127.0.0.1:{port}" in caught.value.line()
    assert len(accepted) == 1


# --- --platform selection (pure) -------------------------------------------------------------
def test_default_selects_the_engines_platform_only():
    assert select((AMD64, ARM64), None, AMD64) == (AMD64,)
    assert select((AMD64, ARM64), None, Platform(os="linux", architecture="arm64")) == (ARM64,)


def test_all_and_comma_lists_keep_the_index_order():
    assert select((AMD64, ARM64), "all", AMD64) == (AMD64, ARM64)
    assert select((AMD64, ARM64), "linux/arm64,linux/amd64", AMD64) == (AMD64, ARM64)
    assert select((AMD64, ARM64), "linux/arm64/v8", AMD64) == (ARM64,)


def test_a_platform_the_index_lacks_is_exit_2_naming_the_ones_it_has():
    with pytest.raises(UnknownPlatform) as caught:
        select((AMD64, ARM64), "linux/s390x", AMD64)
    assert caught.value.exit_code == 2
    assert "linux/s390x" in caught.value.line()
    assert "linux/amd64, linux/arm64/v8" in caught.value.line()


def test_a_malformed_platform_is_bad_input():
    with pytest.raises(BadInput, match="not a platform"):
        select((AMD64,), "amd64", AMD64)


# --- the real two-platform fixture -----------------------------------------------------------
@pytest.mark.engine
@pytest.mark.emulation  # the arm64 fixture (scripts/build-arm64-fixture)
def test_the_fixture_index_names_the_real_amd64_and_arm64_serving_images(registry):
    published = publish_index(registry, kind=OCI_INDEX, attestation=True)
    reg = Registry(registry)
    index = reg.fetch_index(published.ref)
    assert index is not None
    assert index.platforms == (AMD64, ARM64)
    arm64 = reg.fetch_platform(index, ARM64)
    assert arm64.digest == published.images[1].digest
    # the arm64 entry's image config really is an arm64 image (what `docker pull` would run)
    config = json.loads(reg.fetch_blob(published.ref, arm64.document()["config"]["digest"]))
    assert config["architecture"] == "arm64"
    assert config["config"]["Entrypoint"] == ["vllm", "serve"]
