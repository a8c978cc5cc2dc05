"""Patch sets are data: a broken patch.toml is refused with one line naming the file and key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dspark_patch.patchset import patches_dir
from tests.support.cli import run

SHIPPED = patches_dir() / "dspark-skip-mtp-buffer"


@pytest.fixture
def patch_set(tmp_path: Path) -> Path:
    """A copy of the shipped patch set that a test may break."""
    dest = tmp_path / "dspark-skip-mtp-buffer"
    shutil.copytree(SHIPPED, dest)
    return dest


def edit(folder: Path, old: str, new: str) -> None:
    toml = folder / "patch.toml"
    text = toml.read_text()
    assert old in text
    toml.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ('strip = 1', 'strip = 1\ncolour = "blue"', "unknown key(s) colour"),
        ('probe = ["probe.py", ', 'probe = ["missing.py", ', "probe file missing.py is missing"),
        ('"probe_census.py"', '"probe_gone.py"', "probe file probe_gone.py is missing"),
        ('"probe_census.py"', '"probe.py"', "probe file probe.py is listed twice"),
        ('probe = ["probe.py", ', 'probe = ["consumer", ', "probe must name a .py file"),
        ('probe = ["probe.py", ', 'probe = ["../probe.py", ', "must be a file inside"),
        ('title = "', 'titel = "', "unknown key(s) titel"),
        ('diff = "vllm-0.33.0.patch"', 'diff = "missing.patch"', "diff file missing.patch is missing"),
        ('pre_sha256 = "a9f665c4', 'pre_sha256 = "A9F665C4', "64 lower-case hex"),
        ('releases = ["0.33.0"]', "releases = []", "releases must be a non-empty list"),
        ('id = "dspark-skip-mtp-buffer"', 'id = "other-name"', "differs from its folder name"),
        ("strip = 1", "strip = -1", "strip must be a non-negative integer"),
        ('[variants.files."vllm/envs.py"]', '[variants.files."vllm/envs.py"]\nsha256 = "x"', "unknown key(s) sha256"),
        ("strip = 1", "strip = [", "not valid TOML"),
        ('probe_beside = "--census"', 'probe_beside = "census"', "probe_beside must be a probe's flag"),
        ('probe_beside = "--census"', 'probe_beside = ["--census"]', "probe_beside must be a probe's flag"),
    ],
)
def test_a_broken_patch_toml_is_one_clean_line(patch_set: Path, tmp_path: Path, old, new, words):
    edit(patch_set, old, new)
    res = run("show", str(patch_set))
    line = res.assert_clean_error(2)
    assert words in line and "patch.toml" in line


def test_a_diff_that_touches_files_without_hashes_is_refused(patch_set: Path, vllm033_tree: Path, tmp_path: Path):
    toml = patch_set / "patch.toml"
    text = toml.read_text()
    start = text.index('[variants.files."vllm/models')
    toml.write_text(text[:start])
    res = run("apply", "--root", str(vllm033_tree), "--patch", str(patch_set), "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(2)
    assert "vllm/models/deepseek_v4/nvidia/model.py" in line and "[variants.files]" in line


def test_a_shipped_patch_set_loads_and_lists_every_file_of_its_diff():
    res = run("show", "dspark-skip-mtp-buffer", "--json")
    assert res.returncode == 0
    variant = res.json["variants"][0]
    diff = (SHIPPED / variant["diff"]).read_text()
    in_diff = {line[len("+++ b/"):].strip() for line in diff.splitlines() if line.startswith("+++ b/")}
    assert set(variant["files"]) == in_diff


def test_dspark_patch_patches_points_list_at_another_folder_of_patch_sets():
    other = Path(__file__).resolve().parent / "data" / "patchsets"
    res = run("list", "--json", env={"DSPARK_PATCH_PATCHES": str(other)})
    assert res.returncode == 0, res.stderr
    assert [p["id"] for p in res.json] == ["vllm-math-positive-divisor"]
    res = run("list", "--json")
    assert "dspark-skip-mtp-buffer" in [p["id"] for p in res.json]
    assert "vllm-math-positive-divisor" not in [p["id"] for p in res.json]  # test-only: never shipped
