"""Hostile image indexes (docs/status.md: index publishing) and bounded registry answers.

- A platform listed twice (two images for linux/amd64) is refused, exit 2 naming both digests,
  by apply, verify, probe and status, in a real loopback registry (Debian's docker-registry)
  with real images pushed by the engine: nothing is pulled, tagged or pushed.
- Result tags are distinct for every platform: parts are `[a-z0-9]+`, anything else refused.
- Malformed index JSON, oversized bodies and registries that never answer are one line (exit 2
  for the body, exit 3 for the registry), never a traceback. The real registry refuses to
  store such bytes, so they come from a loopback server speaking just enough of the
  distribution API (tests/support/fake_registry.py): a fault that cannot be caused otherwise.
- The republished index is read back before it is pushed.
"""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import tarfile
import uuid

import pytest

from dspark_patch.errors import BadInput, CheckFailed, TargetNotFound
from dspark_patch.pipeline.index_run import platform_tag
from dspark_patch.registry.index import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    MANIFEST_LIMIT,
    OCI_INDEX,
    BadManifest,
    Manifest,
    Registry,
    RegistryUnreachable,
    check_republished,
    compose_index,
    digest_of,
    parse_index,
    request_timeout,
)
from dspark_patch.registry.platform_select import Platform
from tests.support.cli import run
from tests.support.fake_registry import HANG, HUGE, fake_registry
from tests.support.images import ROOT
from tests.support.index import _push_image, remove_images_from
from tests.support.registry import loopback_registry

D1, D2, D3 = ("sha256:" + c * 64 for c in "abc")
AMD64 = {"os": "linux", "architecture": "amd64"}


def _index(manifests: object, **extra: object) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests, **extra}).encode()


def _entry(digest: str = D1, platform: object = AMD64, **extra: object) -> dict:
    return {"mediaType": DOCKER_MANIFEST, "digest": digest, "size": 500, "platform": platform, **extra}


def _parse(body: bytes):
    return parse_index(Manifest(reference="reg:5000/vllm:bad", media_type=OCI_INDEX, digest=digest_of(body), body=body))


# --- malformed index JSON is one line, exit 2 (pure: the parser alone) ------------------------------
MALFORMED = {
    "manifests is a string": (_index("sha256:abc"), "`manifests` is a string, not a list"),
    "no manifests": (json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX}).encode(), "`manifests` is missing"),
    "an entry is a string": (_index(["sha256:abc"]), "manifests[0] is a string, not a descriptor"),
    "no digest": (_index([{"mediaType": DOCKER_MANIFEST, "size": 5, "platform": AMD64}]), "manifests[0] has no digest"),
    "a digest that is not sha256": (_index([_entry(digest="md5:00")]), "has digest 'md5:00'"),
    "a size that is a string": (_index([{**_entry(), "size": "500"}]), "has size '500'"),
    "a negative size": (_index([{**_entry(), "size": -1}]), "has size -1"),
    "a size past the bound": (_index([{**_entry(), "size": MANIFEST_LIMIT + 1}]), f"has size {MANIFEST_LIMIT + 1}"),
    "a boolean size": (_index([{**_entry(), "size": True}]), "has size True"),
    "no size": (_index([{k: v for k, v in _entry().items() if k != "size"}]), "has no size"),
    "a media type that is a number": (_index([{**_entry(), "mediaType": 7}]), "has media type 7, not a string"),
    "an index inside the index": (_index([{**_entry(), "mediaType": OCI_INDEX}]), "not an image manifest"),
    "a platform that is a string": (_index([_entry(platform="linux/amd64")]), "platform is a string, not an object"),
    "an architecture that is a list": (_index([_entry(platform={"os": "linux", "architecture": ["amd64"]})]),
                                       "architecture is a list, not a string"),
    "annotations that are a list": (_index([_entry()], annotations=["x"]), "annotations is not an object of strings"),
    "entry annotations of numbers": (_index([_entry(annotations={"a": 1})]), "annotations is not an object of strings"),
    "a body that is a list": (b"[]", "its JSON is a list, not an object"),
    "a body that is not JSON": (b"\xff\xfe{", "its body is not JSON"),
    "JSON nested past the parser": (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_index_json_is_one_bad_input_line(case):
    body, words = MALFORMED[case]
    with pytest.raises(BadManifest) as caught:
        _parse(body)
    assert caught.value.exit_code == 2
    assert words in caught.value.line()
    assert "\n" not in caught.value.line()


# --- one platform twice ------------------------------------------------------------------------
@pytest.mark.parametrize("second", [
    AMD64,
    {"os": "linux", "architecture": "amd64", "os.version": "x"},  # the platform fields the tool keys on are the same
])
def test_a_platform_listed_twice_names_both_digests(second):
    with pytest.raises(BadManifest) as caught:
        _parse(_index([_entry(D1), _entry(D3, {"os": "linux", "architecture": "arm64"}), _entry(D2, second)]))
    assert caught.value.exit_code == 2
    assert "lists linux/amd64 twice" in caught.value.line()
    assert D1 in caught.value.line() and D2 in caught.value.line()


def test_arm64_with_and_without_v8_is_one_platform_listed_twice():
    with pytest.raises(BadManifest, match="lists linux/arm64 twice"):
        _parse(_index([_entry(D1, {"os": "linux", "architecture": "arm64"}),
                       _entry(D2, {"os": "linux", "architecture": "arm64", "variant": "v8"})]))


def test_an_entry_marked_as_attestation_but_naming_a_platform_still_counts():
    # Engines do not read annotations: both entries are candidates for an amd64 machine.
    marked = _entry(D2, annotations={"vnd.docker.reference.type": "attestation-manifest"})
    with pytest.raises(BadManifest, match="lists linux/amd64 twice"):
        _parse(_index([_entry(D1), marked]))


def test_attestations_as_buildkit_writes_them_are_not_a_second_platform():
    unknown = {"os": "unknown", "architecture": "unknown"}
    index = _parse(_index([_entry(D1), _entry(D2, unknown), _entry(D3, unknown)]))
    assert [str(p) for p in index.platforms] == ["linux/amd64"]


# --- result tags are distinct for every platform ----------------------------------------------------
def test_result_tags_keep_todays_names_for_the_common_platforms():
    assert platform_tag("reg:5000/vllm:0.33.0", Platform.parse("linux/amd64")) == "reg:5000/vllm:0.33.0-linux-amd64"
    assert platform_tag("reg:5000/vllm:0.33.0", Platform.parse("linux/arm64/v8")) == "reg:5000/vllm:0.33.0-linux-arm64-v8"
    assert platform_tag("reg:5000/vllm", Platform.parse("linux/arm/v7")) == "reg:5000/vllm:latest-linux-arm-v7"


def test_arm64_v8_and_an_arm64_v8_architecture_never_share_a_tag():
    # `linux/arm64-v8` would have joined to the same tag as linux/arm64/v8: it is refused
    # wherever it appears, so the two can never collide.
    with pytest.raises(BadInput, match="not a platform"):
        Platform.parse("linux/arm64-v8")
    with pytest.raises(BadInput, match="not lower-case letters and digits"):
        platform_tag("reg:5000/vllm:1", Platform(os="linux", architecture="arm64-v8"))
    with pytest.raises(BadManifest, match="has platform value 'arm64-v8'"):
        _parse(_index([_entry(D1, {"os": "linux", "architecture": "arm64", "variant": "v8"}),
                       _entry(D2, {"os": "linux", "architecture": "arm64-v8"})]))


@pytest.mark.parametrize("odd", ["arm64_v8", "Arm64", "arm64.v8", "arm 64", "", "arm64/v8"])
def test_an_odd_platform_value_in_an_index_is_refused(odd):
    with pytest.raises(BadManifest) as caught:
        _parse(_index([_entry(D1, {"os": "linux", "architecture": odd})]))
    assert caught.value.exit_code == 2


def test_distinct_plain_platforms_give_distinct_tags():
    parts = ["linux", "windows", "amd64", "arm64", "arm", "v7", "v8", "386", ""]
    platforms = {Platform(os=o, architecture=a, variant=v)
                 for o, a, v in itertools.product(parts, parts, parts) if o and a}
    tags = {platform_tag("r:5000/x:1", p) for p in platforms}
    assert len(tags) == len(platforms)


def test_a_result_tag_past_128_characters_is_refused():
    with pytest.raises(BadInput, match="longer than a tag may be"):
        platform_tag("r:5000/x:" + "a" * 120, Platform.parse("linux/arm64/v8"))


# --- the new index is read back before it is pushed ---------------------------------------------
def _manifest(text: str) -> Manifest:
    body = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "note": text}).encode()
    return Manifest(reference=f"r:5000/x@{digest_of(body)}", media_type=DOCKER_MANIFEST, digest=digest_of(body), body=body)


def test_a_new_index_that_drops_or_merges_a_source_image_is_not_published():
    arm = {"os": "linux", "architecture": "arm64", "variant": "v8"}
    source = _parse(_index([_entry(D1), _entry(D2, arm)]))
    amd, arm64 = Platform.parse("linux/amd64"), Platform.parse("linux/arm64/v8")
    patched = {amd: _manifest("amd"), arm64: _manifest("arm")}
    good = compose_index(media_type=OCI_INDEX, images=[(patched[amd], AMD64), (patched[arm64], arm)])
    check_republished(source, patched, good)  # the right one passes
    merged = compose_index(media_type=OCI_INDEX, images=[(patched[amd], AMD64), (patched[amd], arm)])
    with pytest.raises(CheckFailed, match="linux/arm64/v8 is listed as linux/arm64/v8 sha256:"):
        check_republished(source, patched, merged)
    dropped = compose_index(media_type=OCI_INDEX, images=[(patched[amd], AMD64)])
    with pytest.raises(CheckFailed, match="1 entries for 2 platform images"):
        check_republished(source, patched, dropped)
    swapped = compose_index(media_type=OCI_INDEX, images=[(patched[arm64], arm), (patched[amd], AMD64)])
    with pytest.raises(CheckFailed):
        check_republished(source, patched, swapped)
    same = {amd: patched[amd], arm64: patched[amd]}  # two different sources, one patched image
    both = compose_index(media_type=OCI_INDEX, images=[(patched[amd], AMD64), (patched[amd], arm)])
    with pytest.raises(CheckFailed, match="would both be"):
        check_republished(source, same, both)


# --- a duplicate platform in a real registry, through the real CLI -------------------------------
def _tiny_amd64_image(content: str, where) -> str:
    rootfs = where / f"{uuid.uuid4().hex}.tar"
    with tarfile.open(rootfs, mode="w") as tar:
        payload = content.encode()
        info = tarfile.TarInfo("etc/which-image")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    ref = f"dspark-patch-test/tiny:{uuid.uuid4().hex[:10]}"
    archive = subprocess.run([str(ROOT / "scripts" / "rootfs-image"), "--platform", "linux/amd64",
                              "--tag", ref, str(rootfs)], check=True, capture_output=True).stdout
    subprocess.run(["docker", "load", "--quiet"], input=archive, check=True, capture_output=True)
    return ref


@pytest.fixture(scope="module")
def twice(tmp_path_factory):
    """A loopback registry holding an index that lists linux/amd64 twice, two different images."""
    with loopback_registry(tmp_path_factory.mktemp("registry")) as host:
        reg = Registry(host)
        images = []
        for name in ("first", "second"):
            local = _tiny_amd64_image(f"{name} amd64 image", tmp_path_factory.mktemp("tiny"))
            try:
                _push_image(local, f"{host}/dup/app:{name}")
            finally:
                subprocess.run(["docker", "rmi", local], check=False, capture_output=True)
            images.append((reg.fetch(f"{host}/dup/app:{name}"), AMD64))
        body = compose_index(media_type=DOCKER_LIST, images=images)
        pushed = reg.push(f"{host}/dup/app:twice", body, DOCKER_LIST)
        # the same first image, its size in the index one byte off (the registry stores it)
        wrong = json.loads(compose_index(media_type=DOCKER_LIST, images=images[:1]))
        wrong["manifests"][0]["size"] += 1
        reg.push(f"{host}/dup/app:wrong-size", json.dumps(wrong).encode(), DOCKER_LIST)
        try:
            yield host, f"{host}/dup/app:twice", pushed.digest, [m.digest for m, _ in images]
        finally:
            remove_images_from(host)


def _engine_names(host: str) -> list[str]:
    listed = subprocess.run(["docker", "images", "--digests", "--format", "{{.Repository}}:{{.Tag}}@{{.Digest}}"],
                            capture_output=True, text=True, check=True).stdout.split()
    return [n for n in listed if n.startswith(host + "/")]


@pytest.mark.engine
@pytest.mark.parametrize("args", [
    ("apply", "--platform", "all", "--tag", "{host}/dup/app:patched", "--push"),
    ("apply", "--tag", "{host}/dup/app:patched"),
    ("verify",),
    ("verify", "--platform", "linux/amd64"),
    ("probe",),
], ids=["apply-all-push", "apply", "verify", "verify-platform", "probe"])
def test_an_index_with_one_platform_twice_is_refused_naming_both_digests(twice, args, tmp_path):
    host, ref, _, digests = twice
    argv = [a.format(host=host) for a in args]
    res = run(*argv[:1], "--image", ref, *argv[1:], "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(2)
    assert "lists linux/amd64 twice" in line
    assert digests[0] in line and digests[1] in line
    # nothing pulled, tagged or pushed
    assert _engine_names(host) == []
    with pytest.raises(TargetNotFound):
        Registry(host).fetch(f"{host}/dup/app:patched")
    with pytest.raises(TargetNotFound):
        Registry(host).fetch(f"{host}/dup/app:patched-linux-amd64")


@pytest.mark.engine
def test_an_index_digest_with_one_platform_twice_is_refused_too(twice, tmp_path):
    host, _, index_digest, digests = twice
    res = run("verify", "--image", f"{host}/dup/app@{index_digest}", "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(2)
    assert digests[0] in line and digests[1] in line
    assert _engine_names(host) == []


@pytest.mark.engine
@pytest.mark.parametrize("pull", ["missing", "always"])
def test_status_reports_an_index_with_one_platform_twice_as_an_error_row(twice, pull):
    host, ref, _, digests = twice
    res = run("status", "--image", ref, "--pull", pull, "--json")
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    row = res.json["images"][0]
    assert row["exit_code"] == 2 and row["patch_sets"] == {}
    assert "lists linux/amd64 twice" in row["error"]
    assert digests[0] in row["error"] and digests[1] in row["error"]
    assert _engine_names(host) == []


@pytest.mark.engine
def test_an_index_whose_size_disagrees_with_the_manifest_is_refused_before_the_pull(twice, tmp_path):
    host, _, _, digests = twice
    res = run("verify", "--image", f"{host}/dup/app:wrong-size", "--platform", "linux/amd64",
              "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(2)
    assert f"but {digests[0]} is" in line and "bytes" in line
    assert _engine_names(host) == []


# --- bytes a real registry would not store: a loopback server serves them -------------------------
SERVED = {f"bad/app/manifests/{case.replace(' ', '-')}": (OCI_INDEX, body) for case, (body, _) in MALFORMED.items()
          if case not in ("a body that is a list", "a body that is not JSON", "JSON nested past the parser")}


@pytest.fixture(scope="module")
def hostile():
    served = {
        **SERVED,
        "bad/app/manifests/list-body": (OCI_INDEX, b"[]"),
        "bad/app/manifests/not-json": (OCI_INDEX, b"\xff\xfe{"),
        "bad/app/manifests/media-type": ("application/vnd.oci.image.index.v1+json", json.dumps(
            {"schemaVersion": 2, "mediaType": {"not": "a string"}, "manifests": []}).encode()),
        "bad/app/manifests/too-big": (OCI_INDEX, b" " * (MANIFEST_LIMIT + 1)),
        "bad/app/manifests/huge": HUGE,
        "bad/app/manifests/hang": HANG,
    }
    with fake_registry(served) as (host, seen):
        yield host, seen


@pytest.mark.parametrize("tag", sorted(k.rsplit("/", 1)[1] for k in SERVED) + ["list-body", "not-json", "media-type"])
def test_malformed_index_json_from_a_registry_is_one_line_exit_2(hostile, tag, tmp_path):
    host, _ = hostile
    res = run("verify", "--image", f"{host}/bad/app:{tag}", "--platform", "all", "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(2)
    assert f"{host}/bad/app:{tag}" in line


@pytest.mark.engine
def test_apply_and_status_refuse_a_malformed_index_and_leave_nothing(hostile, tmp_path):
    host, _ = hostile
    ref = f"{host}/bad/app:no-digest"
    applied = run("apply", "--image", ref, "--tag", f"{host}/bad/app:patched", "--report-dir", str(tmp_path / "a"))
    assert "manifests[0] has no digest" in applied.assert_clean_error(2)
    status = run("status", "--image", ref, "--pull", "missing", "--json")
    assert status.returncode == 2 and "manifests[0] has no digest" in status.json["images"][0]["error"]
    assert _engine_names(host) == []


@pytest.mark.parametrize("tag", ["too-big", "huge"])
def test_a_body_past_the_manifest_bound_is_refused_unread(hostile, tag):
    host, _ = hostile
    with pytest.raises(BadManifest) as caught:
        Registry(host).fetch(f"{host}/bad/app:{tag}")
    assert caught.value.exit_code == 2
    assert "more than" in caught.value.line() and "4 MiB" in caught.value.line()


def test_a_registry_that_never_answers_a_manifest_request_is_exit_3_after_one_try(hostile):
    host, seen = hostile
    before = len([r for r in seen if r.endswith("/manifests/hang")])
    with pytest.raises(RegistryUnreachable) as caught:
        Registry(host, timeout_s=1).fetch(f"{host}/bad/app:hang")
    assert caught.value.exit_code == 3
    assert host in caught.value.line() and "ReadTimeout" in caught.value.line()
    # one request: no retries with back-off holding the run for minutes
    assert len([r for r in seen if r.endswith("/manifests/hang")]) == before + 1


def test_the_cli_reports_a_hanging_registry_as_one_line_exit_3(hostile, tmp_path):
    host, seen = hostile
    before = len([r for r in seen if r.endswith("/manifests/hang")])
    # DSPARK_PATCH_REGISTRY_TIMEOUT bounds each request (by default 10 s each).
    res = run("verify", "--image", f"{host}/bad/app:hang", "--platform", "all", "--report-dir", str(tmp_path / "r"),
              env={"DSPARK_PATCH_REGISTRY_TIMEOUT": "1.5"})
    line = res.assert_clean_error(3)
    assert host in line and "ReadTimeout" in line
    assert len([r for r in seen if r.endswith("/manifests/hang")]) == before + 1


def test_the_registry_timeout_is_10_s_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv("DSPARK_PATCH_REGISTRY_TIMEOUT", raising=False)
    assert request_timeout() == 10
    monkeypatch.setenv("DSPARK_PATCH_REGISTRY_TIMEOUT", " 2.5 ")
    assert request_timeout() == 2.5


@pytest.mark.parametrize("value", ["soon", "0", "-3", "nan", "7200"])
def test_a_registry_timeout_that_is_not_seconds_is_one_line_exit_2(hostile, tmp_path, value):
    host, _ = hostile
    res = run("verify", "--image", f"{host}/bad/app:hang", "--platform", "all", "--report-dir", str(tmp_path / "r"),
              env={"DSPARK_PATCH_REGISTRY_TIMEOUT": value})
    line = res.assert_clean_error(2)
    assert f"DSPARK_PATCH_REGISTRY_TIMEOUT={value!r}" in line and "seconds" in line
