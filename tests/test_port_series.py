"""`port` of a series on the real 0.32.0 wheel: each set ported onto the release with the sets
before it applied. The DSpark set has its 0.32.0 variant (used as it is); a team's set made on
0.33.0 over it (`vllm/envs.py`, which DSpark also changes, and `vllm/logger.py`) is ported onto
DSpark's 0.32.0 result, so its pre-image of envs.py is DSpark's 0.32.0 post-image, and the two
then apply as a series to a pristine 0.32.0 tree."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from dspark_patch.patchset import load_dir, resolve
from tests.support import vllm
from tests.support.cli import run
from tests.support.team_sets import DSPARK, team_edit, write_set

PY = sys.executable


def _team_set(patched033_tree: Path, where: Path) -> Path:
    return write_set(where, "team-envs", team_edit(patched033_tree), requires=(DSPARK,))


def test_a_series_is_ported_in_order_onto_the_earlier_sets_result(patched033_tree: Path, tmp_path: Path) -> None:
    team = _team_set(patched033_tree, tmp_path / "sets")
    res = run("port", "--patch", DSPARK, "--patch", str(team), "--to", "0.32.0", "--wheel", str(vllm.wheel("0.32.0")),
              "--work", str(tmp_path / "work"), "--python", PY, "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert [(r["patch"], r["status"]) for r in res.json["series"]] == [(DSPARK, "covered"), ("team-envs", "written")]

    ported = load_dir(team).variant_for("0.32.0")
    dspark = resolve(DSPARK).variant_for("0.32.0")
    assert ported.review == "unreviewed" and ported.ported_from == "vllm-0.33.0"
    # envs.py: onto DSpark's 0.32.0 result; logger.py (DSpark leaves it alone): the wheel's own
    assert ported.files["vllm/envs.py"].pre_sha256 == dspark.files["vllm/envs.py"].post_sha256
    tree = vllm.tree_copy("0.32.0", tmp_path / "site-packages")
    assert ported.files["vllm/logger.py"].pre_sha256 == hashlib.sha256((tree / "vllm/logger.py").read_bytes()).hexdigest()

    applied = run("apply", "--root", str(tree), "--python", PY, "--patch", DSPARK, "--patch", str(team),
                  "--allow-unreviewed", "--no-probe", "--report-dir", str(tmp_path / "apply"))
    assert applied.returncode == 0, applied.stderr[-2000:]
    for path in ("vllm/envs.py", "vllm/logger.py"):
        assert hashlib.sha256((tree / path).read_bytes()).hexdigest() == ported.files[path].post_sha256


def test_a_series_in_an_order_that_breaks_requires_is_refused_before_any_work(patched033_tree: Path,
                                                                             tmp_path: Path) -> None:
    team = _team_set(patched033_tree, tmp_path / "sets")
    res = run("port", "--patch", str(team), "--patch", DSPARK, "--to", "0.32.0", "--wheel", str(vllm.wheel("0.32.0")),
              "--work", str(tmp_path / "work"), "--python", PY)
    assert "requires" in res.assert_clean_error(2)
    assert not (tmp_path / "work").exists() and [v.name for v in load_dir(team).variants] == ["vllm-0.33.0"]
