"""`apply --root SITE --layer-out FILE`: the layer an image built without an engine gets, written
by apply on a real vLLM 0.33.0 tree (what a CI job running inside the serving image does).

The layer must hold exactly what `apply --image` appends (the patched files with their reviewed
post-image bytes, their bytecode and the folders above them, at the tree's own absolute paths),
and the report must name it by the digest an image config would (diff_id) and its size. A run
that does not apply writes no file."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tarfile
from pathlib import Path

import jsonschema

from dspark_patch.patchset import resolve
from dspark_patch.report.audit_json import load_schema
from tests.support.cli import run
from tests.support.vllm import replace_file

PY = sys.executable
VARIANT = resolve("dspark-skip-mtp-buffer").variant_for("0.33.0")
TAG = f"cpython-{sys.version_info[0]}{sys.version_info[1]}"


def _pyc(rel: str) -> str:
    folder, _, name = rel.rpartition("/")
    return f"{folder}/__pycache__/{name[:-3]}.{TAG}.pyc"


def _members(layer: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(layer) as tar:
        return {m.name: m for m in tar.getmembers()}


def _apply(tree: Path, out: Path, report: Path, *extra: str):  # noqa: ANN202
    return run("apply", "--root", str(tree), "--python", PY, "--no-probe", "--layer-out", str(out), *extra,
               "--report-dir", str(report))


def test_the_layer_holds_the_patched_files_their_bytecode_and_folders_and_the_report_names_it(
        vllm033_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "layer.tar"
    res = _apply(vllm033_tree, out, tmp_path / "r")
    assert res.returncode == 0, res.stderr
    audit = json.loads((tmp_path / "r" / "audit.json").read_text())
    jsonschema.validate(audit, load_schema())
    data = out.read_bytes()
    assert audit["layer"]["diff_id"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert audit["layer"]["size"] == len(data) and audit["layer"]["ok"] and audit["layer"]["unexpected"] == []
    assert any(str(out) in n and audit["layer"]["diff_id"] in n for n in audit["notes"]), audit["notes"]

    site = str(vllm033_tree).lstrip("/")
    members = _members(out)
    files = {name for name, m in members.items() if m.isfile()}
    assert files == {f"{site}/{rel}" for rel in VARIANT.files} | {f"{site}/{_pyc(rel)}" for rel in VARIANT.files}
    for rel, reviewed in VARIANT.files.items():
        with tarfile.open(out) as tar:
            body = tar.extractfile(f"{site}/{rel}")
            assert body is not None
            assert hashlib.sha256(body.read()).hexdigest() == reviewed.post_sha256 == \
                hashlib.sha256((vllm033_tree / rel).read_bytes()).hexdigest()
            pyc = tar.extractfile(f"{site}/{_pyc(rel)}")
            assert pyc is not None and pyc.read() == (vllm033_tree / _pyc(rel)).read_bytes()
    # Every folder above a file, up to the root, and nothing else: no link, no device, no other file.
    folders = {name for name, m in members.items() if m.isdir()}
    above = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    assert folders == above and set(members) == files | folders
    # Owner and mode as the tree has them.
    model = f"{site}/vllm/models/deepseek_v4/nvidia/model.py"
    st = (vllm033_tree / "vllm/models/deepseek_v4/nvidia/model.py").stat()
    assert (members[model].mode, members[model].uid) == (st.st_mode & 0o7777, st.st_uid)
    assert [c for c in audit["layer"]["changes"] if c["path"] == "/" + model] == [{"kind": "C", "path": "/" + model}]


def test_a_tree_without_bytecode_gets_it_in_the_layer(vllm033_tree: Path, tmp_path: Path) -> None:
    """uv's shape: no .pyc anywhere. The layer carries the patched modules' bytecode, compiled by
    the tree's interpreter, as new files (A), so a user who cannot write __pycache__ loads it."""
    for cache in list(vllm033_tree.rglob("__pycache__")):
        shutil.rmtree(cache)
    out = tmp_path / "layer.tar"
    res = _apply(vllm033_tree, out, tmp_path / "r")
    assert res.returncode == 0, res.stderr
    audit = json.loads((tmp_path / "r" / "audit.json").read_text())
    site = str(vllm033_tree).lstrip("/")
    members = _members(out)
    for rel in VARIANT.files:
        assert members[f"{site}/{_pyc(rel)}"].isfile()
        assert {"kind": "A", "path": f"/{site}/{_pyc(rel)}"} in audit["layer"]["changes"]


def test_a_run_that_does_not_apply_writes_no_layer(vllm033_tree: Path, tmp_path: Path) -> None:
    # A drifted file: refused before anything is written (exit 1), no layer, the tree as it was.
    envs = vllm033_tree / "vllm/envs.py"
    replace_file(envs, envs.read_bytes() + b"\n# drift\n")
    before = envs.read_bytes()
    out = tmp_path / "layer.tar"
    line = _apply(vllm033_tree, out, tmp_path / "r").assert_clean_error(1)
    assert "vllm/envs.py" in line and not out.exists() and envs.read_bytes() == before


def test_an_already_applied_tree_writes_no_layer_and_says_so(patched033_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "layer.tar"
    res = _apply(patched033_tree, out, tmp_path / "r")
    assert res.returncode == 0, res.stderr
    audit = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert audit["status"] == "already-applied" and not out.exists()
    assert any(n.startswith("--layer-out: no layer written") for n in audit["notes"]), audit["notes"]


def test_layer_out_needs_a_local_tree_that_apply_writes(vllm033_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "layer.tar"
    for args in (("--image", "127.0.0.1:9/none:1", "--pull", "never"), ("--root", str(vllm033_tree), "--dry-run")):
        line = run("apply", *args, "--layer-out", str(out), "--report-dir", str(tmp_path / "r")).assert_clean_error(2)
        assert "--layer-out" in line and "--root" in line
    assert not out.exists()
    line = run("apply", "--root", str(vllm033_tree), "--strict-layers", "--report-dir", str(tmp_path / "r")).assert_clean_error(2)
    assert "--strict-layers" in line and "--image" in line
    # A link planted under the file's name is refused before any work, never written through.
    (tmp_path / "elsewhere").write_bytes(b"keep")
    (tmp_path / "link.tar").symlink_to(tmp_path / "elsewhere")
    line = _apply(vllm033_tree, tmp_path / "link.tar", tmp_path / "r2").assert_clean_error(2)
    assert "link.tar" in line and (tmp_path / "elsewhere").read_bytes() == b"keep"
    assert hashlib.sha256((vllm033_tree / "vllm/envs.py").read_bytes()).hexdigest() == VARIANT.files["vllm/envs.py"].pre_sha256


def test_only_a_temporary_file_of_the_layer_script_is_taken_and_removed() -> None:
    """The python names the file it wrote the layer to; the tool reads it and then removes it, so a
    python that named another file (/etc/passwd) would have it removed: only inside/layer.py's own
    temporary file (absolute, `.dspark-layer-*.tar`, no '..') is taken, on both routes."""
    from dspark_patch.targets.layers.new_layer import layer_answer

    def said(path: object) -> bytes:
        return json.dumps({"path": path, "sha256": "0" * 64, "size": 1}).encode()

    assert layer_answer(said("/tmp/.dspark-layer-ab_12.tar")) == ("/tmp/.dspark-layer-ab_12.tar", "0" * 64, 1)
    for path in ("/etc/passwd", "tmp/.dspark-layer-ab.tar", "/tmp/../etc/.dspark-layer-ab.tar",
                 "/tmp/.dspark-layer-ab.tar/x", "/tmp/.dspark-layer-.tar", 7):
        assert layer_answer(said(path)) is None, path
    assert layer_answer(b"not json") is None and layer_answer(b'{"path": "/tmp/.dspark-layer-a.tar"}') is None
