"""`publish` reads every layer of the source: what a layer BELOW vLLM's adds changes the verdict.

An upper layer settles only the paths it names (a file, a whiteout, an opaque folder); a lower
layer may still add any path the upper layers never mention, and several of publish's checks are
about such paths: a module inside vllm/ that the wheel does not list, a copy of vLLM in another
site folder, a `.pth` or a start-up hook beside vLLM in the site folder. So publish cannot stop
reading once the layer that holds vLLM is read. Each source here is the official-shape image with
one small layer inserted right under the layer that installs vLLM (the first layer a top-down
early stop would leave unread); the in-image job's layer and report are those of the unmodified
image, and match every file the report names. publish must refuse it, as `status --via registry`
(every layer read) finds it, with one line, and push nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from dspark_patch.registry.compose import gzip_layer
from dspark_patch.registry.index import Registry
from dspark_patch.registry.manifest import digest_of
from tests.support.cli import run
from tests.support.images import official_image
from tests.support.registry import login_registry_in, push_only_to_registry
from tests.support.tool_folder import tool_folder
from tests.test_in_image import APPLY, SITE, _job
from tests.test_publish import NO_ENGINE, _tag_there, _writes

pytestmark = pytest.mark.engine

USER, PASSWORD = "lower", "s3cret-for-lower-layers"
SITE_REL = SITE.lstrip("/")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    with login_registry_in(tmp_path_factory.mktemp("lower-registry"), USER, PASSWORD) as reg:
        source = f"{reg.address}/team/vllm:0.33.0"
        push_only_to_registry(official_image(), source, reg.config)
        yield reg, source


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tool = tool_folder(tmp_path_factory.mktemp("tool") / "dspark-patch")
    out = tmp_path_factory.mktemp("job")
    done = _job(tool, out, APPLY, user="0")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _layer(files: dict[str, bytes]) -> bytes:
    """A layer tar of `files` (root-relative) and the folders above them, as a build writes it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        folders = sorted({"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)})
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _with_lower_layer(reg, source: str, files: dict[str, bytes], tag: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The source with a layer of `files` inserted right under the layer that installs vLLM (the
    one that holds vLLM's dist-info), pushed as `tag`."""
    monkeypatch.setenv("DOCKER_CONFIG", str(reg.config))
    registry = Registry(reg.address)
    manifest = registry.fetch(source)
    doc = manifest.document()
    config = json.loads(registry.fetch_blob(source, doc["config"]["digest"]))
    at = _vllm_layer(registry, source, doc["layers"])
    assert 0 < at < len(doc["layers"]) - 1   # layers above and below it: the case an early stop would meet
    tar = _layer(files)
    blob = gzip_layer(tar)
    repository = source.rpartition(":")[0]   # HOST/REPO
    registry.push_blob(repository, blob)
    doc["layers"].insert(at, {"mediaType": doc["layers"][at]["mediaType"], "digest": digest_of(blob), "size": len(blob)})
    config["rootfs"]["diff_ids"].insert(at, "sha256:" + hashlib.sha256(tar).hexdigest())
    config_blob = json.dumps(config).encode()
    registry.push_blob(repository, config_blob)
    doc["config"] = {**doc["config"], "digest": digest_of(config_blob), "size": len(config_blob)}
    ref = f"{source.rpartition(':')[0]}:{tag}"
    registry.push(ref, json.dumps(doc).encode(), manifest.media_type)
    return ref


def _vllm_layer(registry: Registry, source: str, layers: list[dict]) -> int:
    """The index of the layer whose tar holds vLLM's dist-info in the site folder."""
    for n, layer in reversed(list(enumerate(layers))):   # from the top, as an early stop would
        if layer["size"] < 1 << 20:
            continue
        with registry.open_blob(source, layer["digest"]) as answer:
            with tarfile.open(fileobj=answer.raw, mode="r|gz") as tar:
                if any(m.name.startswith(f"{SITE_REL}/vllm-") and m.name.endswith(".dist-info/RECORD") for m in tar):
                    return n
    raise AssertionError("no layer of the source holds vLLM's dist-info")


LOWER = {
    # a module in vllm/ that no upper layer names and the wheel does not list
    "a stray module in vllm": ({f"{SITE_REL}/vllm/stray_module.py": b"print('not in the wheel')\n"},
                               "stray_module.py"),
    # a second copy of vLLM in a site folder of its own, which no interpreter imports
    "a second copy of vllm": ({"opt/other/lib/python3.11/site-packages/vllm/__init__.py": b""}, "/opt/other"),
    # a .pth with an import line: site runs it at every start, before vLLM is imported
    "a pth file in the site folder": ({f"{SITE_REL}/zz-start.pth": b"import os\n"}, "zz-start.pth"),
    # a start-up hook in the site folder: it runs before vLLM is imported
    "a sitecustomize in the site folder": ({f"{SITE_REL}/sitecustomize.py": b"import os\n"}, "sitecustomize"),
}


@pytest.mark.parametrize("case", sorted(LOWER))
def test_what_a_layer_below_vllms_adds_is_refused_as_reading_every_layer_finds_it(
        registry, job: Path, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reg, source = registry
    files, named = LOWER[case]
    tag = case.replace(" ", "-")
    ref = _with_lower_layer(reg, source, files, tag, monkeypatch)
    env = {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(reg.config), "DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    # Reading every layer, status finds it: the image is not its release as published.
    seen = run("status", "--via", "registry", "--image", ref, "--json", env=env)
    (row,) = json.loads(seen.stdout)["images"]
    said = json.dumps(row)
    assert row["error"] is not None or named in said, said[:3000]
    assert seen.returncode != 0
    # publish refuses it (cache warm from status or not: the same answer), and writes nothing.
    for cache in ("warm", "cold"):
        if cache == "cold":
            env = {**env, "DSPARK_PATCH_CACHE": str(tmp_path / "cold")}
        since = reg.log.stat().st_size
        dest = f"{reg.address}/team/served:{tag}-{cache}"
        done = run("publish", "--image", ref, "--layer", str(job / "layer.tar"), "--report", str(job / "r/audit.json"),
                   "--tag", dest, env=env)
        line = done.assert_clean_error(done.returncode)
        assert done.returncode in (1, 2, 3) and "\n" not in line.strip(), line
        assert named in line, line
        assert not _writes(reg.log, since) and not _tag_there(reg.address, reg.config, dest)
    assert os.path.exists(job / "layer.tar")


def test_a_layer_below_vllms_that_adds_nothing_it_checks_publishes(
        registry, job: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the same insertion with a file none of the checks is about publishes, so the
    refusals above are the added paths' doing, not the inserted layer's."""
    reg, source = registry
    ref = _with_lower_layer(reg, source, {"srv/notes/readme.txt": b"a file of the image, nothing Python imports\n"},
                            "harmless", monkeypatch)
    env = {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(reg.config), "DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    dest = f"{reg.address}/team/served:harmless"
    done = run("publish", "--image", ref, "--layer", str(job / "layer.tar"), "--report", str(job / "r/audit.json"),
               "--tag", dest, "--json", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _tag_there(reg.address, reg.config, dest)
