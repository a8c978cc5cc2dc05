"""References for any release (docs/status.md, "A release the package ships no reference for"):
`reference add` makes one from the real wheel into the user's folder, every lookup reads it, a
tampered one is one clear error line, and a shipped reference wins over a user file of its name.

Real data: vLLM 0.30.0, a release the package ships no reference for, its real wheel and a real
`pip install --target` of it (tests/support/vllm.py); pip itself fetches in the `NAME==RELEASE`
cases, pointed at the cached wheels (`PIP_NO_INDEX`, `PIP_FIND_LINKS`: the same code path as an index).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from dspark_patch.references import build
from tests.support import vllm
from tests.support.cli import run
from tests.support.vllm import replace_file

RELEASE = "0.30.0"
NAME = f"vllm-{RELEASE}-cp38-abi3-manylinux_2_28_x86_64.json.gz"
FIX = f"dspark-patch reference add vllm=={RELEASE}"


@pytest.fixture(scope="module")
def reference_bytes() -> bytes:
    """0.30.0's reference as the shipped ones' builder makes it from the real wheel."""
    return build.encode(build.reference_from_wheel(vllm.wheel(RELEASE)))


def _env(refs: Path, **more: str) -> dict[str, str]:
    return {"DSPARK_PATCH_REFERENCES": str(refs), **more}


def _pip_from_cache(refs: Path) -> dict[str, str]:
    """pip as a user runs it, offline: the cached wheels folder is its only index."""
    return _env(refs, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(vllm.wheel(RELEASE).parent))


def _status(tree: Path, env: dict[str, str]) -> tuple[int, dict]:
    res = run("status", "--root", str(tree), "--json", env=env)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, res.json["images"][0]


def test_a_release_with_no_reference_gets_one_and_then_reads_clean(tmp_path: Path, reference_bytes: bytes) -> None:
    tree = vllm.tree_copy(RELEASE, tmp_path / "site-packages")
    refs = tmp_path / "refs"
    env = _env(refs)

    code, row = _status(tree, env)
    assert code == 1 and row["reference"] is None
    assert row["unverified"][0].startswith(f"no reference for vllm {RELEASE}") and FIX in row["unverified"][0]
    shown = run("status", "--root", str(tree), env=env)
    assert shown.returncode == 1 and "not covered" in shown.stderr and FIX in shown.stdout

    added = run("reference", "add", str(vllm.wheel(RELEASE)), "--json", env=env)
    assert added.returncode == 0, added.stderr
    assert added.json["outcome"] == "written" and added.json["reference"] == NAME and not added.json["fetched"]
    assert (refs / NAME).read_bytes() == reference_bytes      # the shipped ones' builder, byte for byte
    assert os.listdir(refs) == [NAME]                          # written through a temporary name, renamed
    again = run("reference", "add", str(vllm.wheel(RELEASE)), "--json", env=env)
    assert again.returncode == 0 and again.json["outcome"] == "unchanged"

    code, row = _status(tree, env)
    assert code == 0 and row["reference"] == NAME.replace(".json.gz", ".whl"), row
    assert not any("no reference" in line for line in row["unverified"])
    shown = run("status", "--root", str(tree), env=env)
    assert shown.returncode == 0 and "no reference" not in shown.stdout + shown.stderr

    listed = run("reference", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    mine = [r for r in listed.json["references"] if r["origin"] == "user"]
    assert mine == [{"reference": NAME, "origin": "user", "path": str(refs / NAME), "wheel": NAME.replace(".json.gz", ".whl"),
                     "files": len(json.loads(gzip.decompress(reference_bytes))["files"]), "error": None}]
    assert any(r["origin"] == "shipped" and r["reference"].startswith("vllm-0.34.0-") for r in listed.json["references"])

    envs = tree / "vllm/envs.py"
    replace_file(envs, envs.read_bytes() + b"\n# changed by hand\n")
    code, row = _status(tree, env)
    assert code == 1 and row["unexplained"] == ["vllm/envs.py"] and row["reference"] == NAME.replace(".json.gz", ".whl")


def test_reference_add_fetches_the_release_with_pip(tmp_path: Path, reference_bytes: bytes) -> None:
    refs = tmp_path / "refs"
    added = run("reference", "add", f"vllm=={RELEASE}", "--json", env=_pip_from_cache(refs))
    assert added.returncode == 0, added.stderr
    assert added.json["fetched"] and added.json["outcome"] == "written"
    assert (refs / NAME).read_bytes() == reference_bytes
    nothing = run("reference", "add", "vllm==0.0.1", env=_pip_from_cache(refs))
    assert "pip download vllm==0.0.1 failed" in nothing.assert_clean_error(3)
    assert "is not NAME==RELEASE" in run("reference", "add", "vllm>=0.30", env=_env(refs)).assert_clean_error(2)
    assert os.listdir(refs) == [NAME]


def _doc(data: bytes) -> dict:
    return json.loads(gzip.decompress(data))


def _gz(doc: dict | str) -> bytes:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    return gzip.compress(text.encode(), mtime=0)


def _tampered(good: bytes, how: str) -> tuple[str, bytes]:
    doc = _doc(good)
    if how == "not gzip":
        return NAME, b"not gzip at all"
    if how == "a hash that is not hex":
        doc["files"]["vllm/envs.py"][0] = "Z" * 64
    elif how == "a size that is a string":
        doc["files"]["vllm/envs.py"][1] = "12"
    elif how == "a path out of the tree":
        doc["files"]["../../etc/profile"] = doc["files"].pop("vllm/envs.py")
    elif how == "another release than its name":
        doc["release"] = "0.29.0"
    elif how == "a key twice":
        text = json.dumps(doc)
        return NAME, _gz(text[:-1] + ', "release": "0.29.0"}')
    elif how == "an extra key":
        doc["trusted"] = True
    elif how == "too large":
        return NAME, os.urandom(16 * 1024 * 1024 + 1)
    return NAME, _gz(doc)


@pytest.mark.parametrize("how", ["not gzip", "a hash that is not hex", "a size that is a string", "a path out of the tree",
                                 "another release than its name", "a key twice", "an extra key", "too large"])
def test_a_tampered_user_reference_is_one_clear_error_line(tmp_path: Path, reference_bytes: bytes, how: str) -> None:
    refs = tmp_path / "refs"
    refs.mkdir()
    name, data = _tampered(reference_bytes, how)
    (refs / name).write_bytes(data)
    line = run("reference", "list", env=_env(refs)).assert_clean_error(2)
    assert str(refs / name) in line and f"{FIX}" in line
    assert "not a reference the tool can trust" in line or "more than the" in line
    tree = vllm.tree_copy(RELEASE, tmp_path / "site-packages")
    code, row = _status(tree, _env(refs))
    assert code == 2 and row["exit_code"] == 2 and str(refs / name) in row["error"]  # never read as clean, never skipped


def test_a_link_in_the_references_folder_is_refused(tmp_path: Path, reference_bytes: bytes) -> None:
    refs = tmp_path / "refs"
    refs.mkdir()
    (tmp_path / "elsewhere.json.gz").write_bytes(reference_bytes)
    (refs / NAME).symlink_to(tmp_path / "elsewhere.json.gz")
    assert "is a symbolic link" in run("reference", "list", env=_env(refs)).assert_clean_error(2)


def test_a_shipped_reference_wins_over_a_user_file_of_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import resources

    from dspark_patch import references

    name = "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.json.gz"
    shipped = resources.files("dspark_patch.references").joinpath(name).read_bytes()
    doc = _doc(shipped)
    doc["files"]["vllm/envs.py"][0] = "0" * 64
    refs = tmp_path / "refs"
    refs.mkdir()
    (refs / name).write_bytes(build.encode(doc))
    listed = run("reference", "list", "--json", env=_env(refs))
    assert listed.returncode == 0, listed.stderr
    assert listed.json["shadowed"] == [{"reference": name, "path": str(refs / name), "differs": True}]
    assert [r for r in listed.json["references"] if r["reference"] == name] == [
        {"reference": name, "origin": "shipped", "path": str(resources.files("dspark_patch.references").joinpath(name)),
         "wheel": name.replace(".json.gz", ".whl"), "files": len(doc["files"]), "error": None}]
    assert "DIFFER" in run("reference", "list", env=_env(refs)).stdout
    monkeypatch.setenv("DSPARK_PATCH_REFERENCES", str(refs))
    assert [(e.name, e.origin) for e in references.entries("vllm", "0.34.0")] == [
        (n, "shipped") for n in references.shipped("vllm", "0.34.0")]


@pytest.mark.slow
def test_reference_add_of_a_shipped_wheel_writes_nothing(tmp_path: Path) -> None:
    refs = tmp_path / "refs"
    added = run("reference", "add", str(vllm.wheel("0.34.0")), "--json", env=_env(refs))
    assert added.returncode == 0, added.stderr
    assert added.json["outcome"] == "shipped" and not refs.exists()


def test_new_fetches_the_wheel_of_the_trees_release(tmp_path: Path) -> None:
    """`new` without --wheel: pip fetches the tree's release, for the tree's platform."""
    tree = vllm.tree_copy("0.33.0", tmp_path / "site-packages")
    gone = "vllm/collect_env.py"
    (tree / gone).unlink()
    env = _env(tmp_path / "refs", PIP_NO_INDEX="1", PIP_FIND_LINKS=str(vllm.wheel("0.33.0").parent))
    res = run("new", "team-drop", "--root", str(tree), "--out", str(tmp_path / "out"), "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert res.json["files"] == [{"path": gone, "action": "delete"}]


@pytest.mark.slow
def test_reference_add_passes_the_platform_to_pip(tmp_path: Path) -> None:
    """--platform fetches another platform's wheel: 0.34.0's aarch64 one, whose reference is shipped."""
    arm = vllm.platform_wheel("0.34.0", "manylinux_2_28_aarch64")
    refs = tmp_path / "refs"
    env = _env(refs, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(arm.parent))
    added = run("reference", "add", "vllm==0.34.0", "--platform", "manylinux_2_28_aarch64", "--json", env=env)
    assert added.returncode == 0, added.stderr
    assert added.json["outcome"] == "shipped" and added.json["wheel"] == arm.name and not refs.exists()
    line = run("reference", "add", str(arm), "--platform", "manylinux_2_28_aarch64", env=env).assert_clean_error(2)
    assert "--platform picks the wheel pip downloads" in line
