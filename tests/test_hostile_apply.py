"""Hostile images through `apply` on the real engine (docs/status.md: tar differentials, decoy site folder, the new layer's check).

Each image is the real 0.33.0 fixture's layers (the engine holds them) plus one layer written by
the test. `apply` must refuse it: exit 1 and one line, before anything is written; nothing tagged,
no container of the image left, the source image untouched. Built once per module, removed at
the end. The reader-level and status/verify checks of the same classes are in
test_hostile_layers.py.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import hostile, images, vllm
from tests.support.cli import run
from tests.support.hostile import File, Raw
from tests.test_hostile_layers import ENGINE_LOADS, SITE, _differentials, _inspect, _load, site_layer

pytestmark = pytest.mark.engine

DECOY_SITE = "usr/local/lib/python3.14/site-packages"   # a python the fixture does not have
PREFIX = f"127.0.0.1:9/dspark-patch-test/hostile-apply-{secrets.token_hex(3)}"


# new-layer-check: the image's own python runs in the work container (locate, integrity, compile, and the
# script that writes the new layer's tar). These wrappers stand in for it: the real binary, run
# as `/usr/bin/python3.11` (so sys.executable, prefix and every check before are as they were),
# with one twist on one step, keyed on the script's own first line.
RUN_REAL = 'exec -a /usr/bin/python3.11 /usr/bin/python3.11.real "$@"'
WRAPPERS = {
    # asked for the new layer (inside/layer.py), it adds a whiteout of the whole site folder to the tar
    "layer-whiteout": f"""#!/bin/bash
case "$*" in *"Write the new image layer"*) set -- "$@" --delete /{SITE} ;; esac
{RUN_REAL}
""",
    # asked to byte-compile (inside/compile.py), it compiles, then removes the folder above a patched file
    "compile-rmtree": f"""#!/bin/bash
case "$*" in *"Byte-compile the given files"*) ({RUN_REAL}); status=$?; rm -rf /{SITE}/vllm/models; exit $status ;; esac
{RUN_REAL}
""",
}


def _python_binary(image: str) -> bytes:
    done = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/cat", image,
                           "/usr/bin/python3.11"], capture_output=True, check=True, timeout=300)
    assert done.stdout[:4] == b"\x7fELF"
    return done.stdout


def _config(info: dict) -> dict:
    return {k: v for k, v in info["Config"].items() if v not in (None, "", [], {})}


def _containers_of(image_id: str) -> list[str]:
    done = subprocess.run(["docker", "ps", "-a", "-q", "--filter", f"ancestor={image_id}"],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def _exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The hostile images (name -> tag; `tar-CASE` for each differential), and the fixture
    patched by apply ("patched")."""
    where = tmp_path_factory.mktemp("hostile-apply")
    copy = vllm.tree_copy("0.33.0", where / "copy" / "site-packages")
    patched_tree = vllm.tree_copy("0.33.0", where / "patched" / "site-packages")
    res = run("apply", "--root", str(patched_tree), "--python", sys.executable, "--no-probe",
              "--report-dir", str(where / "tree"))
    assert res.returncode == 0, res.stderr
    tops = {case: hostile.layer([Raw(raw)]) for case, raw in _differentials({"patched": patched_tree}).items()
            if case in ENGINE_LOADS}
    fixture = images.fixture_image()
    info = _inspect(fixture)
    lower, config = list(info["RootFS"]["Layers"]), _config(info)
    tags: dict[str, str] = {}
    try:
        patched = tags["patched"] = f"{PREFIX}-patched:1"
        res = run("apply", "--image", fixture, "--tag", patched, "--pull", "never", "--no-probe",
                  "--report-dir", str(where / "apply"))
        assert res.returncode == 0, res.stderr[-800:]
        patched_info = _inspect(patched)
        cases = {
            # an unpatched vLLM in the site folder of a python3.14 the image does not have
            "decoy": [*lower, site_layer(copy, DECOY_SITE)],
            # the same decoy beside the really patched image (it claims the patch in its labels)
            "patched-decoy": [*patched_info["RootFS"]["Layers"], site_layer(copy, DECOY_SITE)],
        }
        # new-layer-check: the fixture's python3.11 moved aside, a wrapper in its place
        binary = _python_binary(fixture)
        cases |= {f"python-{name}": [*lower, hostile.layer([
            File("usr/bin/python3.11.real", binary, 0o755), File("usr/bin/python3.11", script.encode(), 0o755)])]
            for name, script in WRAPPERS.items()}
        # tar-differential: each tar differential dockerd loads, as one layer over the real fixture
        cases |= {f"tar-{case}": [*lower, top] for case, top in tops.items()}
        for name, layers in cases.items():
            tags[name] = f"{PREFIX}-{name.replace(' ', '-').lower()}:1"
            loaded = _load(layers, tags[name], _config(patched_info) if name == "patched-decoy" else config)
            assert loaded is not None, f"the engine refused {name}"
        yield tags
    finally:
        for tag in tags.values():
            subprocess.run(["docker", "rmi", "-f", tag, f"{tag}-out"], capture_output=True, check=False)


def _refused(tag: str, report: Path, *, says: tuple[str, ...], extra: tuple[str, ...] = ()) -> dict:
    """apply on `tag` (with `extra` options) exits 1 with one line saying `says`; nothing tagged,
    no container left, the source image's id unchanged. Returns the audit report."""
    before = _inspect(tag)["Id"]
    res = run("apply", "--image", tag, "--tag", f"{tag}-out", "--pull", "never", "--no-probe", *extra,
              "--report-dir", str(report))
    line = res.assert_clean_error(1)
    for text in says:
        assert text in line, line
    assert not _exists(f"{tag}-out")
    assert _inspect(tag)["Id"] == before
    assert _containers_of(before) == []
    audit = json.loads((report / "audit.json").read_text())
    assert audit["status"] == "failed" and audit["result_image"] is None
    return audit


# --- decoy-site-folder: a decoy site folder -------------------------------------------------------
def test_apply_refuses_an_image_with_a_vllm_no_interpreter_imports(made: dict[str, str], tmp_path: Path) -> None:
    audit = _refused(made["decoy"], tmp_path / "a", says=(f"/{DECOY_SITE}/vllm", "no interpreter of the image imports",
                                                          f"/{SITE}", "nothing was written"))
    assert audit["errors"][0]["kind"] == "unimported-copy"
    steps = [s["name"] for s in audit["steps"]]
    assert "write" not in steps and "integrity" not in steps, steps  # refused before the base check, before writing


def test_verify_fails_a_patched_image_beside_a_decoy(made: dict[str, str], tmp_path: Path) -> None:
    # The patched image alone verifies; the same image with the decoy beside it does not.
    ok = run("verify", "--image", made["patched"], "--pull", "never", "--no-probe", "--report-dir", str(tmp_path / "ok"))
    assert ok.returncode == 0, ok.stderr[-800:]
    res = run("verify", "--image", made["patched-decoy"], "--pull", "never", "--no-probe",
              "--report-dir", str(tmp_path / "v"))
    line = res.assert_clean_error(1)
    assert f"/{DECOY_SITE}/vllm" in line and "no interpreter of the image imports" in line, line
    assert "OK: verified" not in res.stdout + res.stderr
    # and apply refuses it too, rather than calling it already applied and tagging it
    _refused(made["patched-decoy"], tmp_path / "a", says=(f"/{DECOY_SITE}/vllm",))


# --- tar-differential: tar differentials the engine loads -----------------------------------------
@pytest.fixture(scope="module")
def hostile_tops(made: dict[str, str]) -> dict[str, str]:
    """Each differential's layer digest (what the refusal must name), read back from the engine."""
    return {case: _inspect(made[f"tar-{case}"])["RootFS"]["Layers"][-1] for case in ENGINE_LOADS}


# What dockerd writes for three of them is refused by apply's own checks before the layer check is
# waited for: Go reads the size after the NUL, and joins a star header's prefix, and so writes the
# patched envs.py (one file patched, the other not); it takes the GNU long name, writing an
# envs.py.other the wheel does not have. The other two leave a stray file outside the site folder.
SEEN_BY_APPLY = {
    "size with leading NUL": ("partly-applied", ("partly applied", "vllm/envs.py")),
    "pax path and gnu long name": ("modified-base", ("vllm/envs.py.other: added (not in the published wheel)",)),
    "star trailer": ("partly-applied", ("partly applied", "vllm/envs.py")),
}


@pytest.mark.parametrize("case", ENGINE_LOADS)
def test_apply_refuses_a_layer_the_strict_reader_refuses(made: dict[str, str], hostile_tops: dict[str, str],
                                                          tmp_path: Path, case: str) -> None:
    """The engine unpacks these its own (Go's) way, and what apply then sees in the container is
    the clean fixture plus a stray file outside the site folder (it would patch that); but the image is hostile and the
    audit of a result built on it would be an error row, so apply refuses it, naming the layer,
    before anything is committed or tagged (the layer check runs beside the other steps and is
    waited for before the commit)."""
    seen = SEEN_BY_APPLY.get(case)
    if seen is not None:  # the engine wrote something apply's own checks refuse first
        kind, says = seen
        audit = _refused(made[f"tar-{case}"], tmp_path / "a", says=says)
        assert audit["errors"][0]["kind"] == kind
        return
    audit = _refused(made[f"tar-{case}"], tmp_path / "a", says=("layer", hostile_tops[case][7:19]),
                     extra=("--strict-layers",))
    assert audit["errors"][0]["kind"] == "hostile-layer", (case, audit["errors"])
    assert "write" in [s["name"] for s in audit["steps"] if s["status"] == "ok"]  # in the container only


def test_without_strict_layers_a_cold_apply_says_it_did_not_read_the_layers(made: dict[str, str], tmp_path: Path) -> None:
    """With an empty scan cache and no --strict-layers, apply reads no layer (that is a save of
    the whole image): it works on what the engine unpacked, here the clean fixture plus a stray
    file outside the site folder, and its report says the layers were not read and how to read
    them. The same run with --strict-layers refuses the image, naming the layer."""
    cache = {"DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    tag = made["tar-v7 prefix"]
    res = run("apply", "--image", tag, "--dry-run", "--pull", "never", "--no-probe", "--json",
              "--report-dir", str(tmp_path / "a"), env=cache)
    assert res.returncode == 0, res.stderr[-800:]
    said = [n for n in res.json["notes"] if "layers were not read with the strict layer reader" in n]
    assert said and "--strict-layers reads them" in said[0], res.json["notes"]
    assert "of the image, " not in " ".join(res.json["notes"])   # no save was made
    strict = run("apply", "--image", tag, "--dry-run", "--pull", "never", "--no-probe", "--strict-layers",
                 "--report-dir", str(tmp_path / "s"), env=cache)
    assert "layer" in strict.assert_clean_error(1)


# --- new-layer-check: the new layer's check, with the image's own python against it ---------------
def test_apply_refuses_a_new_layer_with_a_whiteout_above_a_patched_file(made: dict[str, str], tmp_path: Path) -> None:
    """The python passes locate, the base check and compile; the layer tar it writes carries a
    whiteout of the whole site folder. The layer check (pipeline/image_steps.py: take_layer,
    layer_changes) refuses it: nothing committed, nothing tagged."""
    audit = _refused(made["python-layer-whiteout"], tmp_path / "a",
                     says=("the new layer would differ from the patched files", f"D /{SITE}"))
    assert audit["errors"][0]["kind"] == "layer-mismatch"
    assert audit["compile"]["ok"] and audit["layer"]["ok"] is False
    assert {"kind": "D", "path": f"/{SITE}"} in audit["layer"]["unexpected"]


def test_a_folder_removed_in_the_work_container_never_reaches_the_layer(made: dict[str, str], tmp_path: Path) -> None:
    """The python removes `vllm/models` (above a patched file) right after compiling. The layer
    is a tar of the named paths only, so the removal cannot become a whiteout in it; the patched
    file is gone, so taking the layer fails and apply refuses."""
    audit = _refused(made["python-compile-rmtree"], tmp_path / "a",
                     says=("taking the new layer from the container failed", "No such file or directory"))
    assert audit["compile"]["ok"] and audit["layer"] is None


def test_a_vllm_of_a_second_real_interpreter_is_no_decoy(tmp_path: Path) -> None:
    # two-pythons: python3 on PATH has no vLLM, /opt/vllm-env's interpreter imports it
    image = images.two_pythons_image()
    out = f"{PREFIX}-two-pythons:1"
    try:
        res = run("apply", "--image", image, "--tag", out, "--pull", "never", "--no-probe", "--json",
                  "--report-dir", str(tmp_path))
        assert res.returncode == 0, res.stderr[-800:]
        assert _exists(out)
        # the copy that runs was patched, with the interpreter that imports it
        assert (res.json["target"]["python"], res.json["target"]["distribution"]["location"]) == \
            ("/opt/vllm-env/bin/python3", "/opt/vllm-env/lib/python3.11/site-packages")
    finally:
        subprocess.run(["docker", "rmi", "-f", out], capture_output=True, check=False)
