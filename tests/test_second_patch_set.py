"""The tool is general: a second patch set (its own vLLM 0.33.0 file, hashes and probe) goes
through apply / verify / probe on a real tree, and `probe --patch` runs THAT patch set's probe.

The patch set lives in tests/data/patchsets/ and is used by folder (`--patch DIR`), as a team
with its own reviewed patches would use the tool.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest

from dspark_patch import __version__
from dspark_patch.patchset import load_dir
from dspark_patch.report.audit_json import load_schema
from tests.support.cli import run
from tests.support.vllm import replace_file

PY = sys.executable
SECOND = Path(__file__).resolve().parent / "data" / "patchsets" / "vllm-math-positive-divisor"
MATH = "vllm/utils/math_utils.py"
CASES = ["cdiv-positive-divisor", "round-up-positive-multiple"]
DSPARK_CASE = "census: no unguarded reader of _mtp_hidden_buffer on the DSpark V2 path"  # one of the DSpark probe's cases, never the second set's


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def probe_cases(res) -> dict[str, bool]:
    return {c["name"]: c["ok"] for c in res.json["probe"]["cases"]}


@pytest.fixture
def no_probe_set(tmp_path: Path) -> Path:
    """The second patch set with its probe taken out of patch.toml."""
    dest = tmp_path / SECOND.name
    shutil.copytree(SECOND, dest)
    toml = dest / "patch.toml"
    toml.write_text(toml.read_text().replace('probe = "probe.py"\n', ""))
    (dest / "probe.py").unlink()
    return dest


def test_the_second_patch_set_applies_verifies_and_runs_its_own_probe(vllm033_tree: Path, tmp_path: Path):
    hashes = load_dir(SECOND).variant_for("0.33.0").files[MATH]
    assert sha(vllm033_tree / MATH) == hashes.pre_sha256  # the reviewed pre-image is the real wheel's

    res = run("probe", "--root", str(vllm033_tree), "--python", PY, "--patch", str(SECOND), "--json",
              "--report-dir", str(tmp_path / "p0"))
    assert res.returncode == 1, res.stderr  # unpatched: its own cases fail
    assert probe_cases(res) == {name: False for name in CASES}

    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", str(SECOND), "--json",
              "--report-dir", str(tmp_path / "apply"))
    assert res.returncode == 0, res.stderr
    jsonschema.validate(res.json, load_schema())
    assert res.json["patch"]["id"] == "vllm-math-positive-divisor"
    assert [f["path"] for f in res.json["files"]] == [MATH]
    assert sha(vllm033_tree / MATH) == hashes.post_sha256
    assert probe_cases(res) == {name: True for name in CASES}

    res = run("verify", "--root", str(vllm033_tree), "--python", PY, "--patch", str(SECOND), "--json",
              "--report-dir", str(tmp_path / "verify"))
    assert res.returncode == 0, res.stderr
    assert res.json["status"] == "verified" and probe_cases(res) == {name: True for name in CASES}

    res = run("probe", "--root", str(vllm033_tree), "--python", PY, "--patch", str(SECOND), "--json",
              "--report-dir", str(tmp_path / "p1"))
    assert res.returncode == 0, res.stderr
    assert list(probe_cases(res)) == CASES and DSPARK_CASE not in probe_cases(res)

    # Without --patch, `probe` runs the default patch set's probe: another set of cases.
    res = run("probe", "--root", str(vllm033_tree), "--python", PY, "--json", "--report-dir", str(tmp_path / "p2"))
    assert DSPARK_CASE in probe_cases(res) and not set(CASES) & set(probe_cases(res))


def test_a_mutant_that_breaks_the_second_patch_exits_1_naming_its_case(vllm033_tree: Path, tmp_path: Path):
    assert run("apply", "--root", str(vllm033_tree), "--patch", str(SECOND), "--no-probe",
               "--report-dir", str(tmp_path / "a")).returncode == 0
    patched = (vllm033_tree / MATH).read_text()
    guard = '    if b <= 0:\n        raise ValueError(f"cdiv: the divisor must be positive, got {b}")\n'
    assert guard in patched
    replace_file(vllm033_tree / MATH, patched.replace(guard, "").encode())

    res = run("probe", "--root", str(vllm033_tree), "--python", PY, "--patch", str(SECOND), "--json",
              "--report-dir", str(tmp_path / "p"))
    assert res.returncode == 1
    assert probe_cases(res) == {"cdiv-positive-divisor": False, "round-up-positive-multiple": True}
    assert "cdiv-positive-divisor" in res.json["probe"]["detail"]
    assert "ZeroDivisionError" in res.json["probe"]["cases"][0]["detail"]


def test_a_patch_set_without_a_probe_skips_the_step_and_probe_refuses(no_probe_set: Path, vllm033_tree: Path,
                                                                         tmp_path: Path):
    res = run("apply", "--root", str(vllm033_tree), "--python", PY, "--patch", str(no_probe_set), "--json",
              "--report-dir", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr
    step = next(s for s in res.json["steps"] if s["name"] == "probe")
    assert step["status"] == "skipped" and "no probe" in step["detail"]
    assert res.json["probe"]["ran"] is False and res.json["probe"]["cases"] == []

    res = run("probe", "--root", str(vllm033_tree), "--python", PY, "--patch", str(no_probe_set),
              "--report-dir", str(tmp_path / "p"))
    line = res.assert_clean_error(2)
    assert "vllm-math-positive-divisor has no probe" in line
    audit = json.loads((tmp_path / "p" / "audit.json").read_text())
    assert audit["status"] == "failed" and audit["probe"]["ran"] is False


def test_the_runner_keeps_to_the_contract_and_leaves_extra_keys_alone(vllm033_tree: Path, tmp_path: Path):
    """A probe may add its own top-level keys (notes of its own, say; `census` is read into the report); one whose verdict disagrees with
    its exit code, or that prints no verdict, fails rather than passing."""
    folder = tmp_path / SECOND.name
    shutil.copytree(SECOND, folder)
    verdicts = {
        "extra-keys": ('{"schema": "dspark-patch/probe/v1", "ok": true, "notes": [{"file": "x"}], '
                       '"cases": [{"name": "c", "ok": true, "detail": "fine"}]}', 0, 0),
        "ok-but-exit-1": ('{"schema": "dspark-patch/probe/v1", "ok": true, '
                          '"cases": [{"name": "c", "ok": true, "detail": "fine"}]}', 1, 1),
        "no-verdict": ("not json", 0, 1),
        "other-schema": ('{"schema": "someone-else/v9", "ok": true, "cases": []}', 0, 1),
    }
    for name, (stdout, code, expected_exit) in verdicts.items():
        (folder / "probe.py").write_text(f"import sys\nprint({stdout!r})\nsys.exit({code})\n")
        res = run("probe", "--root", str(vllm033_tree), "--python", PY, "--patch", str(folder), "--json",
                  "--report-dir", str(tmp_path / name))
        assert res.returncode == expected_exit, (name, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr
        if expected_exit:
            assert res.json["probe"]["ok"] is False and res.json["probe"]["detail"], name


def test_version_names_the_tool_and_its_release():
    res = run("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"dspark-patch {__version__}"
