"""Our engine against GNU `patch -p1 -F0` on real diffs between two vLLM releases.

For a fixed sample of files that changed between vLLM 0.30.0 and 0.31.0, both tools must agree
on a clean tree (same bytes), a shifted tree (same offsets, same bytes), a drifted tree (both
refuse; ours leaves the tree untouched) and an already-patched tree (we say already-applied,
GNU patch says the diff reverses cleanly).
"""

from __future__ import annotations

import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from dspark_patch.errors import HunkDoesNotApply, PartlyApplied
from dspark_patch.patching import parse_diff, plan_patch, split_lines
from dspark_patch.targets.fs import read_inside, write_plan
from tests.support import vllm

SAMPLE_SIZE = 120
OLD_RELEASE, NEW_RELEASE = "0.30.0", "0.31.0"
GNU_PATCH = ["patch", "-p1", "-F0", "--batch", "--forward", "--no-backup-if-mismatch", "--reject-file=-"]
_GNU_OFFSET = re.compile(rb"Hunk #(\d+) succeeded at \d+ \(offset (-?\d+) lines?\)")


@dataclass(frozen=True, kw_only=True)
class Outcome:
    applied: bool
    content: bytes
    offsets: dict[int, int]  # hunk number -> offset, for hunks not placed where the header says


@pytest.fixture(scope="module")
def releases() -> tuple[Path, Path, list[str]]:
    old_root, new_root = vllm.python_sources(OLD_RELEASE), vllm.python_sources(NEW_RELEASE)
    changed = []
    for path in sorted((old_root / "vllm").rglob("*.py")):
        rel = path.relative_to(old_root).as_posix()
        other = new_root / rel
        if other.is_file() and other.read_bytes() != path.read_bytes():
            changed.append(rel)
    assert len(changed) >= SAMPLE_SIZE
    return old_root, new_root, sorted(random.Random(20240601).sample(changed, SAMPLE_SIZE))


def gnu_diff(old: Path, new: Path, rel: str) -> bytes:
    done = subprocess.run(
        ["diff", "-u", "--label", f"a/{rel}", "--label", f"b/{rel}", str(old), str(new)], capture_output=True
    )
    assert done.returncode == 1, done.stderr
    return done.stdout


def ours(root: Path, rel: str, content: bytes, diff: bytes) -> Outcome:
    (root / rel).parent.mkdir(parents=True)
    (root / rel).write_bytes(content)
    try:
        plan = plan_patch(parse_diff(diff), lambda path: read_inside(root, path))
    except (HunkDoesNotApply, PartlyApplied):
        assert (root / rel).read_bytes() == content
        assert [p.name for p in (root / rel).parent.iterdir()] == [Path(rel).name]
        return Outcome(applied=False, content=content, offsets={})
    assert plan.status == "apply"
    write_plan(root, plan)
    offsets = {p.hunk_index: p.offset for p in plan.files[0].placements if p.offset}
    return Outcome(applied=True, content=(root / rel).read_bytes(), offsets=offsets)


def gnu(root: Path, rel: str, content: bytes, diff: bytes, *extra: str) -> Outcome:
    (root / rel).parent.mkdir(parents=True)
    (root / rel).write_bytes(content)
    done = subprocess.run([*GNU_PATCH, *extra, "-d", str(root)], input=diff, capture_output=True)
    offsets = {int(n): int(off) for n, off in _GNU_OFFSET.findall(done.stdout)}
    return Outcome(applied=done.returncode == 0, content=(root / rel).read_bytes(), offsets=offsets)


def drift_one_context_line(content: bytes, diff: bytes, seed: int) -> bytes:
    """The file with one context line of one hunk changed (chosen by seed), as a local edit would."""
    hunks = parse_diff(diff).files[0].hunks
    hunk = hunks[seed % len(hunks)]
    lines = split_lines(content)
    number = hunk.source_start
    for line in hunk.lines:
        if line.kind == " ":
            break
        if line.kind == "-":
            number += 1
    else:  # a hunk without context cannot drift; change its first removed line instead
        number = hunk.source_start
    lines[number - 1] = b"# locally edited: " + lines[number - 1]
    return b"".join(lines)


@pytest.mark.parametrize("index", range(SAMPLE_SIZE))
def test_engine_agrees_with_gnu_patch(releases, index: int, tmp_path: Path) -> None:
    old_root, new_root, sample = releases
    rel = sample[index]
    old, new = (old_root / rel).read_bytes(), (new_root / rel).read_bytes()
    diff = gnu_diff(old_root / rel, new_root / rel, rel)

    # Clean tree: both apply, to exactly the new release's file.
    clean_ours = ours(tmp_path / "clean-ours", rel, old, diff)
    clean_gnu = gnu(tmp_path / "clean-gnu", rel, old, diff)
    assert clean_ours.applied and clean_gnu.applied
    assert clean_ours.content == clean_gnu.content == new
    assert clean_ours.offsets == clean_gnu.offsets == {}

    # Shifted tree: lines added at the top; same offsets, same bytes (or both refuse a hunk the
    # diff pins to the start of the file).
    shifted = b"# local 1\n# local 2\n# local 3\n" + old
    shift_ours = ours(tmp_path / "shift-ours", rel, shifted, diff)
    shift_gnu = gnu(tmp_path / "shift-gnu", rel, shifted, diff)
    assert shift_ours.applied == shift_gnu.applied
    if shift_ours.applied:
        assert shift_ours.content == shift_gnu.content == b"# local 1\n# local 2\n# local 3\n" + new
        assert shift_ours.offsets == shift_gnu.offsets
        assert set(shift_ours.offsets.values()) == {3}
    else:  # GNU patch leaves the hunks it could place in the file; we leave the file as it was
        assert shift_ours.content == shifted

    # Drifted tree: one context line edited; both refuse, ours without touching anything.
    drifted = drift_one_context_line(old, diff, index)
    drift_ours = ours(tmp_path / "drift-ours", rel, drifted, diff)
    drift_gnu = gnu(tmp_path / "drift-gnu", rel, drifted, diff, "--dry-run")
    assert not drift_ours.applied and not drift_gnu.applied
    assert drift_ours.content == drifted

    # Already patched: we detect it; GNU patch agrees the diff reverses cleanly there.
    (tmp_path / "applied-ours" / rel).parent.mkdir(parents=True)
    (tmp_path / "applied-ours" / rel).write_bytes(new)
    plan = plan_patch(parse_diff(diff), lambda path: read_inside(tmp_path / "applied-ours", path))
    assert plan.status == "already-applied"
    reverse_gnu = gnu(tmp_path / "applied-gnu", rel, new, diff, "-R", "--dry-run")
    assert reverse_gnu.applied
