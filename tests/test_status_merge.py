"""`status --shard I/N` and `report merge`, on local folders (no engine): the shards of a real
run merged give the unsharded run's report; shards that do not make one run are refused.

The folders: a real vLLM 0.33.0 tree (clean), a vLLM with no published reference (a finding), a
folder without vLLM and a path that is not there (bad input), given out of sorted order so that
the merge has to put the rows back where the unsharded run has them. The engine test of the same
(a fleet of fixture images, N = 1, 2, 3) is in tests/test_status.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema
import pytest

from dspark_patch.errors import BadInput
from dspark_patch.report.merge import merge
from dspark_patch.report.status_render import load_status_schema
from dspark_patch.status.shard import Shard, parse_shard, pick
from tests.support import vllm
from tests.support.cli import run

REPO = Path(__file__).resolve().parents[1]


def _valid(doc: dict) -> dict:
    jsonschema.Draft202012Validator(load_status_schema(), format_checker=jsonschema.FormatChecker()).validate(doc)
    return doc


def _status(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    res = run("status", *args, "--json", env=env)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, _valid(json.loads(res.stdout))


def _roots(refs: list[str]) -> list[str]:
    return [a for ref in refs for a in ("--root", ref)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("merge")
    fake = where / "b-no-reference"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("\n")
    (fake / "vllm-9.9.9.dist-info").mkdir()
    (fake / "vllm-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    (fake / "vllm-9.9.9.dist-info" / "RECORD").write_text("vllm/__init__.py,,\n")
    (where / "c-no-vllm").mkdir()
    return {"clean": str(vllm.tree_copy("0.33.0", where / "a-clean")), "fake": str(fake),
            "empty": str(where / "c-no-vllm"), "gone": str(where / "d-gone"), "where": str(where)}


@pytest.fixture(scope="module")
def run3(folders: dict[str, str]) -> dict:
    """The unsharded run and its three shards, each as `status --shard I/3 --report-dir` wrote it."""
    where = Path(folders["where"])
    given = [folders[k] for k in ("gone", "fake", "clean", "empty")]   # not sorted
    code, whole = _status(*_roots(given), "--report-dir", str(where / "whole"))
    shards = []
    for i in range(3):
        out = where / f"shard{i}"
        shard_code, doc = _status(*_roots(given), "--shard", f"{i}/3", "--report-dir", str(out))
        assert shard_code == doc["exit_code"]
        shards.append(out / "status.json")
    return {"code": code, "whole": whole, "whole_dir": where / "whole", "shards": shards, "given": given}


def _without_times(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("started_at", "seconds", "merged")}


def _no_seconds(text: str) -> str:
    return re.sub(r'time="[0-9.]+"', 'time=""', re.sub(r", [0-9.]+s\.", ", s.", text))


def test_the_shards_merged_are_the_unsharded_report(run3: dict, tmp_path: Path) -> None:
    whole, shards = run3["whole"], [json.loads(p.read_text()) for p in run3["shards"]]
    # Every target in exactly one shard, the sorted list cut in runs of near-equal size.
    assert [[r["ref"] for r in s["images"]] for s in shards] == [
        [run3["given"][2]], [run3["given"][1]], [run3["given"][0], run3["given"][3]]]
    assert [(s["shard"]["index"], s["shard"]["count"], s["shard"]["targets"], s["shard"]["positions"]) for s in shards] == [
        (0, 3, 4, [2]), (1, 3, 4, [1]), (2, 3, 4, [0, 3])]
    assert len({s["shard"]["list_sha256"] for s in shards}) == 1
    assert [s["exit_code"] for s in shards] == [0, 1, 2] and run3["code"] == whole["exit_code"] == 2

    # Given in any order, the merge is the unsharded report: rows, order, exit code, schema.
    res = run("report", "merge", *map(str, reversed(run3["shards"])))
    assert res.returncode == 2, res.stderr
    merged = _valid(json.loads(res.stdout))
    assert _without_times(merged) == _without_times(whole)
    assert merged["merged"] == {"count": 3, "shards": [0, 1, 2], "missing": [], "partial": False}
    for fmt, name in (("md", "status.md"), ("junit", "junit.xml")):
        out = tmp_path / name
        res = run("report", "merge", *map(str, run3["shards"]), "--format", fmt, "-o", str(out))
        assert res.returncode == 2 and res.stdout == "", res.stderr
        assert _no_seconds(out.read_text()) == _no_seconds((run3["whole_dir"] / name).read_text())


def test_a_partial_merge_says_so_and_is_never_clean(run3: dict, tmp_path: Path) -> None:
    clean = run3["shards"][0]   # the clean tree alone: exit 0 as a shard
    assert json.loads(clean.read_text())["exit_code"] == 0
    res = run("report", "merge", str(clean))
    assert "shard(s) 1/3, 2/3 missing" in res.assert_clean_error(2)
    res = run("report", "merge", str(clean), "--allow-partial", "-o", str(tmp_path / "m.json"))
    assert res.returncode == 1, res.stderr
    doc = _valid(json.loads((tmp_path / "m.json").read_text()))
    assert doc["exit_code"] == 1 and doc["merged"] == {"count": 3, "shards": [0], "missing": [1, 2], "partial": True}
    assert [r["exit_code"] for r in doc["images"]] == [0]
    md = run("report", "merge", str(clean), "--allow-partial", "--format", "md").stdout
    assert "**Partial**: merged from shard(s) 0 of 3; shard(s) 1, 2 missing" in md
    junit = run("report", "merge", str(clean), "--allow-partial", "--format", "junit").stdout
    assert 'errors="2"' in junit and 'message="shard 2/3 missing: its images were not read"' in junit


def _edited(path: Path, where: Path, change) -> Path:
    doc = json.loads(path.read_text())
    change(doc)
    out = where / f"edited-{len(list(where.iterdir()))}.json"
    out.write_text(json.dumps(doc))
    return out


def test_shards_that_are_not_one_run_are_refused(run3: dict, folders: dict[str, str], tmp_path: Path) -> None:
    s0, s1, s2 = run3["shards"]
    given = run3["given"]
    # Real runs that differ from the others: another patch set folder, another list, another N.
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    toml = patches / "dspark-skip-mtp-buffer" / "patch.toml"
    toml.write_text(toml.read_text().replace('releases = ["0.32.0"]', 'releases = ["0.32.0", "0.32.1"]', 1))
    _, other_patches = _status(*_roots(given), "--shard", "2/3", env={"DSPARK_PATCH_PATCHES": str(patches)})
    _, other_list = _status(*_roots([*given, str(tmp_path / "e-more")]), "--shard", "2/3")
    _, other_count = _status(*_roots(given), "--shard", "1/2")
    assert [r["ref"] for r in other_patches["images"]] == [given[0], given[3]]
    files = {}
    for name, doc in (("patches", other_patches), ("list", other_list), ("count", other_count)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(doc))

    cases = {
        "mixed patch sets": [s0, s1, files["patches"]],
        "mixed image lists": [s0, s1, files["list"]],
        "mixed shard counts (3 and 2)": [s0, files["count"]],
        "mixed tool versions (": [s0, s1, _edited(s2, tmp_path, lambda d: d.update(tool_version="0.0.1"))],
        "are both shard 1/3": [s0, s1, s1, s2],
        "is not a shard (written without --shard)": [run3["whole_dir"] / "status.json"],
        "exit code 0 with findings or an error": [s0, _edited(s1, tmp_path, lambda d: d["images"][0].update(exit_code=0)), s2],
        "exit code 2, but its worst row's is 1": [s0, _edited(s1, tmp_path, lambda d: d.update(exit_code=2)), s2],
        "holds 1 row(s) and 2 position(s); its share of 4 target(s) is 2":
            [s0, s1, _edited(s2, tmp_path, lambda d: d["images"].pop())],
        "not a status document: images[0].exit_code": [s0, s1, _edited(s2, tmp_path, lambda d: d["images"][0].update(exit_code="2"))],
        "names no patch set digests": [s0, s1, _edited(s2, tmp_path, lambda d: d.pop("patch_set_digests"))],
    }
    for expected, paths in cases.items():
        with pytest.raises(BadInput) as caught:
            merge(paths)
        assert expected in caught.value.message, (expected, caught.value.message)

    # Through the command: one line, exit 2, nothing written.
    (tmp_path / "cut.json").write_text(s1.read_text()[:100])
    out = tmp_path / "out.json"
    for paths, expected in (([s0, tmp_path / "cut.json", s2], "cut.json: not JSON (line"),
                            ([s0, s1, files["patches"]], "mixed patch sets"),
                            ([s0, tmp_path / "nothere.json", s2], "nothere.json: no such file")):
        res = run("report", "merge", *map(str, paths), "-o", str(out))
        assert expected in res.assert_clean_error(2)
        assert not out.exists()


def test_bad_shard_values_are_one_line_exit_2(folders: dict[str, str]) -> None:
    for value, env, expected in (
            ("3/3", {}, "--shard 3/3: the index must be below 3 (shards are numbered 0 to 2)"),
            ("1/0", {}, "--shard 1/0: N must be at least 1"),
            ("a/b", {}, "--shard 'a/b' is not I/N"),
            ("-1/2", {}, "--shard '-1/2' is not I/N"),
            ("2", {}, "--shard '2' is not I/N"),
            ("auto/2", {}, "--shard auto/2: $JOB_COMPLETION_INDEX is not set"),
            ("auto/2", {"JOB_COMPLETION_INDEX": "x"}, "--shard auto/2: $JOB_COMPLETION_INDEX is 'x', not a shard index"),
            ("auto/2", {"JOB_COMPLETION_INDEX": "2"}, "--shard 2/2: the index must be below 2")):
        with pytest.raises(BadInput) as caught:
            parse_shard(value, env)
        assert expected in caught.value.message, value
    # Through the command: one line, exit 2, before anything is read.
    for value, env, expected in (("3/3", {}, "the index must be below 3"),
                                 ("auto/2", {"JOB_COMPLETION_INDEX": "x"}, "is 'x', not a shard index")):
        res = run("status", "--root", folders["empty"], "--shard", value, env=env)
        assert expected in res.assert_clean_error(2), value


def test_auto_takes_the_index_from_an_indexed_job(run3: dict) -> None:
    code, doc = _status(*_roots(run3["given"]), "--shard", "auto/3", env={"JOB_COMPLETION_INDEX": "2"})
    assert doc["shard"]["index"] == 2 and doc["shard"]["positions"] == [0, 3]
    assert _without_times(doc) == _without_times(json.loads(run3["shards"][2].read_text()))


def test_the_share_is_a_partition_whatever_the_order() -> None:
    refs = [f"registry.example:5000/team/vllm:{t}" for t in ("0.33.0", "0.33.0-cu12", "0.32.0", "nightly")]
    refs += ["other/model:3", "other/model:1", "other/model:2", "other/model:4", "registry.example:5000/team/vllm:0.32.0"]
    distinct = list(dict.fromkeys(refs))
    for count in range(1, len(distinct) + 3):
        shares = [pick(refs, Shard(index=i, count=count)) for i in range(count)]
        picked = [distinct[p] for s in shares for p in s.positions]
        assert sorted(picked) == sorted(distinct), count                   # each target once
        sizes = [len(s.positions) for s in shares]
        assert max(sizes) - min(sizes) <= 1, sizes                          # near-equal
        assert len({s.list_sha256 for s in shares}) == 1
        reordered = list(dict.fromkeys(reversed(refs)))
        again = [pick(reversed(refs), Shard(index=i, count=count)) for i in range(count)]
        assert [{reordered[p] for p in s.positions} for s in again] == [
            {distinct[p] for p in s.positions} for s in shares]              # the order given does not matter
        assert again[0].list_sha256 == shares[0].list_sha256
    # Tags of one repository sort together (they share base layers): here each shard holds one.
    two = [pick(distinct, Shard(index=i, count=2)) for i in range(2)]
    assert [{distinct[p].rsplit(":", 1)[0] for p in s.positions} for s in two] == [
        {"other/model"}, {"registry.example:5000/team/vllm"}]
