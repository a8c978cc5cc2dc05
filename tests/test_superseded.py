"""A release that ships the change in its own form (vLLM 0.34.0: `needs_mtp_hidden_buffer`), on
real trees of the real wheel: status says `superseded`, apply writes nothing, verify passes, the
probe passes on the effect cases; a mutant release where DSpark allocates the buffer again is never
superseded; `port` without the record names upstream's change and writes an unreviewed one."""

from __future__ import annotations

import hashlib
import os
import shutil
import tomllib
from pathlib import Path

import pytest

from dspark_patch.errors import InvalidPatchSet
from dspark_patch.patchset import load_dir, resolve
from tests.support.cli import run
from tests.support.team_sets import write_set
from tests.support.vllm import replace_file, tree_copy, wheel

SHIPPED = resolve("dspark-skip-mtp-buffer")
RECORD = SHIPPED.superseded_for("0.34.0")
SPEC_DECODE = "vllm/models/deepseek_v4/common/spec_decode.py"
FLAG = "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER"
EFFECT = SHIPPED.effect_cases[0]


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under `root` (links as their targets' names) with its sha256: what 'not one byte
    changed' is checked against."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            out[rel] = os.readlink(path) if path.is_symlink() else hashlib.sha256(path.read_bytes()).hexdigest()
        for name in dirs:
            out[(Path(dirpath) / name).relative_to(root).as_posix() + "/"] = "dir"
    return out


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return tree_copy("0.34.0", tmp_path / "site-packages")


@pytest.fixture
def mutant(tmp_path: Path) -> Path:
    """0.34.0 with upstream's skip reverted: DSpark allocates the buffer again."""
    site = tree_copy("0.34.0", tmp_path / "mutant")
    source = (site / SPEC_DECODE).read_bytes()
    reverted = source.replace(b"        and not spec_config.use_dspark()\n", b"")
    assert reverted != source
    replace_file(site / SPEC_DECODE, reverted)
    return site


def test_the_shipped_record_is_reviewed_and_names_upstreams_decision() -> None:
    assert RECORD is not None and RECORD.review == "reviewed" and RECORD.effect_cases == SHIPPED.effect_cases
    assert f"{SPEC_DECODE}:needs_mtp_hidden_buffer" in RECORD.where
    assert (SHIPPED.source / str(RECORD.review_file)).read_text().count("wider") >= 1


def test_probe_passes_on_the_pristine_release_with_the_effect_cases(tree: Path, tmp_path: Path) -> None:
    res = run("probe", "--root", str(tree), "--json", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    doc = res.json
    assert [c["name"] for c in doc["probe"]["cases"]] == list(RECORD.effect_cases)
    assert all(c["ok"] for c in doc["probe"]["cases"])
    effect = doc["probe"]["cases"][0]["detail"]
    assert "decided by needs_mtp_hidden_buffer" in effect and "beyond the reviewed scope" in effect
    assert f"{SPEC_DECODE}:needs_mtp_hidden_buffer" in doc["probe"]["where"]
    assert doc["superseded"][0]["record"] == "vllm-0.34.0"


def test_status_says_superseded_and_nothing_unexplained(tree: Path) -> None:
    res = run("status", "--root", str(tree), "--json")
    assert res.returncode == 0, (res.stdout, res.stderr)
    (row,) = res.json["images"]
    assert row["patch_sets"]["dspark-skip-mtp-buffer"] == "superseded"
    assert row["exit_code"] == 0 and row["reference"] is not None, row
    assert row["unexplained"] == row["missing"] == row["added"] == []
    assert not any("no reference" in u for u in row["unverified"]), row["unverified"]


def test_apply_writes_nothing_and_verify_passes_with_the_note(tree: Path, tmp_path: Path) -> None:
    before = tree_digest(tree)
    res = run("apply", "--root", str(tree), "--json", "--report-dir", str(tmp_path / "a"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    doc = res.json
    assert doc["status"] == "already-applied" and doc["files"] == []
    (superseded,) = doc["superseded"]
    assert superseded["release"] == "0.34.0" and superseded["effect_cases"] == list(RECORD.effect_cases)
    assert [c["name"] for c in doc["probe"]["cases"]] == list(RECORD.effect_cases)
    assert any("superseded in vllm 0.34.0" in n and "needs_mtp_hidden_buffer" in n for n in doc["notes"])
    assert tree_digest(tree) == before

    res = run("verify", "--root", str(tree), "--json", "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert res.json["status"] == "verified"
    assert any("superseded in vllm 0.34.0" in n for n in res.json["notes"])
    assert tree_digest(tree) == before


def test_apply_with_no_probe_cannot_prove_it(tree: Path, tmp_path: Path) -> None:
    res = run("apply", "--root", str(tree), "--no-probe", "--report-dir", str(tmp_path / "a"))
    assert "--no-probe" in res.assert_clean_error(1)


def test_a_mutant_release_fails_the_probe_and_is_never_superseded(mutant: Path, tmp_path: Path) -> None:
    before = tree_digest(mutant)
    res = run("probe", "--root", str(mutant), "--json", "--report-dir", str(tmp_path / "p"))
    assert res.returncode == 1
    cases = {c["name"]: c for c in res.json["probe"]["cases"]}
    assert not cases[EFFECT]["ok"] and "the buffer is allocated" in cases[EFFECT]["detail"]
    res = run("apply", "--root", str(mutant), "--report-dir", str(tmp_path / "a"))
    assert "effect cases fail" in res.assert_clean_error(1)
    assert tree_digest(mutant) == before
    res = run("status", "--root", str(mutant), "--json")
    (row,) = res.json["images"]
    assert row["patch_sets"]["dspark-skip-mtp-buffer"] != "superseded"
    assert res.returncode == 1   # and the changed file is a finding


def test_a_series_on_the_release_carries_only_the_team_set(tree: Path, tmp_path: Path) -> None:
    logger = (tree / "vllm/logger.py").read_bytes()
    team = write_set(tmp_path / "team", "team-note", {"vllm/logger.py": (logger, logger + b"\n# team note\n")},
                     release="0.34.0")
    env = {"DSPARK_PATCH_PATH": str(team.parent)}
    res = run("apply", "--root", str(tree), "--patch", "dspark-skip-mtp-buffer", "--patch", "team-note", "--json",
              "--report-dir", str(tmp_path / "a"), env=env)
    assert res.returncode == 0, (res.stdout, res.stderr)
    doc = res.json
    assert [f["path"] for f in doc["files"]] == ["vllm/logger.py"]
    assert [s["id"] for s in doc["superseded"]] == ["dspark-skip-mtp-buffer"]
    assert (tree / "vllm/logger.py").read_bytes().endswith(b"# team note\n")
    res = run("verify", "--root", str(tree), "--patch", "dspark-skip-mtp-buffer", "--patch", "team-note",
              "--report-dir", str(tmp_path / "v"), env=env)
    assert res.returncode == 0, (res.stdout, res.stderr)


def test_port_without_the_record_names_upstreams_change_and_writes_an_unreviewed_one(tmp_path: Path) -> None:
    folder = tmp_path / "patches" / "dspark-skip-mtp-buffer"
    shutil.copytree(SHIPPED.source, folder)
    toml = (folder / "patch.toml").read_text()
    (folder / "patch.toml").write_text(toml[: toml.index("\n# vLLM 0.34.0 ships the change") + 1])
    (folder / "vllm-0.34.0.superseded.md").unlink()
    assert load_dir(folder).superseded_for("0.34.0") is None
    work = tmp_path / "work"
    res = run("port", "--patch", str(folder), "--to", "0.34.0", "--wheel", str(wheel("0.34.0")), "--work", str(work))
    line = res.assert_clean_error(1)
    assert "appears to ship the change" in line and "needs_mtp_hidden_buffer" in line
    assert "decided at: vllm/models/deepseek_v4/common/spec_decode.py:needs_mtp_hidden_buffer" in res.stdout
    assert "beyond the reviewed scope DSpark also goes without it with: flag unset, Model Runner V1" in res.stdout
    candidate = tomllib.loads((work / "superseded-vllm-0.34.0.toml").read_text())["superseded"][0]
    assert candidate["review"] == "unreviewed" and candidate["releases"] == ["0.34.0"]
    # the files it was proven on are the shipped, reviewed record's
    assert candidate["files"] == dict(RECORD.files)
    assert (work / "superseded-vllm-0.34.0.md").is_file()
    assert load_dir(folder).superseded == ()   # nothing written into the patch set


def test_port_to_a_release_the_record_covers_has_nothing_to_do(tmp_path: Path) -> None:
    res = run("port", "--to", "0.34.0", "--wheel", str(wheel("0.34.0")), "--work", str(tmp_path / "w"))
    assert "superseded record vllm-0.34.0" in res.assert_clean_error(2)


def _with_record(tmp_path: Path, table: str) -> Path:
    folder = tmp_path / "dspark-skip-mtp-buffer"
    shutil.copytree(SHIPPED.source, folder)
    toml = (folder / "patch.toml").read_text()
    (folder / "patch.toml").write_text(toml[: toml.index("\n# vLLM 0.34.0 ships the change") + 1] + table)
    return folder


@pytest.mark.parametrize(("table", "says"), [
    ('[[superseded]]\nname = "x"\nreleases = ["0.33.0"]\nupstream = "u"\nwhere = ["a:b"]\n[superseded.files]\n"a" = "' + "0" * 64 + '"\n',
     "is in both"),
    ('[[superseded]]\nname = "x"\nreleases = ["0.34.0"]\nupstream = "u"\nwhere = ["a:b"]\n[superseded.files]\n"a" = "zz"\n',
     "64 lower-case hex"),
    ('[[superseded]]\nname = "x"\nreleases = ["0.34.0"]\nupstream = "u"\nwhere = ["a:b"]\n',
     "missing key(s) files"),
    ('[[superseded]]\nname = "x"\nreleases = ["0.34.0"]\nupstream = "u"\nwhere = ["a:b"]\nreview = "ok"\n[superseded.files]\n"a" = "' + "0" * 64 + '"\n',
     "review must be"),
])
def test_a_malformed_record_is_refused_on_load(tmp_path: Path, table: str, says: str) -> None:
    with pytest.raises(InvalidPatchSet, match="superseded|both") as exc:
        load_dir(_with_record(tmp_path, table))
    assert says in exc.value.message
