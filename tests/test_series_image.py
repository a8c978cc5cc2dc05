"""A series of patch sets on the real 0.33.0 fixture image, through the console script (engine
tier), as a new user runs it: a team's set made with `new` from a tree that carries the DSpark
set, applied as a series with it, gives one new layer whose labels name the series; `verify` of
the series passes; `verify` of the DSpark set alone fails naming what else the image carries;
the DSpark set alone applied to that result gives the source plus one layer (ours replaced) and
verifies; a layer someone put on top of ours is never dropped."""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from pathlib import Path

import docker
import pytest

from dspark_patch.pipeline import LABEL_PREFIX
from tests.support.cli import run
from tests.support.images import fixture_image
from tests.support.team_sets import DSPARK, team_edit
from tests.support.vllm import replace_file, wheel

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    return docker.from_env()


@pytest.fixture(scope="module")
def team(patched033, tmp_path_factory) -> dict[str, str]:
    """The team's set as a user makes it: `new` on a tree that carries the DSpark set and edits
    vllm/envs.py (which DSpark changes too) and vllm/logger.py; then a person marks it reviewed."""
    where = tmp_path_factory.mktemp("team")
    tree = patched033.copy(where / "tree" / "site-packages")
    for path, (_before, after) in team_edit(tree).items():
        assert after is not None
        replace_file(tree / path, after)
    made = run("new", "team-envs", "--root", str(tree), "--wheel", str(wheel("0.33.0")), "--out", str(where / "patches"))
    assert made.returncode == 0, made.stderr
    toml = where / "patches" / "team-envs" / "patch.toml"
    toml.write_text(toml.read_text().replace('review = "unreviewed"', 'review = "reviewed"'))
    return {"DSPARK_PATCH_PATH": str(where / "patches")}


@pytest.fixture(scope="module")
def series_image(client, team, tmp_path_factory):
    out = tmp_path_factory.mktemp("series")
    tag = f"dspark-patch/test-series:{uuid.uuid4().hex[:10]}"
    res = run("apply", "--image", fixture_image(), "--patch", DSPARK, "--patch", "team-envs", "--tag", tag,
              "--report-dir", str(out / "r"), "--json", env=team)
    yield res, tag, out
    try:
        client.images.remove(tag, force=True)
    except docker.errors.ImageNotFound:
        pass


def test_a_series_is_one_new_layer_whose_labels_name_it(client, series_image) -> None:
    res, tag, _out = series_image
    assert res.returncode == 0, res.stderr
    assert res.json["status"] == "applied"
    source = client.images.get(fixture_image()).attrs
    result = client.images.get(tag).attrs
    assert result["RootFS"]["Layers"][:-1] == source["RootFS"]["Layers"]
    assert len(result["RootFS"]["Layers"]) == len(source["RootFS"]["Layers"]) + 1
    labels = result["Config"]["Labels"]
    assert [m["id"] for m in json.loads(labels[f"{LABEL_PREFIX}.series"])] == [DSPARK, "team-envs"]
    assert labels[f"{LABEL_PREFIX}.patch.id"] == f"{DSPARK}+team-envs"
    assert set(json.loads(labels[f"{LABEL_PREFIX}.files"])) == {
        "vllm/envs.py", "vllm/logger.py", "vllm/models/deepseek_v4/nvidia/model.py"}


def test_verify_passes_for_the_series_and_fails_for_one_set_alone(series_image, team, tmp_path: Path) -> None:
    _res, tag, _out = series_image
    ok = run("verify", "--image", tag, "--patch", DSPARK, "--patch", "team-envs", "--no-probe",
             "--report-dir", str(tmp_path / "series"), env=team)
    assert ok.returncode == 0, ok.stderr
    named = run("verify", "--image", tag, "--no-probe", "--report-dir", str(tmp_path / "named"), "--json", env=team)
    assert named.returncode == 0, named.stderr   # no set named: the series the labels name, each a known set
    assert any(f"verifying what the image's labels name, {DSPARK} + team-envs" in n for n in named.json["notes"])
    alone = run("verify", "--image", tag, "--patch", DSPARK, "--no-probe", "--report-dir", str(tmp_path / "alone"),
                env=team)
    line = alone.assert_clean_error(1)
    assert f"made from a series ({DSPARK} + team-envs)" in line
    assert "vllm/envs.py" in line


def test_one_set_applied_to_the_series_image_replaces_our_layer(client, series_image, team, tmp_path: Path) -> None:
    """The DSpark set alone on the series image: the result is the source plus one layer (ours
    replaced, not stacked), its labels name the DSpark set alone, and verify passes on it."""
    _res, tag, _out = series_image
    new_tag = f"dspark-patch/test-series:{uuid.uuid4().hex[:10]}"
    try:
        res = run("apply", "--image", tag, "--patch", DSPARK, "--tag", new_tag, "--no-probe",
                  "--report-dir", str(tmp_path / "r"), "--json", env=team)
        assert res.returncode == 0, res.stderr
        assert res.json["status"] == "applied"
        assert res.json["target"]["image"]["id"] == client.images.get(tag).id
        assert any("replaced, not stacked" in n for n in res.json["notes"])
        source = client.images.get(fixture_image()).attrs
        result = client.images.get(new_tag).attrs
        assert result["RootFS"]["Layers"][:-1] == source["RootFS"]["Layers"]
        assert len(result["RootFS"]["Layers"]) == len(source["RootFS"]["Layers"]) + 1
        labels = result["Config"]["Labels"]
        assert labels[f"{LABEL_PREFIX}.patch.id"] == DSPARK and f"{LABEL_PREFIX}.series" not in labels
        theirs = {k: v for k, v in labels.items() if not k.startswith(LABEL_PREFIX)}
        assert theirs == {k: v for k, v in (source["Config"]["Labels"] or {}).items()}
        for field in ("Entrypoint", "Cmd", "Env", "User", "WorkingDir"):
            assert result["Config"].get(field) == source["Config"].get(field)
        ok = run("verify", "--image", new_tag, "--patch", DSPARK, "--no-probe", "--report-dir", str(tmp_path / "v"),
                 env=team)
        assert ok.returncode == 0, ok.stderr
        # the image under our layer was made for the run and is gone again (other sessions make
        # images meanwhile: only this one counts; the note names it)
        note = next(n for n in res.json["notes"] if "replaced, not stacked" in n)
        under = note.split("applied to the image under it (", 1)[1].split(")", 1)[0]
        assert under.startswith("sha256:") and len(under) == 19
        assert not [i.id for i in client.images.list(all=True) if i.id.startswith(under)]
    finally:
        try:
            client.images.remove(new_tag, force=True)
        except docker.errors.ImageNotFound:
            pass


def test_a_layer_on_top_of_ours_is_never_dropped(client, series_image, team, tmp_path: Path) -> None:
    """An image built FROM the series image with a change of its own carries our labels, but its
    top layer is not ours: apply of another set is refused, nothing made or tagged."""
    _res, tag, _out = series_image
    theirs = f"dspark-patch/test-series:{uuid.uuid4().hex[:10]}-theirs"
    user = client.images.get(tag).attrs["Config"].get("User") or "root"
    dockerfile = f"FROM {tag}\nUSER root\nRUN echo ours > /etc/team-marker\nUSER {user}\n".encode()
    client.images.build(fileobj=io.BytesIO(dockerfile), tag=theirs, rm=True, network_mode="none")
    new_tag = f"{theirs}-patched"
    try:
        layers = client.images.get(theirs).attrs["RootFS"]["Layers"]
        res = run("apply", "--image", theirs, "--patch", DSPARK, "--tag", new_tag, "--no-probe",
                  "--report-dir", str(tmp_path / "r"), env=team)
        line = res.assert_clean_error(2)
        assert "beyond the files its dspark-patch labels" in line or "was not made by dspark-patch" in line
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(new_tag)
        # nothing was stacked on it (other runs may make images meanwhile: only ones on this one count)
        assert not [i.id for i in client.images.list(all=True)
                    if i.attrs["RootFS"]["Layers"][:len(layers) - 1] == layers[:-1] and i.attrs["RootFS"]["Layers"] != layers
                    and len(i.attrs["RootFS"]["Layers"]) >= len(layers)]
    finally:
        client.images.remove(theirs, force=True)


def test_the_same_series_again_is_already_applied(series_image, team, tmp_path: Path) -> None:
    _res, tag, _out = series_image
    res = run("apply", "--image", tag, "--patch", DSPARK, "--patch", "team-envs", "--no-probe",
              "--report-dir", str(tmp_path / "r"), "--json", env=team)
    assert res.returncode == 0, res.stderr
    assert res.json["status"] == "already-applied"


def test_status_of_the_series_image_and_its_source(series_image, team) -> None:
    _res, tag, _out = series_image
    res = run("status", "--image", tag, "--image", fixture_image(), "--json", env=team)
    assert res.returncode == 0, res.stderr
    rows = {r["ref"]: r for r in res.json["images"]}
    assert dict(rows[tag]["patch_sets"]) == {DSPARK: "applied", "team-envs": "applied"}
    assert dict(rows[fixture_image()]["patch_sets"]) == {DSPARK: "absent", "team-envs": "absent"}
    assert all(not r["unexplained"] and not r["missing"] and not r["added"] for r in rows.values())


def test_new_makes_the_same_set_from_an_image_edited_in_a_container(client, patched033, tmp_path: Path,
                                                                    tmp_path_factory) -> None:
    """Someone edits the DSpark image in a container and commits it: `new --image` reads the
    committed image (nothing run) and makes the set the same edit of a local tree makes."""
    where = tmp_path_factory.mktemp("edited")
    tree = patched033.copy(where / "tree" / "site-packages")
    edit = team_edit(tree)
    dspark_image = f"dspark-patch/test-series:{uuid.uuid4().hex[:10]}-dspark"
    edited = f"{dspark_image}-edited"
    done = run("apply", "--image", fixture_image(), "--patch", DSPARK, "--tag", dspark_image, "--no-probe",
               "--report-dir", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    site = "/usr/local/lib/python3.11/dist-packages"
    appended = {path: after[len(before or b""):].decode() for path, (before, after) in edit.items() if after is not None}
    code = "".join(f"open({site + '/' + path!r}, 'a').write({text!r})\n" for path, text in appended.items())
    container = client.containers.run(dspark_image, entrypoint=["python3", "-c", code], user="0", detach=True,
                                      network_mode="none")
    try:
        assert container.wait()["StatusCode"] == 0
        container.commit(repository=edited.split(":")[0], tag=edited.split(":")[1])
    finally:
        container.remove(force=True)
    try:
        made = run("new", "team-img", "--image", edited, "--wheel", str(wheel("0.33.0")), "--out", str(tmp_path / "out"),
                   "--json")
        assert made.returncode == 0, made.stderr
        assert made.json["requires"] == [DSPARK]
        assert made.json["files"] == [{"path": "vllm/envs.py", "action": "modify"},
                                      {"path": "vllm/logger.py", "action": "modify"}]
        shown = run("show", str(tmp_path / "out" / "team-img"), "--json")
        files = shown.json["variants"][0]["files"]
        for path, (before, after) in edit.items():
            assert files[path]["pre_sha256"] == hashlib.sha256(before or b"").hexdigest()
            assert files[path]["post_sha256"] == hashlib.sha256(after or b"").hexdigest()
    finally:
        for name in (edited, dspark_image):
            client.images.remove(name, force=True)
