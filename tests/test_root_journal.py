"""`apply --root` killed at each step (a real SIGKILL), then run again, on a real vLLM 0.33.0 tree:
the tree ends untouched or applied *and probed*, never half-patched, never OK without a probe.

Kills between the renames come from an audit hook that sends SIGKILL before the chosen rename
(tests/support/killpoints.py: no line of the tool is changed for it); kills during the probe from
an interpreter that holds the probe until the test has killed the whole process group. That
interpreter also stands in for the probe's verdict ("pass", or "missing": an interpreter without
torch, exit 3), so the runs here take seconds; the probe itself is tested elsewhere.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from dspark_patch.patchset import resolve
from dspark_patch.report.audit_json import load_schema
from dspark_patch.targets.local_tree import LocalTree
from tests.support.cli import SCRIPT, Result, run
from tests.support.killpoints import fake_python, probes_started, run_killed_at
from tests.support.trees import BASE, edit, make_tree, snapshot, udiff
from tests.support.vllm import replace_file, tree_copy

VARIANT = resolve("dspark-skip-mtp-buffer").variant_for("0.33.0")
PRE = {p: h.pre_sha256 for p, h in VARIANT.files.items()}
POST = {p: h.post_sha256 for p, h in VARIANT.files.items()}
JOURNAL = ".dspark-patch-journal.json"
RECORD = ".dspark-patch-probed.json"
ENVS = "vllm/envs.py"
NEW = edit(BASE, {20: b"changed\n"})


class Held:
    """The interpreter whose probe waits for the test's verdict (killpoints.fake_python)."""

    def __init__(self, where: Path) -> None:
        self.control = where / "control"
        self.python = fake_python(where / "bin" / "python3", self.control)

    def verdict(self, what: str | None) -> None:
        path = self.control / "verdict"
        if what is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(what)

    @property
    def probes(self) -> int:
        return probes_started(self.control)


@pytest.fixture
def held(tmp_path: Path) -> Held:
    return Held(tmp_path / "held")


@pytest.fixture(scope="module")
def half_patched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tree whose apply was killed between its two renames, made once: take copies."""
    where = tmp_path_factory.mktemp("half-patched")
    tree = tree_copy("0.33.0", where / "site-packages")
    kill_at(("os.rename", "/vllm/", 2), tree, Held(where / "held"), where / "killed")
    return tree


@pytest.fixture
def half_patched_tree(half_patched: Path, tmp_path: Path) -> Path:
    """A hard-link copy of `half_patched` for this test (change files only by replacing them)."""
    where = tmp_path / "half" / "site-packages"
    where.parent.mkdir(parents=True)
    subprocess.run(["cp", "-al", str(half_patched), str(where)], check=True)
    return where


def hashes(tree: Path) -> dict[str, str | None]:
    return {p: hashlib.sha256((tree / p).read_bytes()).hexdigest() if (tree / p).exists() else None for p in VARIANT.files}


def leftovers(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in tree.rglob("*.dspark-tmp"))


def settled(tree: Path) -> bool:
    """No journal and no temporary file of ours left in the tree."""
    return not (tree / JOURNAL).exists() and leftovers(tree) == []


def apply_args(tree: Path, held: Held, report: Path, *extra: str) -> list[str]:
    return ["apply", "--root", str(tree), "--python", str(held.python), "--report-dir", str(report), *extra]


def apply(tree: Path, held: Held, report: Path, *extra: str) -> tuple[Result, dict]:
    res = run(*apply_args(tree, held, report, *extra))
    audit = json.loads((report / "audit.json").read_text())
    jsonschema.validate(audit, load_schema())
    return res, audit


def kill_in_probe(tree: Path, held: Held, report: Path) -> None:
    """Start apply, wait until its probe runs, SIGKILL the whole process group (tool and probe)."""
    held.verdict(None)
    before = held.probes
    proc = subprocess.Popen([str(SCRIPT), *apply_args(tree, held, report)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600
        while held.probes == before:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
            assert time.monotonic() < deadline, "the probe never started"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def kill_at(point: tuple[str, str, int], tree: Path, held: Held, report: Path) -> None:
    killed = run_killed_at(*point, *apply_args(tree, held, report))
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])


# --- a kill while writing: the next run rolls back what the journal holds, then applies ---------

@pytest.mark.parametrize(("point", "replaced"), [
    (("os.rename", JOURNAL, 1), 0),   # the journal's temporary file written, not yet in place
    (("os.rename", "/vllm/", 1), 0),  # the journal in place, the first file's temporary file written
    (("os.rename", "/vllm/", 2), 1),  # the first file replaced, the second one's temporary file written
], ids=["before-the-journal", "before-the-first-rename", "between-the-renames"])
def test_a_kill_while_writing_is_rolled_back_by_the_next_run(point: tuple[str, str, int], replaced: int,
                                                             vllm033_tree: Path, held: Held, tmp_path: Path) -> None:
    tree = vllm033_tree
    kill_at(point, tree, held, tmp_path / "killed")
    now = hashes(tree)
    assert [p for p in POST if now[p] == POST[p]] == list(POST)[:replaced]
    assert all(now[p] == PRE[p] for p in list(PRE)[replaced:])
    assert len(leftovers(tree)) == 1  # the temporary file of the rename it died before
    assert (tree / JOURNAL).exists() == (point[1] != JOURNAL)

    held.verdict("pass")
    res, audit = apply(tree, held, tmp_path / "again")
    assert res.returncode == 0, res.stderr
    assert audit["status"] == "applied" and audit["probe"]["ok"] and held.probes == 1
    assert hashes(tree) == POST and settled(tree) and (tree / RECORD).exists()
    said = " ".join(audit["notes"])
    if replaced:
        assert "interrupted half-way" in said and f"rolled back {replaced} file to the pre-image" in said
    else:
        assert "interrupted before it had replaced any file; removed 1 temporary file" in said


def test_a_half_patched_tree_is_named_by_verify_and_status_and_refused_by_a_dry_run(
        half_patched_tree: Path, held: Held, tmp_path: Path) -> None:
    tree = half_patched_tree
    before = hashes(tree)
    assert before[ENVS] == POST[ENVS] and before != POST

    res = run("verify", "--root", str(tree), "--python", str(held.python), "--no-probe",
              "--report-dir", str(tmp_path / "verify"))
    line = res.assert_clean_error(1)
    assert "interrupted and is not finished" in line and JOURNAL in line

    res = run(*apply_args(tree, held, tmp_path / "dry", "--dry-run"))
    line = res.assert_clean_error(1)
    assert "interrupted" in line and "without --dry-run" in line

    # status: the tree's row is that (exit 1), never a verdict read off files in flux.
    res = run("status", "--root", str(tree), "--json", "--report-dir", str(tmp_path / "status"))
    assert res.returncode == 1, res.stderr
    row = res.json["images"][0]
    assert row["exit_code"] == 1 and "interrupted and is not finished" in row["error"] and JOURNAL in row["error"]
    assert row["patch_sets"] == {}
    assert hashes(tree) == before and (tree / JOURNAL).exists()  # none of them wrote anything


# --- a kill once every file is written: never OK without a probe ---------------------------------

def test_a_kill_during_the_probe_is_not_taken_for_a_probed_tree(vllm033_tree: Path, held: Held, tmp_path: Path) -> None:
    """The interpreter cannot run the probe. Uninterrupted, apply fails (exit 3) and restores the
    tree; killed during the probe and run again, it must come to the same end, not 'already applied'."""
    tree = vllm033_tree
    held.verdict("missing")
    res, _ = apply(tree, held, tmp_path / "whole")
    assert "cannot run" in res.assert_clean_error(3)
    assert hashes(tree) == PRE and settled(tree)

    kill_in_probe(tree, held, tmp_path / "killed")
    assert hashes(tree) == POST and (tree / JOURNAL).exists() and not (tree / RECORD).exists()
    # Every post-image is in place, never probed: status does not call that applied (exit 0).
    res = run("status", "--root", str(tree), "--json", "--report-dir", str(tmp_path / "status"))
    assert res.returncode == 1 and "interrupted and is not finished" in res.json["images"][0]["error"], res.stdout

    held.verdict("missing")
    res, audit = apply(tree, held, tmp_path / "again")
    assert "cannot run" in res.assert_clean_error(3)
    assert held.probes == 3  # it probed again, and that failed
    assert hashes(tree) == PRE and settled(tree) and not (tree / RECORD).exists()
    said = " ".join(audit["notes"])
    assert "interrupted after it had written every file (2)" in said and "rolled back to the pre-image" in said
    assert [s["name"] for s in audit["steps"]][-3:] == ["compile", "probe", "restore"]


@pytest.mark.parametrize("point", [("subprocess.Popen", "py_compile", 1), ("subprocess.Popen", "--site", 1), None],
                         ids=["before-the-compile", "before-the-probe", "during-the-probe"])
def test_a_tree_written_whole_is_compiled_and_probed_before_ok(point: tuple[str, str, int] | None, vllm033_tree: Path,
                                                                held: Held, tmp_path: Path) -> None:
    tree = vllm033_tree
    if point is None:
        kill_in_probe(tree, held, tmp_path / "killed")
    else:
        kill_at(point, tree, held, tmp_path / "killed")
    assert hashes(tree) == POST and (tree / JOURNAL).exists()
    probes = held.probes

    held.verdict("pass")
    res, audit = apply(tree, held, tmp_path / "again")
    assert res.returncode == 0, res.stderr
    assert audit["status"] == "already-applied" and audit["probe"]["ok"] and audit["compile"]["ran"]
    assert held.probes == probes + 1
    assert "interrupted after it had written every file (2)" in " ".join(audit["notes"])
    assert hashes(tree) == POST and settled(tree) and (tree / RECORD).exists()

    if point is None:  # now the verdict is earned: a third run takes the record and probes nothing
        res, audit = apply(tree, held, tmp_path / "third")
        assert res.returncode == 0, res.stderr
        assert audit["status"] == "already-applied" and not audit["probe"]["ran"] and held.probes == probes + 1
        assert "passed on exactly these files with this interpreter in an earlier run" in " ".join(audit["notes"])


def test_a_kill_during_the_roll_back_of_a_failed_probe_is_finished_by_the_next_run(vllm033_tree: Path, held: Held,
                                                                                  tmp_path: Path) -> None:
    tree = vllm033_tree
    held.verdict("missing")
    # renames 1-2 write the two files; the roll-back puts model.py back (3), then envs.py (4)
    kill_at(("os.rename", "/vllm/", 4), tree, held, tmp_path / "killed")
    now = hashes(tree)
    assert now[ENVS] == POST[ENVS] and all(now[p] == PRE[p] for p in PRE if p != ENVS)
    assert (tree / JOURNAL).exists() and len(leftovers(tree)) == 1

    res, audit = apply(tree, held, tmp_path / "again", "--no-probe")
    assert res.returncode == 0, res.stderr
    assert "rolled back 1 file" in " ".join(audit["notes"])
    assert hashes(tree) == POST and settled(tree)
    assert audit["probe"]["ran"] is False and not (tree / RECORD).exists()  # --no-probe: nothing earned


def test_a_kill_before_the_run_is_whole_leaves_the_journal_for_the_next(vllm033_tree: Path, held: Held,
                                                                         tmp_path: Path) -> None:
    """Killed after its probe passed and its report was written, before the record and the journal's
    removal: the next run does not take the tree on trust, it probes again."""
    tree = vllm033_tree
    held.verdict("pass")
    kill_at(("os.rename", RECORD, 1), tree, held, tmp_path / "killed")
    assert json.loads((tmp_path / "killed" / "audit.json").read_text())["status"] == "applied"
    assert hashes(tree) == POST and (tree / JOURNAL).exists() and not (tree / RECORD).exists()

    res, audit = apply(tree, held, tmp_path / "again")
    assert res.returncode == 0, res.stderr
    assert audit["probe"]["ok"] and held.probes == 2
    assert hashes(tree) == POST and settled(tree) and (tree / RECORD).exists()


# --- "already applied" is earned ------------------------------------------------------------------

def test_an_already_applied_tree_without_a_recorded_probe_is_probed(patched033_tree: Path, held: Held,
                                                                   tmp_path: Path) -> None:
    # (the tree: `apply --no-probe` of a fresh one, made once per session, tests/conftest.py)
    tree = patched033_tree
    held.verdict("missing")
    res, audit = apply(tree, held, tmp_path / "fails")
    assert "cannot run" in res.assert_clean_error(3)
    assert held.probes == 1 and hashes(tree) == POST  # patched before this run: left as it was
    assert "only its bytecode was put back" in " ".join(audit["notes"])

    held.verdict("pass")
    res, audit = apply(tree, held, tmp_path / "passes")
    assert res.returncode == 0, res.stderr
    assert audit["status"] == "already-applied" and audit["probe"]["ok"] and held.probes == 2
    assert "no passing probe is on record" in " ".join(audit["notes"]) and (tree / RECORD).exists()

    other = Held(tmp_path / "other")   # another interpreter: the record is not its verdict
    other.verdict("pass")
    res, audit = apply(tree, other, tmp_path / "other-python")
    assert res.returncode == 0 and audit["probe"]["ok"] and other.probes == 1

    res, audit = apply(tree, held, tmp_path / "no-probe", "--no-probe")
    assert res.returncode == 0 and audit["status"] == "already-applied"
    assert any(s["name"] == "probe" and s["status"] == "skipped" and s["detail"] == "--no-probe" for s in audit["steps"])


# --- a journal is hostile input -------------------------------------------------------------------

def _identity(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns




def _planted(tree: Path, doc: dict | bytes) -> None:
    (tree / JOURNAL).unlink()
    (tree / JOURNAL).write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())


def _outside(tree: Path, doc: dict) -> None:
    doc["entries"][0]["path"] = "../../outside.py"
    _planted(tree, doc)


def _forged_pre_image(tree: Path, doc: dict) -> None:
    doc["entries"][0]["pre"] = base64.b64encode(b"import os; os.system('evil')\n").decode()
    _planted(tree, doc)


def _a_link(tree: Path, doc: dict) -> None:
    (tree.parent / "elsewhere.json").write_text(json.dumps(doc))
    (tree / JOURNAL).unlink()
    (tree / JOURNAL).symlink_to(tree.parent / "elsewhere.json")


def _hashes_of_nothing(tree: Path, doc: dict) -> None:
    for e in doc["entries"]:
        if not e["bytecode"]:
            e["post_sha256"] = "0" * 64
    _planted(tree, doc)


def _edited_since(tree: Path, doc: dict) -> None:
    replace_file(tree / ENVS, (tree / ENVS).read_bytes() + b"# a local fix made after the crash\n")


@pytest.mark.parametrize(("spoil", "code", "words"), [
    (lambda tree, doc: _planted(tree, b"{not json"), 2, "not JSON"),
    (_a_link, 2, "symbolic link"),
    (_outside, 2, "'..'"),
    (_forged_pre_image, 2, "not the one whose sha256 it records"),
    (_hashes_of_nothing, 1, "changed since by someone else"),
    (_edited_since, 1, "changed since by someone else"),
], ids=["malformed", "a-link", "a-path-out-of-the-tree", "a-forged-pre-image", "hashes-of-nothing", "edited-since"])
def test_a_journal_that_cannot_be_trusted_is_refused_and_nothing_is_touched(spoil, code: int, words: str,
                                                                            half_patched_tree: Path, held: Held,
                                                                            tmp_path: Path) -> None:
    tree = half_patched_tree
    spoil(tree, json.loads((tree / JOURNAL).read_text()))
    before = hashes(tree), leftovers(tree), _identity(tree / JOURNAL)
    held.verdict("pass")
    res, audit = apply(tree, held, tmp_path / "again")
    line = res.assert_clean_error(code)
    assert words in line and JOURNAL in line
    assert audit["errors"][0]["kind"] == ("bad-journal" if code == 2 else "unfinished-apply")
    assert (hashes(tree), leftovers(tree), _identity(tree / JOURNAL)) == before
    assert held.probes == 0


# --- added and deleted files, made folders, modes (a small tree, the same kill) --------------------

_WRITER = """
import sys
from pathlib import Path
sys.path[:0] = [{repo!r}]
from tests.support.killpoints import _arm
from dspark_patch.patching import parse_diff, plan_patch
from dspark_patch.targets import fs
from dspark_patch.targets.local_tree import LocalTree
root = Path({root!r})
plan = plan_patch(parse_diff(Path({diff!r}).read_bytes()), lambda rel: fs.read_inside(root, rel))
_arm("os.rename", "/pkg/", {n})
LocalTree(root).write_journaled(plan, [])
"""


@pytest.mark.parametrize("n", [1, 2, 3, 99], ids=["first", "second", "third", "never"])
def test_a_killed_write_with_added_and_deleted_files_rolls_back_to_the_tree_as_it_was(n: int, tmp_path: Path) -> None:
    root = make_tree(tmp_path / "site", {"pkg/a.py": BASE, "pkg/gone.py": BASE, "pkg/b.py": BASE},
                     modes={"pkg/a.py": 0o750})
    added = b"--- /dev/null\n+++ b/pkg/new/dir/added.py\n@@ -0,0 +1 @@\n+x = 1\n"
    deleted = udiff(BASE, b"", "pkg/gone.py").replace(b"+++ b/pkg/gone.py", b"+++ /dev/null")
    (tmp_path / "p.diff").write_bytes(added + udiff(BASE, NEW, "pkg/a.py") + deleted + udiff(BASE, NEW, "pkg/b.py"))
    before = {k: v[:2] for k, v in snapshot(root).items()}
    source = _WRITER.format(repo=str(Path(__file__).resolve().parents[1]), root=str(root), diff=str(tmp_path / "p.diff"), n=n)
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True)
    # renames: the added file (1), a.py (2), b.py (3); the delete is an unlink. Never killed: the
    # journal stays, as after a kill once every file is written.
    assert done.returncode == (0 if n == 99 else -signal.SIGKILL), done.stderr
    assert (root / JOURNAL).exists()

    recovery = LocalTree(root).recover("0" * 64, frozenset({"another/diff.py"}))  # another patch's run
    assert recovery is not None and recovery.outcome == "rolled-back"
    assert {k: v[:2] for k, v in snapshot(root).items()} == before  # bytes and modes, the deleted file back
    assert not (root / "pkg/new").exists() and leftovers(root) == []
