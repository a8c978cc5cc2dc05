"""The engine, case by case: what a user sees on disk (or in the error) for each kind of diff and tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_patch.errors import (
    DsparkPatchError,
    HunkDoesNotApply,
    MalformedPatch,
    PartlyApplied,
    UnsafePatch,
)
from dspark_patch.patching import PatchPlan, parse_diff, plan_patch, split_lines
from dspark_patch.targets.fs import read_inside, write_plan
from tests.support.trees import BASE, edit, make_tree, snapshot, udiff


def apply(root: Path, diff: bytes, *, strip: int = 1) -> PatchPlan:
    plan = plan_patch(parse_diff(diff, strip=strip), lambda rel: read_inside(root, rel))
    write_plan(root, plan)
    return plan


def refused(root: Path, diff: bytes, error: type[DsparkPatchError], *needles: str) -> str:
    """Apply must fail with `error`, mention every needle, and leave the tree exactly as it was."""
    before = snapshot(root)
    with pytest.raises(error) as caught:
        apply(root, diff)
    message = caught.value.line()
    for needle in needles:
        assert needle in message
    assert "\n" not in message
    assert snapshot(root) == before
    return message


# --- applying -------------------------------------------------------------------------------------


def test_exact_placement_writes_the_new_content(tmp_path: Path) -> None:
    new = edit(BASE, {10: b"line ten\n", 30: b"line thirty\n"})
    make_tree(tmp_path, {"pkg/mod.py": BASE})
    plan = apply(tmp_path, udiff(BASE, new))
    assert plan.status == "apply"
    assert (tmp_path / "pkg/mod.py").read_bytes() == new
    assert [(p.hunk_index, p.offset, p.fuzz) for p in plan.files[0].placements] == [(1, 0, 0), (2, 0, 0)]


@pytest.mark.parametrize(
    ("prefix", "offset"),
    [(b"extra a\nextra b\nextra c\n", 3), (b"", 0)],
    ids=["lines-added-above", "no-shift"],
)
def test_offset_up_is_found_and_recorded(tmp_path: Path, prefix: bytes, offset: int) -> None:
    new = edit(BASE, {20: b"changed\n"})
    make_tree(tmp_path, {"pkg/mod.py": prefix + BASE})
    plan = apply(tmp_path, udiff(BASE, new))
    assert (tmp_path / "pkg/mod.py").read_bytes() == prefix + new
    (placement,) = plan.files[0].placements
    assert placement.offset == offset
    assert placement.applied_at == placement.source_start + offset == 17 + offset


def test_offset_down_is_found_and_recorded(tmp_path: Path) -> None:
    new = edit(BASE, {20: b"changed\n", 35: b"also changed\n"})
    shorter = edit(BASE, {2: b"", 3: b""})  # two lines fewer above both hunks
    make_tree(tmp_path, {"pkg/mod.py": shorter})
    plan = apply(tmp_path, udiff(BASE, new))
    assert (tmp_path / "pkg/mod.py").read_bytes() == edit(new, {2: b"", 3: b""})
    assert [p.offset for p in plan.files[0].placements] == [-2, -2]


def test_context_drift_is_refused_and_the_tree_untouched(tmp_path: Path) -> None:
    new = edit(BASE, {20: b"changed\n"})
    make_tree(tmp_path, {"pkg/mod.py": edit(BASE, {18: b"line 18 edited locally\n"})})
    message = refused(
        tmp_path,
        udiff(BASE, new),
        HunkDoesNotApply,
        "pkg/mod.py: hunk #1 (@@ -17,7 +17,7 @@)",
        "does not apply at zero fuzz",
        "line 18 is 'line 18 edited locally' where the patch expects 'line 18'",
        "the file differs from the release this patch was made for",
    )
    assert message.startswith("pkg/mod.py: ")


def test_second_hunk_drift_names_hunk_two(tmp_path: Path) -> None:
    new = edit(BASE, {5: b"five\n", 30: b"thirty\n"})
    make_tree(tmp_path, {"pkg/mod.py": edit(BASE, {31: b"local\n"})})
    refused(tmp_path, udiff(BASE, new), HunkDoesNotApply, "hunk #2 (@@ -27,7 +27,7 @@)", "line 31 is 'local'")


def test_crlf_file_stays_crlf(tmp_path: Path) -> None:
    old = BASE.replace(b"\n", b"\r\n")
    new = edit(old, {12: b"twelve\r\n"})
    make_tree(tmp_path, {"pkg/mod.py": old})
    apply(tmp_path, udiff(old, new))
    result = (tmp_path / "pkg/mod.py").read_bytes()
    assert result == new
    assert result.count(b"\r\n") == result.count(b"\n") == 40


def test_lf_diff_does_not_apply_to_a_crlf_file(tmp_path: Path) -> None:
    make_tree(tmp_path, {"pkg/mod.py": BASE.replace(b"\n", b"\r\n")})
    refused(tmp_path, udiff(BASE, edit(BASE, {12: b"x\n"})), HunkDoesNotApply, "line 9 ends with CRLF where the patch expects LF")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (BASE + b"last", BASE + b"last\n"),  # source side only lacks the newline
        (BASE + b"last\n", BASE + b"last"),  # target side only
        (BASE + b"last", BASE + b"final"),  # both sides
        (BASE + b"last", edit(BASE, {39: b"changed\n"}) + b"last"),  # a context line without one
    ],
    ids=["source-only", "target-only", "both", "context"],
)
def test_no_newline_at_end_of_file(tmp_path: Path, old: bytes, new: bytes) -> None:
    diff = udiff(old, new)
    assert b"\\ No newline at end of file" in diff
    make_tree(tmp_path, {"pkg/mod.py": old})
    apply(tmp_path, diff)
    assert (tmp_path / "pkg/mod.py").read_bytes() == new


def test_added_file_creates_directories_with_mode_0644(tmp_path: Path) -> None:
    content = b"def added():\n    return 1\n"
    diff = (
        b"diff --git a/pkg/new/sub/added.py b/pkg/new/sub/added.py\nnew file mode 100644\n"
        b"--- /dev/null\n+++ b/pkg/new/sub/added.py\n@@ -0,0 +1,2 @@\n+def added():\n+    return 1\n"
    )
    make_tree(tmp_path, {"pkg/mod.py": BASE})
    plan = apply(tmp_path, diff)
    assert plan.files[0].action == "add" and plan.files[0].pre is None
    added = tmp_path / "pkg/new/sub/added.py"
    assert added.read_bytes() == content
    assert added.stat().st_mode & 0o777 == 0o644


def test_added_file_from_diff_N_header_without_dev_null(tmp_path: Path) -> None:
    diff = b"--- a/pkg/added.py\t1970-01-01 00:00:00\n+++ b/pkg/added.py\n@@ -0,0 +1 @@\n+x = 1\n"
    make_tree(tmp_path, {"pkg/mod.py": BASE})
    apply(tmp_path, diff)
    assert (tmp_path / "pkg/added.py").read_bytes() == b"x = 1\n"


def test_deleted_file_is_removed(tmp_path: Path) -> None:
    diff = b"--- a/pkg/gone.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a = 1\n-b = 2\n"
    make_tree(tmp_path, {"pkg/gone.py": b"a = 1\nb = 2\n", "pkg/mod.py": BASE})
    plan = apply(tmp_path, diff)
    assert plan.files[0].action == "delete" and plan.files[0].post is None
    assert not (tmp_path / "pkg/gone.py").exists()
    assert (tmp_path / "pkg/mod.py").read_bytes() == BASE


def test_delete_of_a_changed_file_is_refused(tmp_path: Path) -> None:
    diff = b"--- a/pkg/gone.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a = 1\n-b = 2\n"
    make_tree(tmp_path, {"pkg/gone.py": b"a = 1\nb = 3\n"})
    refused(tmp_path, diff, HunkDoesNotApply, "pkg/gone.py: hunk #1", "deletes this file but its content differs", "line 2 is 'b = 3'")


def test_add_over_an_existing_different_file_is_refused(tmp_path: Path) -> None:
    diff = b"--- /dev/null\n+++ b/pkg/mod.py\n@@ -0,0 +1 @@\n+x = 1\n"
    make_tree(tmp_path, {"pkg/mod.py": BASE})
    refused(tmp_path, diff, HunkDoesNotApply, "pkg/mod.py: hunk #1", "already exists with other content")


def test_add_of_an_identical_existing_file_is_already_applied(tmp_path: Path) -> None:
    diff = b"--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    make_tree(tmp_path, {"pkg/new.py": b"x = 1\n"})
    before = snapshot(tmp_path)
    assert apply(tmp_path, diff).status == "already-applied"
    assert snapshot(tmp_path) == before


# --- already / partly applied -----------------------------------------------------------------------


def test_already_applied_writes_nothing(tmp_path: Path) -> None:
    new = edit(BASE, {5: b"five\n", 30: b"thirty\n"})
    make_tree(tmp_path, {"pkg/mod.py": new})
    before = snapshot(tmp_path)
    plan = apply(tmp_path, udiff(BASE, new))
    assert plan.status == "already-applied"
    assert plan.files[0].pre == plan.files[0].post == new
    assert snapshot(tmp_path) == before  # same bytes and same inode: not even rewritten


def test_partly_applied_names_applied_and_missing_hunks(tmp_path: Path) -> None:
    new = edit(BASE, {5: b"five\n", 20: b"twenty\n", 30: b"thirty\n"})
    make_tree(tmp_path, {"pkg/mod.py": edit(BASE, {5: b"five\n", 30: b"thirty\n"})})
    message = refused(tmp_path, udiff(BASE, new), PartlyApplied, "already applied: pkg/mod.py hunks #1, #3", "not applied: pkg/mod.py hunk #2")
    assert "restore the original files" in message


def test_partly_applied_across_files(tmp_path: Path) -> None:
    new = edit(BASE, {5: b"five\n"})
    make_tree(tmp_path, {"pkg/a.py": new, "pkg/b.py": BASE})
    diff = udiff(BASE, new, "pkg/a.py") + udiff(BASE, new, "pkg/b.py")
    refused(tmp_path, diff, PartlyApplied, "already applied: pkg/a.py hunk #1", "not applied: pkg/b.py hunk #1")


def test_three_files_last_fails_leaves_first_two_untouched(tmp_path: Path) -> None:
    new = edit(BASE, {20: b"changed\n"})
    make_tree(
        tmp_path,
        {"pkg/a.py": BASE, "pkg/b/c.py": BASE, "pkg/z.py": edit(BASE, {19: b"drift\n"})},
        modes={"pkg/a.py": 0o755, "pkg/b/c.py": 0o600},
    )
    diff = udiff(BASE, new, "pkg/a.py") + udiff(BASE, new, "pkg/b/c.py") + udiff(BASE, new, "pkg/z.py")
    refused(tmp_path, diff, HunkDoesNotApply, "pkg/z.py: hunk #1", "line 19 is 'drift'")
    assert (tmp_path / "pkg/a.py").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "pkg/b/c.py").stat().st_mode & 0o777 == 0o600


# --- placement ambiguity --------------------------------------------------------------------------


def test_tie_between_two_equally_near_matches_is_refused(tmp_path: Path) -> None:
    block = b"a\nb\nc\nd\ne\nf\ng\n"
    old = b"top\n" + b"x\n" * 10 + block + b"y\n" * 10
    new = old.replace(b"d\n", b"D\n")
    # The header puts the block at line 12; the tree has it 4 lines above and 4 lines below.
    tree = b"top\n" + b"x\n" * 6 + block + b"w\n" + block + b"y\n" * 7
    make_tree(tmp_path, {"pkg/mod.py": tree})
    refused(tmp_path, udiff(old, new), HunkDoesNotApply, "matches equally well at line 8 and line 16", "refusing to guess")


def test_hunk_whose_only_match_precedes_the_previous_hunk_is_refused(tmp_path: Path) -> None:
    old = b"".join(b"l%d\n" % i for i in range(60))
    new = edit(old, {10: b"first\n", 50: b"second\n"})
    diff = udiff(old, new)
    # Move the second hunk's region above the first one.
    lines = split_lines(old)
    tree = b"".join(lines[44:54] + lines[:44] + lines[54:])
    make_tree(tmp_path, {"pkg/mod.py": tree})
    refused(tmp_path, diff, HunkDoesNotApply, "hunk #2", "overlaps or precedes the hunk before it")


def test_hunk_at_file_start_stays_pinned_to_the_start(tmp_path: Path) -> None:
    new = edit(BASE, {1: b"first\n"})  # no leading context: diff means "at the top of the file"
    make_tree(tmp_path, {"pkg/mod.py": b"# header\n" + BASE})
    refused(tmp_path, udiff(BASE, new), HunkDoesNotApply, "hunk #1", "line 1 is '# header' where the patch expects 'line 1'", "pins it to the start of the file")


# --- refusals ---------------------------------------------------------------------------------------

GIT_MODIFY = b"diff --git a/pkg/mod.py b/pkg/mod.py\n"
HUNK = b"--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,3 +1,3 @@\n line 1\n-line 2\n+two\n line 3\n"

REFUSALS = [
    ("binary-diff", b"Binary files a/pkg/x.bin and b/pkg/x.bin differ\n", UnsafePatch, "binary"),
    ("git-binary-patch", GIT_MODIFY + b"index 1234567..89abcde 100644\nGIT binary patch\nliteral 5\nMcmZ?wb8u\n\nliteral 0\nKcmV+b0RR6000031\n\n", UnsafePatch, "binary"),
    ("rename-no-hunks", b"diff --git a/pkg/mod.py b/pkg/new.py\nsimilarity index 100%\nrename from pkg/mod.py\nrename to pkg/new.py\n", UnsafePatch, "rename"),
    ("rename-with-hunks", b"diff --git a/pkg/mod.py b/pkg/new.py\nsimilarity index 90%\nrename from pkg/mod.py\nrename to pkg/new.py\n--- a/pkg/mod.py\n+++ b/pkg/new.py\n@@ -1,2 +1,2 @@\n line 1\n-line 2\n+two\n", UnsafePatch, "rename"),
    ("copy", b"diff --git a/pkg/mod.py b/pkg/copy.py\nsimilarity index 100%\ncopy from pkg/mod.py\ncopy to pkg/copy.py\n", UnsafePatch, "copy"),
    ("paths-differ", b"--- a/pkg/mod.py\n+++ b/pkg/other.py\n@@ -1,2 +1,2 @@\n line 1\n-line 2\n+two\n", UnsafePatch, "rename"),
    ("mode-only", GIT_MODIFY + b"old mode 100644\nnew mode 100755\n", UnsafePatch, "only changes the file mode"),
    ("mode-with-hunks", GIT_MODIFY + b"old mode 100644\nnew mode 100755\n" + HUNK, UnsafePatch, "changes the file mode"),
    ("new-symlink", b"diff --git a/pkg/link b/pkg/link\nnew file mode 120000\nindex 0000000..1234567\n--- /dev/null\n+++ b/pkg/link\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n", UnsafePatch, "symbolic link"),
    ("submodule", b"diff --git a/pkg/sub b/pkg/sub\nnew file mode 160000\nindex 0000000..1234567\n--- /dev/null\n+++ b/pkg/sub\n@@ -0,0 +1 @@\n+Subproject commit 1234567890123456789012345678901234567890\n", UnsafePatch, "submodule"),
    ("executable-new-file", b"diff --git a/pkg/run.py b/pkg/run.py\nnew file mode 100755\n--- /dev/null\n+++ b/pkg/run.py\n@@ -0,0 +1 @@\n+x\n", UnsafePatch, "mode 100755"),
    ("absolute-path", b"--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-root\n+toor\n", UnsafePatch, "absolute path"),
    ("dotdot", b"--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -1 +1 @@\n-root\n+toor\n", UnsafePatch, "'..'"),
    ("nul-in-diff", HUNK.replace(b"two", b"t\0o"), UnsafePatch, "NUL byte"),
    ("nul-in-path", b"--- a/pkg/m\0d.py\n+++ b/pkg/m\0d.py\n@@ -1 +1 @@\n-a\n+b\n", UnsafePatch, "NUL byte"),
    ("empty", b"", MalformedPatch, "empty"),
    ("whitespace-only", b"\n \n", MalformedPatch, "empty"),
    ("garbage", b"this is not a diff\njust some words\n", MalformedPatch, "no file changes"),
    ("zero-hunks", b"--- a/pkg/mod.py\n+++ b/pkg/mod.py\n", MalformedPatch, "no hunks"),
    ("truncated-hunk", b"--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,5 +1,5 @@\n line 1\n-line 2\n", MalformedPatch, "cannot be parsed"),
    ("too-few-components", b"--- mod.py\n+++ mod.py\n@@ -1 +1 @@\n-a\n+b\n", MalformedPatch, "too few to strip 1"),
    ("same-file-twice", HUNK + HUNK, MalformedPatch, "twice"),
]


@pytest.mark.parametrize(("diff", "error", "needle"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals(tmp_path: Path, diff: bytes, error: type[DsparkPatchError], needle: str) -> None:
    make_tree(tmp_path, {"pkg/mod.py": BASE, "pkg/x.bin": b"\x00\x01"})
    refused(tmp_path, diff, error, needle)


def test_strip_zero_keeps_the_whole_path(tmp_path: Path) -> None:
    make_tree(tmp_path, {"pkg/mod.py": BASE})
    diff = HUNK.replace(b"a/pkg/", b"pkg/").replace(b"b/pkg/", b"pkg/")
    apply(tmp_path, diff, strip=0)
    assert (tmp_path / "pkg/mod.py").read_bytes() == edit(BASE, {2: b"two\n"})


def test_quoted_git_paths_are_unquoted(tmp_path: Path) -> None:
    make_tree(tmp_path, {"pkg/my file.py": b"a\n", "pkg/caf\u00e9.py": b"a\n"})
    diff = (
        b'diff --git "a/pkg/my file.py" "b/pkg/my file.py"\n--- "a/pkg/my file.py"\n+++ "b/pkg/my file.py"\n@@ -1 +1 @@\n-a\n+b\n'
        b'diff --git "a/pkg/caf\\303\\251.py" "b/pkg/caf\\303\\251.py"\n--- "a/pkg/caf\\303\\251.py"\n+++ "b/pkg/caf\\303\\251.py"\n@@ -1 +1 @@\n-a\n+c\n'
    )
    plan = apply(tmp_path, diff)
    assert [f.path for f in plan.files] == ["pkg/my file.py", "pkg/caf\u00e9.py"]
    assert (tmp_path / "pkg/my file.py").read_bytes() == b"b\n"
    assert (tmp_path / "pkg/caf\u00e9.py").read_bytes() == b"c\n"


def test_modify_of_a_missing_file_is_refused(tmp_path: Path) -> None:
    make_tree(tmp_path, {"pkg/other.py": BASE})
    refused(tmp_path, HUNK, HunkDoesNotApply, "pkg/mod.py: the patch changes this file but it does not exist")


def test_plan_records_hashes_and_diff_hash(tmp_path: Path) -> None:
    import hashlib

    new = edit(BASE, {3: b"three\n"})
    diff = udiff(BASE, new)
    make_tree(tmp_path, {"pkg/mod.py": BASE})
    plan = apply(tmp_path, diff)
    assert plan.diff_sha256 == hashlib.sha256(diff).hexdigest()
    assert plan.files[0].pre_sha256 == hashlib.sha256(BASE).hexdigest()
    assert plan.files[0].post_sha256 == hashlib.sha256(new).hexdigest()


@pytest.mark.parametrize("data", [b"", b"a", b"a\n", b"a\r\nb", b"a\rb\n", b"\n\n", b"x\r", b"a\nb\r\n\r\nc"])
def test_the_engines_line_split_is_the_oracles(data: bytes) -> None:
    from tests.support.trees import lines_of

    assert split_lines(data) == lines_of(data)
    assert b"".join(lines_of(data)) == data
