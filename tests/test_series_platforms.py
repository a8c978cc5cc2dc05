"""A series through `--platform all` on the real amd64+arm64 fixture index in a loopback registry
(engine, registry and emulation tiers): the DSpark set and a team's set that requires it give each
platform one layer above its source and one new index; `verify --platform all` of the series
passes and of the DSpark set alone fails; the DSpark set alone applied to the series index gives
each platform its source plus one layer again (ours replaced, not stacked), and verifies."""

from __future__ import annotations

import json

import pytest

from dspark_patch.registry.index import Registry, parse_index
from tests.support.cli import run
from tests.support.index import PublishedIndex, fixture_index
from tests.support.team_sets import DSPARK, team_edit, write_set

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.emulation]


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> PublishedIndex:
    with fixture_index(tmp_path_factory.mktemp("registry")) as published:
        yield published


@pytest.fixture(scope="module")
def team(patched033, tmp_path_factory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("team")
    tree = patched033.copy(where / "tree" / "site-packages")
    write_set(where / "patches", "team-envs", team_edit(tree), requires=(DSPARK,))
    return {"DSPARK_PATCH_PATH": str(where / "patches")}


def _platform_layers(registry: Registry, ref: str) -> dict[str, list[str]]:
    """Each platform image's layer digests, by its platform, as the registry serves them."""
    repository = ref.rsplit(":", 1)[0]
    return {str(e.platform): [layer["digest"] for layer in json.loads(registry.fetch(f"{repository}@{e.digest}").body)["layers"]]
            for e in parse_index(registry.fetch(ref)).images}


def test_a_series_through_every_platform_of_an_index(index, team, tmp_path) -> None:
    registry = Registry(index.ref.split("/", 1)[0])
    source = _platform_layers(registry, index.ref)
    series_tag = index.ref.rsplit(":", 1)[0] + ":0.33.0-series"
    applied = run("apply", "--image", index.ref, "--platform", "all", "--patch", DSPARK, "--patch", "team-envs",
                  "--tag", series_tag, "--push", "--report-dir", str(tmp_path / "apply"), env=team)
    assert applied.returncode == 0, applied.stderr[-3000:]
    series = _platform_layers(registry, series_tag)
    assert set(series) == set(source)
    for platform, layers in series.items():
        assert layers[:-1] == source[platform] and len(layers) == len(source[platform]) + 1, platform

    ok = run("verify", "--image", series_tag, "--platform", "all", "--patch", DSPARK, "--patch", "team-envs",
             "--no-probe", "--report-dir", str(tmp_path / "verify"), env=team)
    assert ok.returncode == 0, ok.stderr[-3000:]
    alone = run("verify", "--image", series_tag, "--platform", "all", "--patch", DSPARK, "--no-probe",
                "--report-dir", str(tmp_path / "alone"), env=team)
    assert alone.returncode == 1 and "made from a series" in alone.stderr, alone.stderr[-3000:]

    dspark_tag = index.ref.rsplit(":", 1)[0] + ":0.33.0-dspark-again"
    replaced = run("apply", "--image", series_tag, "--platform", "all", "--patch", DSPARK, "--tag", dspark_tag,
                   "--push", "--no-probe", "--report-dir", str(tmp_path / "replace"), env=team)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    again = _platform_layers(registry, dspark_tag)
    for platform, layers in again.items():
        assert layers[:-1] == source[platform] and len(layers) == len(source[platform]) + 1, platform
    checked = run("verify", "--image", dspark_tag, "--platform", "all", "--patch", DSPARK, "--no-probe",
                  "--report-dir", str(tmp_path / "verify-again"), env=team)
    assert checked.returncode == 0, checked.stderr[-3000:]
