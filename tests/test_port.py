"""`dspark-patch port` on the real 0.32.0 and 0.31.0 wheels, through the console script.

The patch set is copied into tmp_path for every test that may write a variant, so the shipped
one is never changed; each test gives its own --work folder.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import pytest

from dspark_patch.patching.diff import parse_diff
from dspark_patch.patching.plan import plan_patch
from dspark_patch.patchset import load_dir, resolve
from dspark_patch.porting.merge import leftover_markers, merge_file
from tests.support import port_032, vllm
from tests.support.cli import run

PY = sys.executable
SHIPPED = resolve("dspark-skip-mtp-buffer")
SOURCE = SHIPPED.variant_for("0.33.0")
ENVS = "vllm/envs.py"
MODEL = "vllm/models/deepseek_v4/nvidia/model.py"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def patch_set(tmp_path: Path) -> Path:
    """A copy of the shipped patch set without its 0.32.0 variant: what a port starts from."""
    return _starting_patch_set(tmp_path)


def _starting_patch_set(where: Path) -> Path:
    dest = where / "patches" / "dspark-skip-mtp-buffer"
    shutil.copytree(SHIPPED.source, dest)
    toml = (dest / "patch.toml").read_text(encoding="utf-8")
    cut = toml.index("\n# Made by `dspark-patch port --to 0.32.0`")
    (dest / "patch.toml").write_text(toml[:cut + 1], encoding="utf-8")
    for name in ("vllm-0.32.0.patch", "vllm-0.32.0.review.md", "census-vllm-0.32.0.json", "vllm-0.34.0.superseded.md"):
        (dest / name).unlink(missing_ok=True)
    assert [v.name for v in load_dir(dest).variants] == ["vllm-0.33.0"]
    return dest


def port(patch_set: Path, release: str, work: Path, *extra: str):
    return run("port", "--patch", str(patch_set), "--to", release, "--wheel", str(vllm.wheel(release)),
               "--work", str(work), "--python", PY, *extra)


@pytest.fixture(scope="module")
def first_call_032(tmp_path_factory: pytest.TempPathFactory):
    """The first `port --to 0.32.0` (it stops at the conflicts): its result and its work folder,
    made once. A test that goes on from there gets a copy of that folder (`_from_first_call`), the
    state a second call of its own finds; the work folder names the patch set by id, not path."""
    where = tmp_path_factory.mktemp("first-port")
    return port(_starting_patch_set(where), "0.32.0", where / "work"), where / "work"


def _from_first_call(first_call_032, tmp_path: Path) -> Path:
    result, work = first_call_032
    result.assert_clean_error(1)
    shutil.copytree(work, tmp_path / "work", symlinks=True)
    return tmp_path / "work"


def unchanged(patch_set: Path) -> bool:
    return [v.name for v in load_dir(patch_set).variants] == ["vllm-0.33.0"] and not any(
        p.name.startswith("vllm-0.3") and p.name != "vllm-0.33.0.patch" for p in patch_set.iterdir())


def _compiles(data: bytes) -> bool:
    try:
        compile(data, "<port>", "exec")
    except SyntaxError:
        return False
    return True


# --- the merge itself, on real files -----------------------------------------------------------

def _source_file(path: str):
    return next(fp for fp in parse_diff(SOURCE.diff, strip=1).files if fp.path == path)


def test_a_file_lands_exactly_with_its_offset_reported() -> None:
    theirs = (vllm.python_sources("0.33.0") / ENVS).read_bytes()
    shifted = b"# seven lines the target release added at the top\n" * 7 + theirs
    merged = merge_file(_source_file(ENVS), shifted)
    assert merged.status == "landed" and [p.offset for p in merged.placements] == [7, 7]
    want = plan_patch(parse_diff(SOURCE.diff, strip=1), {ENVS: theirs, MODEL: (vllm.python_sources("0.33.0") / MODEL).read_bytes()}.get)
    assert merged.result == b"# seven lines the target release added at the top\n" * 7 + next(
        f.post for f in want.files if f.path == ENVS)


def test_a_changed_context_line_is_a_conflict_even_where_git_merges_cleanly() -> None:
    # One context line of hunk #1, three lines above the insertion: `git merge-file` merges this
    # without a conflict (as `patch -F1` would land it); the port must not.
    theirs = (vllm.python_sources("0.33.0") / ENVS).read_bytes()
    old = b'    VLLM_NIC_SELECTION_VARS: str = ""\n'
    assert theirs.count(old) == 1
    changed = theirs.replace(old, b'    VLLM_NIC_SELECTION_VARS: str = "eth0"\n')
    merged = merge_file(_source_file(ENVS), changed)
    assert merged.status == "conflict"
    assert [c.hunk_index for c in merged.conflicts] == [1]
    assert "VLLM_NIC_SELECTION_VARS" in merged.conflicts[0].reason
    assert leftover_markers(merged.result), "a conflict must be written with markers, never as a clean file"


# --- port --to 0.32.0 --------------------------------------------------------------------------

def test_port_to_0_32_0_stops_at_the_named_conflicts_and_writes_no_broken_file(first_call_032) -> None:
    res, work = first_call_032
    patch_set = work.parent / "patches" / "dspark-skip-mtp-buffer"
    res.assert_clean_error(1)
    assert "conflict: vllm/envs.py: hunk #1 (@@ -335,6 +335,7 @@): its context line '    VLLM_REQUEST_BODY_LOG_LEVEL" in res.stdout
    assert "conflict: vllm/envs.py: hunk #2 (@@ -2284,6 +2285,14 @@)" in res.stdout
    assert f"conflict: {MODEL}: hunk #1" in res.stdout
    assert "resolve the markers in" in res.stderr
    assert unchanged(patch_set)
    for rel in (ENVS, MODEL):
        data = (work / "files" / rel).read_bytes()
        # Every file the port wrote is either marked as a conflict or compiles: never a
        # clean-looking envs.py with the entry after the dict's closing brace (patch -F3).
        assert leftover_markers(data) or _compiles(data), rel
    envs = (work / "files" / ENVS).read_bytes()
    assert not _compiles(envs) and b"<<<<<<< variant" in envs and b">>>>>>> target" in envs
    # The wheel's tree in the work folder is the pristine release (the candidate is never left there).
    assert sha((work / "tree" / ENVS).read_bytes()) == sha((vllm.python_sources("0.32.0") / ENVS).read_bytes())


def test_a_second_call_with_markers_left_refuses_and_names_them(first_call_032, patch_set: Path, tmp_path: Path) -> None:
    work = _from_first_call(first_call_032, tmp_path)
    res = port(patch_set, "0.32.0", work)
    msg = res.assert_clean_error(1)
    assert "conflict markers are left in the work folder" in msg and "vllm/envs.py: line(s)" in msg
    assert unchanged(patch_set)


def test_after_the_hand_resolution_the_second_call_writes_an_unreviewed_variant_whose_probe_passes(
        first_call_032, patch_set: Path, tmp_path: Path) -> None:
    work = _from_first_call(first_call_032, tmp_path)
    port_032.resolve(work / "files", (vllm.python_sources("0.32.0") / ENVS).read_bytes())
    res = port(patch_set, "0.32.0", work)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "probe: passed" in res.stdout and "wrote variant vllm-0.32.0" in res.stdout
    ported = load_dir(patch_set).variant_for("0.32.0")
    assert ported.review == "unreviewed" and ported.ported_from == "vllm-0.33.0"
    shipped = SHIPPED.variant_for("0.32.0")
    # The shipped variant is exactly what port writes after this resolution.
    assert ported.diff == shipped.diff and ported.files == shipped.files
    review = (work / "REVIEW.md").read_text()
    assert "## Interdiff: vllm-0.33.0 -> vllm-0.32.0" in review and "**passed**" in review
    assert "vLLM 0.33.0 | vLLM 0.32.0" in review
    assert (patch_set / "vllm-0.32.0.review.md").read_text() == review
    # The shipped review file is this one plus the reviewer's notes; the census beside it is this run's.
    assert (SHIPPED.source / "vllm-0.32.0.review.md").read_text().startswith(review)
    assert (patch_set / "census-vllm-0.32.0.json").read_text() == (SHIPPED.source / "census-vllm-0.32.0.json").read_text()
    # An unreviewed variant is refused by apply (exit 2) unless --allow-unreviewed.
    tree = vllm.tree_copy("0.32.0", tmp_path / "site-packages")
    res = run("apply", "--patch", str(patch_set), "--root", str(tree), "--python", PY, "--report-dir", str(tmp_path / "r1"))
    assert "is unreviewed" in res.assert_clean_error(2)
    assert sha((tree / ENVS).read_bytes()) == ported.files[ENVS].pre_sha256
    res = run("apply", "--patch", str(patch_set), "--root", str(tree), "--python", PY, "--allow-unreviewed",
              "--report-dir", str(tmp_path / "r2"), "--json")
    assert res.returncode == 0, res.stderr
    assert res.json["patch"]["review"] == "unreviewed"
    assert any("--allow-unreviewed" in n for n in res.json["notes"])


# --- port --to 0.31.0 and bad input ------------------------------------------------------------

def test_port_to_0_31_0_is_refused_naming_each_unguarded_reader(patch_set: Path, tmp_path: Path) -> None:
    res = port(patch_set, "0.31.0", tmp_path / "work")
    msg = res.assert_clean_error(1)
    assert "vllm 0.31.0 cannot take this patch as it is" in msg
    for where in ("vllm/v1/worker/gpu/model_runner.py:905 GPUModelRunner._dummy_run",
                  "vllm/v1/worker/gpu/model_runner.py:2196 GPUModelRunner.sample_tokens"):
        assert f"unguarded reader: {where}" in res.stdout
    assert unchanged(patch_set)
    assert not (tmp_path / "work" / "files").exists()


def test_bad_input_is_exit_2_with_one_line(patch_set: Path, tmp_path: Path) -> None:
    res = port(patch_set, "0.33.0", tmp_path / "w1")
    assert "already has variant vllm-0.33.0" in res.assert_clean_error(2)
    res = run("port", "--patch", str(patch_set), "--to", "0.32.0", "--wheel", str(vllm.wheel("0.33.0")),
              "--work", str(tmp_path / "w2"), "--python", PY)
    assert "holds vllm 0.33.0" in res.assert_clean_error(2)
    res = run("port", "--patch", str(patch_set), "--to", "0.32.0", "--wheel", str(tmp_path / "a.whl"),
              "--root", str(tmp_path), "--work", str(tmp_path / "w3"))
    assert "give at most one source" in res.assert_clean_error(2)
    # No source: the release's wheel is fetched with pip (here from an empty folder: its one line, exit 3).
    (tmp_path / "no-wheels").mkdir()
    res = run("port", "--patch", str(patch_set), "--to", "0.32.0", "--work", str(tmp_path / "w5"),
              env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "no-wheels")})
    assert "pip download vllm==0.32.0 failed" in res.assert_clean_error(3)
    res = run("port", "--patch", str(patch_set), "--to", "0.32.0", "--wheel", str(tmp_path / "nope.whl"),
              "--work", str(tmp_path / "w4"))
    assert "no such file" in res.assert_clean_error(2)
    res = run("port", "--patch", str(patch_set), "--to", "0.32.0", "--from", "vllm-9", "--wheel",
              str(vllm.wheel("0.32.0")), "--work", str(tmp_path / "w5"))
    assert "has no variant 'vllm-9'" in res.assert_clean_error(2)
    assert unchanged(patch_set)


def test_port_from_a_root_never_writes_the_users_tree(patch_set: Path, tmp_path: Path) -> None:
    tree = vllm.tree_copy("0.32.0", tmp_path / "site-packages")
    before = {rel: sha((tree / rel).read_bytes()) for rel in (ENVS, MODEL)}
    res = run("port", "--patch", str(patch_set), "--to", "0.32.0", "--root", str(tree), "--python", PY,
              "--work", str(tmp_path / "work"))
    res.assert_clean_error(1)
    assert f"conflict: {MODEL}: hunk #1" in res.stdout
    assert {rel: sha((tree / rel).read_bytes()) for rel in (ENVS, MODEL)} == before


# --- a port that lands at the first call (the second, small patch set) ------------------------

MATH_SET = Path(__file__).parent / "data" / "patchsets" / "vllm-math-positive-divisor"
MATH = "vllm/utils/math_utils.py"


@pytest.fixture
def math_set(tmp_path: Path) -> Path:
    dest = tmp_path / "patches" / MATH_SET.name
    shutil.copytree(MATH_SET, dest)
    return dest


def test_a_port_that_lands_exactly_writes_an_unreviewed_variant_at_once(math_set: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    res = port(math_set, "0.32.0", work)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert f"{MATH}: landed (hunk #1 offset +0, hunk #2 offset -5)" in res.stdout
    assert "probe: passed" in res.stdout
    ported = load_dir(math_set).variant_for("0.32.0")
    assert ported.review == "unreviewed" and ported.ported_from == "vllm-0.33.0"
    pristine = (vllm.python_sources("0.32.0") / MATH).read_bytes()
    assert ported.files[MATH].pre_sha256 == sha(pristine)
    # The written diff is the candidate exactly: planned on the pristine file at zero fuzz.
    plan = plan_patch(parse_diff(ported.diff, strip=1), {MATH: pristine}.get)
    assert all(p.fuzz == 0 for f in plan.files for p in f.placements)
    assert sha(plan.files[0].post or b"") == ported.files[MATH].post_sha256 == sha((work / "files" / MATH).read_bytes())
    assert b"raise ValueError(f\"cdiv: the divisor must be positive" in (plan.files[0].post or b"")
    review = (work / "REVIEW.md").read_text()
    assert "landed exactly: `vllm/utils/math_utils.py`: hunk #1 offset +0, hunk #2 offset -5" in review
    assert "| cdiv-positive-divisor | ok |" in review and "## Interdiff: vllm-0.33.0 -> vllm-0.32.0" in review
    assert not (math_set / ".patch.toml.before-port").exists()

    # apply refuses the unreviewed variant, applies it with --allow-unreviewed and says so ...
    tree = vllm.tree_copy("0.32.0", tmp_path / "site-packages")
    res = run("apply", "--patch", str(math_set), "--root", str(tree), "--python", PY, "--report-dir", str(tmp_path / "r1"))
    msg = res.assert_clean_error(2)
    assert "variant vllm-0.32.0 is unreviewed" in msg and "--allow-unreviewed" in msg
    assert sha((tree / MATH).read_bytes()) == sha(pristine)
    res = run("apply", "--patch", str(math_set), "--root", str(tree), "--python", PY, "--allow-unreviewed",
              "--json", "--report-dir", str(tmp_path / "r2"))
    assert res.returncode == 0, res.stderr
    assert res.json["patch"]["review"] == "unreviewed" and res.json["status"] == "applied"
    assert any("--allow-unreviewed" in n for n in res.json["notes"])
    assert "**unreviewed**" in (tmp_path / "r2" / "audit.md").read_text()

    # ... and once a person marks it reviewed, a plain apply takes it.
    toml = math_set / "patch.toml"
    toml.write_text(toml.read_text().replace('review = "unreviewed"', 'review = "reviewed"'))
    fresh = vllm.tree_copy("0.32.0", tmp_path / "site-packages-2")
    res = run("apply", "--patch", str(math_set), "--root", str(fresh), "--python", PY, "--json",
              "--report-dir", str(tmp_path / "r3"))
    assert res.returncode == 0, res.stderr
    assert res.json["patch"]["review"] == "reviewed"

    # A second port to the same release has nothing to do.
    assert "already has variant vllm-0.32.0" in port(math_set, "0.32.0", tmp_path / "w2").assert_clean_error(2)


def test_a_candidate_that_does_not_compile_is_never_written(math_set: Path, tmp_path: Path) -> None:
    diff = math_set / "vllm-0.33.0.patch"
    broken = diff.read_bytes().replace(b"+    if b <= 0:\n", b"+    if b <= 0\n")
    assert broken != diff.read_bytes()
    diff.write_bytes(broken)
    res = port(math_set, "0.32.0", tmp_path / "work")
    msg = res.assert_clean_error(1)
    assert f"{MATH} does not compile with" in msg
    assert [v.name for v in load_dir(math_set).variants] == ["vllm-0.33.0"]
    assert not (math_set / "vllm-0.32.0.patch").exists()
    # The scratch tree is the pristine release again.
    assert sha((tmp_path / "work" / "tree" / MATH).read_bytes()) == sha((vllm.python_sources("0.32.0") / MATH).read_bytes())


@pytest.mark.engine
def test_port_from_an_image_reads_and_probes_in_a_container_it_removes(math_set: Path, patch_set: Path,
                                                                       tmp_path: Path) -> None:
    import docker

    from tests.support.images import fixture_032_image

    client = docker.from_env()
    source = fixture_032_image()
    image_id = client.images.get(source).id

    def ours() -> list[str]:
        return sorted(c.id for c in client.containers.list(all=True, filters={"ancestor": image_id}))

    before = ours()
    res = run("port", "--patch", str(patch_set), "--to", "0.32.0", "--image", source, "--pull", "never",
              "--work", str(tmp_path / "w1"))
    res.assert_clean_error(1)
    assert "conflict: vllm/envs.py: hunk #1" in res.stdout and f"conflict: {MODEL}: hunk #1" in res.stdout
    assert not (tmp_path / "w1" / "tree").exists()
    res = run("port", "--patch", str(math_set), "--to", "0.32.0", "--image", source, "--pull", "never",
              "--work", str(tmp_path / "w2"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "probe: passed" in res.stdout
    assert load_dir(math_set).variant_for("0.32.0").files[MATH].pre_sha256 == sha(
        (vllm.python_sources("0.32.0") / MATH).read_bytes())
    assert client.images.get(source).id == image_id
    assert ours() == before


def test_a_second_call_on_other_release_files_is_refused(patch_set: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    port(patch_set, "0.32.0", work).assert_clean_error(1)
    tree = vllm.tree_copy("0.32.0", tmp_path / "site-packages")
    vllm.replace_file(tree / ENVS, (tree / ENVS).read_bytes() + b"# changed by hand\n")
    res = run("port", "--patch", str(patch_set), "--to", "0.32.0", "--root", str(tree), "--python", PY,
              "--work", str(work))
    assert "vllm/envs.py of the given tree" in res.assert_clean_error(2)
    assert unchanged(patch_set)


def test_json_names_the_refusal_for_machines(patch_set: Path, tmp_path: Path) -> None:
    import json

    res = port(patch_set, "0.31.0", tmp_path / "work", "--json")
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert doc["status"] == "refused" and doc["error"]["kind"] == "port-refused" and doc["variant"] is None
    assert [(e["file"], e["line"], e["function"]) for e in doc["unguarded"]] == [
        ("vllm/v1/worker/gpu/model_runner.py", 905, "GPUModelRunner._dummy_run"),
        ("vllm/v1/worker/gpu/model_runner.py", 2196, "GPUModelRunner.sample_tokens")]
