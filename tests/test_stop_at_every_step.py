"""A Ctrl-C (SIGINT) or a cancel (SIGTERM) at every step of `apply`, `verify` and `status` on a
local tree ends the run with 130 or 143, one line saying so, never exit 0, and the tree exactly
as it was: no half-written file, no stale bytecode, no journal left for a later run to find.

The signal is a real one, sent by the process to itself as the step begins (support/stepsignals.py),
so it lands where a user's Ctrl-C would: in the middle of whatever that step does. The lists of
steps below are checked against the steps a clean run takes, so a step added to a command is a
step this file must cover. (The image flow's stops are tested beside its containers:
test_image_pipeline.py, test_probe_early.py, test_status.py.)
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from dspark_patch.patchset import resolve
from tests.support import cli
from tests.support.stepsignals import SENT, run_signalled_at

PY = sys.executable
APPLY_STEPS = ("open target", "load patch", "locate", "plan", "integrity", "write", "re-read", "compile", "probe")
VERIFY_STEPS = ("open target", "load patch", "locate", "patched files", "integrity", "probe")
SIGNALS = (signal.SIGINT, signal.SIGTERM)
SAID = {signal.SIGINT: "dspark-patch: interrupted; nothing was committed",
        signal.SIGTERM: "dspark-patch: terminated; nothing was committed"}


def _snapshot(tree: Path) -> dict[str, str]:
    """Every path under the tree; for the files the patch set changes and their bytecode, the
    sha256 of their bytes (a rollback that missed one shows; so does a temporary or journal file)."""
    changed = set(resolve("dspark-skip-mtp-buffer").variant_for("0.33.0").files)
    stems = {Path(p).stem for p in changed}
    out = {}
    for folder, dirs, files in os.walk(tree):
        for name in dirs + files:
            path = Path(folder, name)
            rel = path.relative_to(tree).as_posix()
            watched = rel in changed or ("__pycache__" in rel and name.split(".")[0] in stems)
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if watched and path.is_file() else ""
    return out


def _steps_of(res: cli.Result) -> tuple[str, ...]:
    assert res.returncode == 0, res.stderr
    return tuple(s["name"] for s in res.json["steps"] if s["status"] != "skipped")


def _assert_stopped(res, sig: signal.Signals, step: str) -> None:
    assert f"{SENT} {sig.name} at {step}" in res.stderr, res.stderr  # sent in that step
    assert res.returncode == 128 + sig, (res.returncode, res.stderr)  # never 0
    assert "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1] == SAID[sig], res.stderr


def test_the_steps_covered_here_are_the_steps_a_clean_run_takes(vllm033_tree: Path, tmp_path: Path) -> None:
    applied = cli.run("apply", "--root", str(vllm033_tree), "--python", PY, "--json", "--report-dir", str(tmp_path / "a"))
    assert _steps_of(applied) == APPLY_STEPS
    verified = cli.run("verify", "--root", str(vllm033_tree), "--python", PY, "--json", "--report-dir", str(tmp_path / "v"))
    assert _steps_of(verified) == VERIFY_STEPS


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("step", APPLY_STEPS)
def test_a_stop_during_an_apply_step_leaves_the_tree_as_it_was(step: str, sig: signal.Signals, vllm033_tree: Path,
                                                              tmp_path: Path) -> None:
    before = _snapshot(vllm033_tree)
    res = run_signalled_at(step, sig, "apply", "--root", str(vllm033_tree), "--python", PY,
                           "--report-dir", str(tmp_path / "r"))
    _assert_stopped(res, sig, step)
    assert _snapshot(vllm033_tree) == before
    # and the tree is one a new apply takes from the start (nothing of this run is left to finish)
    again = cli.run("apply", "--root", str(vllm033_tree), "--python", PY, "--no-probe", "--json",
                    "--report-dir", str(tmp_path / "again"))
    assert again.returncode == 0 and again.json["status"] == "applied", again.stderr
    assert not any("interrupted apply" in n for n in again.json["notes"]), again.json["notes"]


LAYER_OUT_STEPS = ("write", "compile", "layer", "probe", "layer out")


def test_with_layer_out_a_clean_run_takes_two_steps_more(vllm033_tree: Path, tmp_path: Path) -> None:
    applied = cli.run("apply", "--root", str(vllm033_tree), "--python", PY, "--json", "--layer-out",
                      str(tmp_path / "layer.tar"), "--report-dir", str(tmp_path / "a"))
    steps = _steps_of(applied)
    assert steps == (*APPLY_STEPS[:-1], "layer", "probe", "layer out") and set(LAYER_OUT_STEPS) <= set(steps)
    assert (tmp_path / "layer.tar").is_file()


@pytest.mark.parametrize("step", LAYER_OUT_STEPS)
def test_a_stop_during_an_apply_with_layer_out_leaves_no_layer_file(step: str, vllm033_tree: Path,
                                                                    tmp_path: Path) -> None:
    """Up to the very end of the step that writes it: a run that does not end whole leaves neither
    a changed tree nor a layer file (a layer of a tree that was put back would be a lie)."""
    sig = signal.SIGTERM if len(step) % 2 else signal.SIGINT
    before = _snapshot(vllm033_tree)
    (tmp_path / "out").mkdir()
    res = run_signalled_at(step, sig, "apply", "--root", str(vllm033_tree), "--python", PY, "--layer-out",
                           str(tmp_path / "out" / "layer.tar"), "--report-dir", str(tmp_path / "r"))
    _assert_stopped(res, sig, step)
    assert _snapshot(vllm033_tree) == before
    assert list((tmp_path / "out").iterdir()) == []   # no layer.tar, no temporary file beside it


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("step", VERIFY_STEPS)
def test_a_stop_during_a_verify_step_is_no_verdict(step: str, sig: signal.Signals, patched033_tree: Path,
                                                   tmp_path: Path) -> None:
    before = _snapshot(patched033_tree)
    res = run_signalled_at(step, sig, "verify", "--root", str(patched033_tree), "--python", PY,
                           "--report-dir", str(tmp_path / "r"))
    _assert_stopped(res, sig, step)
    assert _snapshot(patched033_tree) == before
    # no report set claims a verdict the run did not reach
    audit = tmp_path / "r" / "audit.json"
    assert not audit.exists() or json.loads(audit.read_text())["status"] != "verified"


def test_an_unstopped_verify_of_that_tree_passes(patched033_tree: Path, tmp_path: Path) -> None:
    # What the stopped runs above would have said: a stop, not the tree, is why they did not exit 0.
    res = cli.run("verify", "--root", str(patched033_tree), "--python", PY, "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr


STATUS_POINTS = ("status: start 1", "status: done 1", "status: start 2", "status: done 2", "status: write")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("point", STATUS_POINTS)
def test_a_stop_during_status_is_no_verdict(point: str, sig: signal.Signals, patched033_tree: Path,
                                            vllm033_tree: Path, tmp_path: Path) -> None:
    roots = ("--root", str(patched033_tree), "--root", str(vllm033_tree))
    res = run_signalled_at(point, sig, "status", *roots, "--report-dir", str(tmp_path / "r"))
    _assert_stopped(res, sig, point)
    assert not (tmp_path / "r" / "status.json").exists()  # no fleet verdict from a stopped run


def test_an_unstopped_status_of_those_trees_passes(patched033_tree: Path, vllm033_tree: Path, tmp_path: Path) -> None:
    # What the stopped runs above would have said: both trees read (one applied, one a pristine
    # release), exit 0; a stop, not the trees, is why they did not.
    roots = ("--root", str(patched033_tree), "--root", str(vllm033_tree))
    whole = cli.run("status", *roots, "--json", "--report-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0 and len(whole.json["images"]) == 2, whole.stderr
    assert (tmp_path / "whole" / "status.json").exists()
