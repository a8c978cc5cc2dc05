"""A series of patch sets (fast tier): a team's own patch sets found through DSPARK_PATCH_PATH,
the order a series file and `requires` give, and the series planned on real vLLM 0.33.0 trees:
each set placed at zero fuzz on the result of the ones before it, each held to its own
reviewed hashes, a tree that already carries the first sets recognised."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from dspark_patch import series as series_mod
from dspark_patch.errors import BadInput, HashMismatch, HunkDoesNotApply, InvalidPatchSet, InvalidSeries
from dspark_patch.patchset import resolve
from dspark_patch.pipeline.series_steps import members, plan_checked
from dspark_patch.targets.base import Distribution
from tests.support.cli import run
from tests.support.team_sets import DSPARK, sha, team_edit, write_set
from tests.support.vllm import replace_file

SHIPPED = resolve(DSPARK)
# What `locate` answers for a vLLM 0.33.0 install; without a RECORD, vLLM's own folder is `vllm`.
DIST_033 = Distribution(name="vllm", version="0.33.0", location="/site", python="/usr/bin/python3",
                        python_version="3.11.2", cache_tag="cpython-311", record_file=None, record=())


def _reader(tree: Path):
    def read(path: str) -> bytes | None:
        file = tree / path
        return file.read_bytes() if file.is_file() else None
    return read


@pytest.fixture
def team(tmp_path: Path, patched033_tree: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A team folder on DSPARK_PATCH_PATH with `team-envs` (requires the DSpark set; made on a
    tree that carries it) and `team-loose` (the same change, without the requires)."""
    folder = tmp_path / "team-patches"
    edit = team_edit(patched033_tree)
    write_set(folder, "team-envs", edit, requires=(DSPARK,))
    write_set(folder, "team-loose", edit)
    monkeypatch.setenv("DSPARK_PATCH_PATH", str(folder))
    return folder


def _plan(names: list[str], tree: Path, **kw):
    series = series_mod.load(names)
    chosen = members(series, DIST_033)
    return plan_checked(series, chosen, _reader(tree), **kw)


# --- naming a series -------------------------------------------------------------------------

def test_a_series_file_lists_sets_in_order_with_comments_and_folders_found_beside_it(team: Path, tmp_path: Path) -> None:
    listed = tmp_path / "ci" / "series"
    shutil.copytree(team / "team-envs", listed.parent / "patches" / "team-envs")
    listed.write_text(f"# our image's patches, in order\n\n{DSPARK}   # the shipped one\npatches/team-envs\n")
    loaded = series_mod.load([], series_file=str(listed))
    assert loaded.names == (DSPARK, "team-envs")
    assert loaded.sets[1].source == listed.parent / "patches" / "team-envs"


@pytest.mark.parametrize(("text", "says"), [
    ("# nothing here\n\n", "names no patch set"),
    (f"{DSPARK} team-envs\n", "line 1: 'dspark-skip-mtp-buffer team-envs' names more than one patch set"),
    ("\xff\n", "not UTF-8 text"),
])
def test_a_series_file_that_names_no_set_clearly_is_refused(team: Path, tmp_path: Path, text: str, says: str) -> None:
    listed = tmp_path / "series"
    listed.write_bytes(text.encode("latin-1"))
    with pytest.raises(InvalidSeries, match=says):
        series_mod.load([], series_file=str(listed))


def test_patch_and_series_together_are_refused(team: Path, tmp_path: Path) -> None:
    (tmp_path / "series").write_text(f"{DSPARK}\n")
    with pytest.raises(InvalidSeries, match="--patch and --series both name patch sets"):
        series_mod.load([DSPARK], series_file=str(tmp_path / "series"))


def test_nothing_named_is_the_shipped_set_alone() -> None:
    assert series_mod.load([]).names == (DSPARK,)


@pytest.mark.parametrize(("names", "says"), [
    ([DSPARK, "team-envs", DSPARK], "lists dspark-skip-mtp-buffer twice (positions 1 and 3)"),
    (["team-envs"], "team-envs requires dspark-skip-mtp-buffer, which is not in the series"),
    (["team-envs", DSPARK], "team-envs requires dspark-skip-mtp-buffer, which comes after it in the series"),
])
def test_a_series_out_of_order_is_refused_before_any_tree_is_read(team: Path, names: list[str], says: str) -> None:
    with pytest.raises(InvalidSeries, match=re.escape(says)):
        series_mod.load(names)


def test_sets_that_require_each_other_are_named_as_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           patched033_tree: Path) -> None:
    folder = tmp_path / "team-patches"
    edit = team_edit(patched033_tree)
    write_set(folder, "one", {"vllm/envs.py": edit["vllm/envs.py"]}, requires=("two",))
    write_set(folder, "two", {"vllm/logger.py": edit["vllm/logger.py"]}, requires=("one",))
    monkeypatch.setenv("DSPARK_PATCH_PATH", str(folder))
    with pytest.raises(InvalidSeries, match="patch sets one -> two -> one require each other in a cycle"):
        series_mod.load(["one", "two"])


@pytest.mark.parametrize(("requires", "says"), [
    ('"not-a-list"', "requires must be a list of patch-set ids"),
    ('["Bad Id"]', "requires must be a list of patch-set ids"),
    ('["team-x"]', "patch set team-x requires itself"),
    (f'["{DSPARK}", "{DSPARK}"]', "requires lists a patch set twice"),
])
def test_a_malformed_requires_is_refused_where_the_set_is_loaded(tmp_path: Path, requires: str, says: str) -> None:
    folder = write_set(tmp_path, "team-x", {"vllm/logger.py": (b"a\n", b"b\n")})
    toml = folder / "patch.toml"
    toml.write_text(toml.read_text().replace('distribution = "vllm"', f'distribution = "vllm"\nrequires = {requires}'))
    with pytest.raises(InvalidPatchSet, match=says):
        resolve(str(folder))


# --- a team's folders ------------------------------------------------------------------------

def test_list_and_show_find_a_teams_sets_on_dspark_patch_path(team: Path) -> None:
    env = {"DSPARK_PATCH_PATH": str(team)}
    listed = run("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert [p["id"] for p in listed.json] == [DSPARK, "team-envs", "team-loose"]
    shown = run("show", "team-envs", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.json["variants"][0]["files"]["vllm/logger.py"]["post_sha256"] is not None


def test_a_path_entry_that_is_not_a_folder_is_one_line(tmp_path: Path) -> None:
    res = run("list", env={"DSPARK_PATCH_PATH": f"{tmp_path / 'typo'}"})
    line = res.assert_clean_error(2)
    assert f"DSPARK_PATCH_PATH names '{tmp_path / 'typo'}', which is not a folder" in line


def test_one_id_in_two_folders_is_refused_rather_than_picked_by_order(tmp_path: Path, patched033_tree: Path) -> None:
    """Which of two different patch sets a verdict was told against must not depend on the
    order of a search path."""
    first, second = tmp_path / "a", tmp_path / "b"
    write_set(first, DSPARK, {"vllm/logger.py": team_edit(patched033_tree)["vllm/logger.py"]})
    second.mkdir()
    res = run("show", DSPARK, env={"DSPARK_PATCH_PATH": f"{second}:{first}"})
    line = res.assert_clean_error(2)
    assert f"patch set {DSPARK} is in both" in line and str(first / DSPARK) in line


def test_the_shipped_folder_named_again_on_the_path_is_searched_once() -> None:
    shipped = SHIPPED.source.parent
    res = run("list", "--json", env={"DSPARK_PATCH_PATH": f"{shipped}:{shipped}"})
    assert res.returncode == 0, res.stderr
    assert [p["id"] for p in res.json] == [DSPARK]


# --- planning a series on real trees ---------------------------------------------------------

def test_a_series_on_a_pristine_tree_places_each_set_on_the_one_before(team: Path, vllm033_tree: Path,
                                                                        patched033_tree: Path) -> None:
    plan = _plan([DSPARK, "team-envs"], vllm033_tree)
    assert plan.status == "apply"
    assert [m.applied_before for m in plan.members] == [False, False]
    wanted = {path: after for path, (_before, after) in team_edit(patched033_tree).items()}
    wanted["vllm/models/deepseek_v4/nvidia/model.py"] = (patched033_tree / "vllm/models/deepseek_v4/nvidia/model.py").read_bytes()
    combined = {f.path: f for f in plan.combined.files}
    assert {p: f.post for p, f in combined.items()} == wanted
    # pre: the tree as read; the DSpark set's reviewed pre-image of envs.py, not the team's
    assert combined["vllm/envs.py"].pre_sha256 == SHIPPED.variant_for("0.33.0").files["vllm/envs.py"].pre_sha256
    assert plan.files_of["vllm/envs.py"] == (DSPARK, "team-envs")


def test_a_tree_that_carries_the_first_set_gets_only_the_rest(team: Path, patched033_tree: Path) -> None:
    before = {p: (patched033_tree / p).read_bytes() for p in ("vllm/envs.py", "vllm/logger.py")}
    plan = _plan([DSPARK, "team-envs"], patched033_tree)
    assert plan.status == "apply"
    assert [m.applied_before for m in plan.members] == [True, False]
    assert {f.path for f in plan.combined.files} == {"vllm/envs.py", "vllm/logger.py"}
    assert all(f.pre == before[f.path] for f in plan.combined.files)


def test_a_tree_that_carries_the_whole_series_is_already_applied(team: Path, patched033_tree: Path) -> None:
    for path, (_before, after) in team_edit(patched033_tree).items():
        assert after is not None
        replace_file(patched033_tree / path, after)
    plan = _plan([DSPARK, "team-envs"], patched033_tree)
    assert plan.status == "already-applied"
    assert [m.applied_before for m in plan.members] == [True, True]
    assert all(f.pre == f.post for f in plan.combined.files)


def test_two_sets_changing_one_file_without_requires_are_refused(team: Path, vllm033_tree: Path) -> None:
    with pytest.raises(InvalidSeries, match="team-loose and dspark-skip-mtp-buffer both change vllm/envs.py, "
                                            "but team-loose does not require dspark-skip-mtp-buffer"):
        _plan([DSPARK, "team-loose"], vllm033_tree)


def test_a_set_made_on_a_tree_without_the_one_it_requires_does_not_fit(tmp_path: Path, vllm033_tree: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its envs.py pre-image is the pristine file, not the DSpark set's result: the series says so
    by name, before anything could be written."""
    folder = tmp_path / "team-patches"
    envs = (vllm033_tree / "vllm/envs.py").read_bytes()
    write_set(folder, "team-stale", {"vllm/envs.py": (envs, b"# team\n" + envs)}, requires=(DSPARK,))
    monkeypatch.setenv("DSPARK_PATCH_PATH", str(folder))
    with pytest.raises((HunkDoesNotApply, HashMismatch), match="team-stale"):
        _plan([DSPARK, "team-stale"], vllm033_tree)


def test_a_file_changed_by_hand_between_two_sets_fails_on_the_sets_own_hashes(team: Path, patched033_tree: Path) -> None:
    """A tree that carries the DSpark set and an extra line where neither set looks: placement
    alone would take it; the team set's reviewed pre-image does not."""
    logger = patched033_tree / "vllm/logger.py"
    replace_file(logger, b"# changed by hand\n" + logger.read_bytes())
    with pytest.raises(HashMismatch, match=r"patch set team-envs: vllm/logger.py before it has sha256 "):
        _plan([DSPARK, "team-envs"], patched033_tree)
    plan = _plan([DSPARK, "team-envs"], patched033_tree, hash_checks=False)
    assert plan.status == "apply"


def test_a_set_that_changes_files_the_ones_before_do_not_need_no_requires(tmp_path: Path, vllm033_tree: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "team-patches"
    logger = (vllm033_tree / "vllm/logger.py").read_bytes()
    added = b"TEAM = 1\n"
    write_set(folder, "team-logger", {"vllm/logger.py": (logger, logger + b"# ours\n"),
                                      "vllm/team_extra.py": (None, added)})
    monkeypatch.setenv("DSPARK_PATCH_PATH", str(folder))
    plan = _plan([DSPARK, "team-logger"], vllm033_tree)
    combined = {f.path: f for f in plan.combined.files}
    assert combined["vllm/team_extra.py"].action == "add" and combined["vllm/team_extra.py"].post_sha256 == sha(added)
    assert combined["vllm/logger.py"].post == logger + b"# ours\n"


def test_a_bad_path_entry_is_bad_input_where_sets_are_loaded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DSPARK_PATCH_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(BadInput, match="not a folder"):
        series_mod.load(["team-envs"])
