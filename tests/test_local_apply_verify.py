"""apply / verify / probe on a real vLLM 0.33.0 tree, through the console script."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest

from dspark_patch.patchset import resolve
from dspark_patch.report.audit_json import load_schema
from tests.support.cli import run
from tests.support.vllm import replace_file

PY = sys.executable
PATCH_SET = resolve("dspark-skip-mtp-buffer")
VARIANT = PATCH_SET.variant_for("0.33.0")
MODEL = "vllm/models/deepseek_v4/nvidia/model.py"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(tree: Path) -> dict[str, str]:
    """Every file the patch touches, plus its bytecode, as (path -> sha256 or 'absent')."""
    out = {}
    for rel in VARIANT.files:
        p = tree / rel
        out[rel] = sha(p) if p.exists() else "absent"
        pyc = p.parent / "__pycache__" / f"{p.stem}.cpython-{sys.version_info[0]}{sys.version_info[1]}.pyc"
        out[str(pyc.relative_to(tree))] = sha(pyc) if pyc.exists() else "absent"
    return out


def test_apply_verify_and_reapply_on_a_fresh_real_tree(vllm033_tree: Path, tmp_path: Path) -> None:
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--report-dir", str(tmp_path / "apply"))
    assert res.returncode == 0, res.stderr
    audit = json.loads((tmp_path / "apply" / "audit.json").read_text())
    jsonschema.validate(audit, load_schema())
    assert audit["status"] == "applied"
    assert audit["target"]["distribution"] == {"name": "vllm", "version": "0.33.0", "location": str(vllm033_tree)}
    assert audit["patch"]["id"] == "dspark-skip-mtp-buffer" and audit["patch"]["variant"] == "vllm-0.33.0"
    assert sorted(f["path"] for f in audit["files"]) == sorted(VARIANT.files)  # the loop below sees every file
    for f in audit["files"]:
        assert f["pre_sha256"] == VARIANT.files[f["path"]].pre_sha256
        assert f["post_sha256"] == VARIANT.files[f["path"]].post_sha256 == sha(vllm033_tree / f["path"])
        assert f["hunks"] and all(h["fuzz"] == 0 for h in f["hunks"])
    assert audit["compile"]["ok"] and {c["path"] for c in audit["compile"]["files"]} == set(VARIANT.files)
    assert audit["probe"]["ok"] and len(audit["probe"]["cases"]) >= 5

    res = run("verify", "--root", str(vllm033_tree), "--python", PY, "--report-dir", str(tmp_path / "verify"))
    assert res.returncode == 0, res.stderr
    audit = json.loads((tmp_path / "verify" / "audit.json").read_text())
    jsonschema.validate(audit, load_schema())
    assert audit["status"] == "verified"
    assert audit["integrity"]["checked"] > 5000 and audit["integrity"]["mismatched"] == []
    assert any(p.startswith("../") for p in audit["integrity"]["not_checked"])  # ../../bin/vllm, never followed

    before = snapshot(vllm033_tree)
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--json", "--report-dir", str(tmp_path / "again"))
    assert res.returncode == 0
    assert res.json["status"] == "already-applied"
    assert snapshot(vllm033_tree) == before


def test_dry_run_writes_nothing(vllm033_tree: Path, tmp_path: Path) -> None:
    before = snapshot(vllm033_tree)
    res = run("apply", "--root", str(vllm033_tree), "--dry-run", "--json", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    assert res.json["status"] == "dry-run"
    assert [f["post_sha256"] for f in res.json["files"]] == [VARIANT.files[f["path"]].post_sha256 for f in res.json["files"]]
    assert snapshot(vllm033_tree) == before


def test_json_mode_prints_only_the_report(vllm033_tree: Path, tmp_path: Path) -> None:
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--no-probe", "--json", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0
    doc = json.loads(res.stdout)  # the whole stdout is one JSON document
    jsonschema.validate(doc, load_schema())
    assert doc == json.loads((tmp_path / "r" / "audit.json").read_text())


def test_drifted_file_is_refused_and_tree_untouched(vllm033_tree: Path, tmp_path: Path) -> None:
    model = vllm033_tree / MODEL
    replace_file(model, model.read_bytes().replace(b"needs_mtp_hidden_states", b"needs_mtp_hidden_state5", 1))
    before = snapshot(vllm033_tree)
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(1)
    assert MODEL in line and "pre-image" in line
    assert snapshot(vllm033_tree) == before
    audit = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert audit["status"] == "failed" and audit["errors"][0]["kind"] == "hash-mismatch"


def test_allow_unknown_base_still_refuses_a_hunk_whose_context_drifted(vllm033_tree: Path, tmp_path: Path) -> None:
    model = vllm033_tree / MODEL
    replace_file(model, model.read_bytes().replace(b"needs_mtp_hidden_states", b"needs_mtp_hidden_state5"))
    before = snapshot(vllm033_tree)
    res = run("apply", "--root", str(vllm033_tree), "--allow-unknown-base", "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(1)
    assert MODEL in line and "hunk" in line
    assert snapshot(vllm033_tree) == before


def test_allow_unknown_base_applies_when_only_unrelated_lines_differ(vllm033_tree: Path, tmp_path: Path) -> None:
    envs = vllm033_tree / "vllm/envs.py"
    replace_file(envs, b"# a local comment at the top\n" + envs.read_bytes())
    res = run("apply", "--root", str(vllm033_tree), "--allow-unknown-base", "--no-probe", "--json",
              "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    doc = res.json
    assert doc["patch"]["hash_checks"] is False
    assert any("allow-unknown-base" in n for n in doc["notes"])
    envs_report = next(f for f in doc["files"] if f["path"] == "vllm/envs.py")
    assert all(h["offset"] == 1 for h in envs_report["hunks"])


def test_compile_error_restores_the_pre_image(vllm033_tree: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.patch"
    head = (vllm033_tree / "vllm/envs.py").read_bytes().splitlines(keepends=True)[:6]
    bad.write_bytes(
        b"--- a/vllm/envs.py\n+++ b/vllm/envs.py\n@@ -1,6 +1,7 @@\n"
        + b"".join(b" " + l for l in head[:3]) + b"+def broken(:\n" + b"".join(b" " + l for l in head[3:])
    )
    before = snapshot(vllm033_tree)
    res = run("apply", "--root", str(vllm033_tree), "--patch", str(bad), "--python", PY, "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(1)
    assert "vllm/envs.py" in line and "compile" in line
    assert snapshot(vllm033_tree) == before


def test_the_same_patch_set_in_two_folders_gives_the_same_patch_section(patched033_tree: Path, tmp_path: Path) -> None:
    sections = []
    for machine in ("machine-a/home/alice/checkout", "machine-b/builds/group/project"):
        folder = tmp_path / machine / "dspark-skip-mtp-buffer"
        shutil.copytree(PATCH_SET.source, folder)
        res = run("verify", "--root", str(patched033_tree), "--python", PY, "--no-probe", "--patch", str(folder),
                  "--report-dir", str(tmp_path / machine / "report"))
        assert res.returncode == 0, res.stderr
        sections.append(json.loads((tmp_path / machine / "report" / "audit.json").read_text())["patch"])
        for written in (tmp_path / machine / "report").iterdir():
            assert machine not in written.read_text(), written.name
    assert sections[0] == sections[1]
    assert sections[0]["source"] == "vllm-0.33.0.patch"
    assert (sections[0]["id"], sections[0]["variant"], sections[0]["sha256"]) == (
        "dspark-skip-mtp-buffer", "vllm-0.33.0", VARIANT.diff_sha256)


def test_verify_catches_stale_bytecode(patched033_tree: Path, tmp_path: Path) -> None:
    # (the tree: `apply --no-probe` of a fresh one, made once per session, tests/conftest.py)
    pyc = patched033_tree / "vllm/models/deepseek_v4/nvidia/__pycache__" / f"model.cpython-{sys.version_info[0]}{sys.version_info[1]}.pyc"
    data = bytearray(pyc.read_bytes())
    data[8:16] = bytes(8)  # a source hash that matches no source
    replace_file(pyc, bytes(data))
    res = run("verify", "--root", str(patched033_tree), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "v"))
    line = res.assert_clean_error(1)
    assert "model.cpython" in line and "stale" in line


def test_verify_catches_an_edited_patched_file(patched033_tree: Path, tmp_path: Path) -> None:
    # (the tree: `apply --no-probe` of a fresh one, made once per session, tests/conftest.py)
    envs = patched033_tree / "vllm/envs.py"
    replace_file(envs, envs.read_bytes() + b"# edited after patching\n")
    res = run("verify", "--root", str(patched033_tree), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "v"))
    line = res.assert_clean_error(1)
    assert "vllm/envs.py is changed" in line


def test_verify_catches_an_edited_unrelated_file(patched033_tree: Path, tmp_path: Path) -> None:
    # (the tree: `apply --no-probe` of a fresh one, made once per session, tests/conftest.py)
    other = patched033_tree / "vllm/sampling_params.py"
    replace_file(other, other.read_bytes().replace(b"def ", b"def  ", 1))
    res = run("verify", "--root", str(patched033_tree), "--python", PY, "--no-probe", "--json", "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 1
    assert res.json["integrity"]["mismatched"] == ["vllm/sampling_params.py"]
    assert "vllm/sampling_params.py" in res.stderr


def test_verify_of_an_unpatched_tree_says_unpatched(vllm033_tree: Path, tmp_path: Path) -> None:
    # (no probe: the verdict comes from the patched files; the probe on an unpatched tree is
    # the next test's)
    res = run("verify", "--root", str(vllm033_tree), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "v"))
    line = res.assert_clean_error(1)
    assert "unpatched" in line


def test_probe_command_fails_on_an_unpatched_tree_and_passes_after_apply(vllm033_tree: Path, tmp_path: Path) -> None:
    res = run("probe", "--root", str(vllm033_tree), "--python", PY, "--json", "--report-dir", str(tmp_path / "p1"))
    assert res.returncode == 1
    failing = [c["name"] for c in res.json["probe"]["cases"] if not c["ok"]]
    assert failing, "an unpatched tree must fail the probe"
    # (apply's own probe run is the first test's; here the probe command says it passes)
    assert run("apply", "--root", str(vllm033_tree), "--python", PY, "--no-probe", "--report-dir", str(tmp_path / "a")).returncode == 0
    res = run("probe", "--root", str(vllm033_tree), "--python", PY, "--json", "--report-dir", str(tmp_path / "p2"))
    assert res.returncode == 0 and res.json["probe"]["ok"]


def test_release_without_a_variant_is_refused_naming_both(tmp_path: Path, vllm033_tree: Path) -> None:
    info = vllm033_tree / "vllm-0.33.0.dist-info"
    meta = info / "METADATA"
    replace_file(meta, meta.read_bytes().replace(b"Version: 0.33.0", b"Version: 0.32.1", 1))
    res = run("apply", "--root", str(vllm033_tree), "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(2)
    assert "0.32.1" in line and "0.33.0" in line


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["apply", "--root", "/nonexistent/site-packages"], 2, "no such directory"),
        (["apply", "--root", "{tree}", "--patch", "no-such-patch-set"], 2, "no-such-patch-set"),
        (["apply", "--root", "{tree}", "--python", "/nonexistent/python3"], 2, "no such interpreter"),
        (["apply", "--root", "{tree}", "--image", "x"], 2, "exactly one target"),
        (["apply", "--root", "{empty}"], 2, "no vllm distribution"),
        (["apply", "--root", "{tree}", "--patch", "{garbage}"], 2, "garbage.patch"),
    ],
)
def test_bad_input_is_one_clean_line(args, code, words, vllm033_tree: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.patch"
    garbage.write_bytes(b"this is not a diff\n\x00\xff\n")
    (tmp_path / "empty").mkdir()
    args = [a.format(tree=vllm033_tree, empty=tmp_path / "empty", garbage=garbage) for a in args]
    before = snapshot(vllm033_tree)
    res = run(*args, "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert words in res.assert_clean_error(code)
    assert snapshot(vllm033_tree) == before


def test_list_and_show_name_the_patch_set() -> None:
    res = run("list")
    assert res.returncode == 0 and "dspark-skip-mtp-buffer" in res.stdout and "0.33.0" in res.stdout
    res = run("show", "dspark-skip-mtp-buffer", "--json")
    assert res.returncode == 0
    shown = res.json["variants"][0]["files"]
    assert shown == {p: {"pre_sha256": h.pre_sha256, "post_sha256": h.post_sha256} for p, h in VARIANT.files.items()}


DFLASH = "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"
RESIDUAL_READ_ANCHOR = "        start = 0\n        if num_graph_tokens and self._aux_staging is not None:\n"


def test_a_failing_probe_restores_the_tree_sources_and_bytecode(vllm033_tree: Path, tmp_path: Path) -> None:
    """The consumer in this tree reads the residual, so skipping the buffer would be wrong:
    apply must fail on the probe and leave every patched file and its bytecode as it was."""
    consumer = vllm033_tree / DFLASH
    source = consumer.read_bytes()
    assert source.count(RESIDUAL_READ_ANCHOR.encode()) == 1
    replace_file(consumer, source.replace(RESIDUAL_READ_ANCHOR.encode(),
                                          b"        _ = last_hidden_states[:num_tokens].sum()\n" + RESIDUAL_READ_ANCHOR.encode()))
    before = snapshot(vllm033_tree)
    assert all(v != "absent" for v in before.values())  # pip compiled them: the restore must bring them back
    # --allow-unknown-base: the edited consumer is not the published wheel, which apply refuses
    # before writing anything; here the probe has to be the one that says no
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--allow-unknown-base", "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(1)
    assert "probe" in line and "consumer: an eager step combines the aux states, never reads the residual" in line
    assert snapshot(vllm033_tree) == before
    audit = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert audit["status"] == "failed" and audit["errors"][0]["kind"] == "probe-failed"
    assert [s["name"] for s in audit["steps"]][-1] == "restore"
