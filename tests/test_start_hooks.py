"""Code the environment loads at start (targets/start_hooks.py), on the engine: small images made
from the official shape with one hook each. status (which reads and never runs) names each on
both routes, and `verify --image` fails naming it, although the image's own python, asked as the
image starts it, may not see it (native code that runs first can hide itself).

The preloaded library need not be a real one: status only reads the config and the file, and
the dynamic loader skips a file it cannot load (with a message), so the image still starts.
The registry routes (status and verify `--via registry`, publish) read the same images pushed to
a loopback registry, with no engine: publish of an honest in-image job's layer onto the image
with the warnings hook refuses (exit 1), and no tag is written.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.cli import run
from tests.support.images import official_variants
from tests.support.registry import login_registry_in, push_only_to_registry
from tests.support.tool_folder import tool_folder
from tests.test_in_image import APPLY, _job

pytestmark = pytest.mark.engine

# name: (Dockerfile lines after FROM, as root; what the finding says)
CASES = {
    "warnings-category": (["RUN mkdir -p /opt/h && echo 'class W(Warning): pass' > /opt/h/hook.py",
                           "ENV PYTHONWARNINGS=ignore::hook.W PYTHONPATH=/opt/h"],
                          "Env PYTHONWARNINGS='ignore::hook.W': its warning category imports module hook"),
    "ld-preload": (["RUN touch /opt/x.so", "ENV LD_PRELOAD=/opt/x.so"], "Env LD_PRELOAD='/opt/x.so'"),
    # last: from here on every program in the image, the build's own included, preloads it
    "ld-so-preload-file": (["RUN echo /opt/x.so > /etc/ld.so.preload"], "/etc/ld.so.preload: names '/opt/x.so'"),
}


@pytest.fixture(scope="module")
def images():
    with official_variants({case: lines for case, (lines, _) in CASES.items()}, "start-hooks") as made:
        yield made


def test_both_status_routes_name_each_hook(images: dict[str, str]) -> None:
    res = run("status", *(a for tag in images.values() for a in ("--image", tag)), "--pull", "never", "--via", "layers",
              "--json")
    assert res.returncode == 1, res.stdout[-3000:]
    rows = {row["ref"]: row for row in res.json["images"]}
    for name, tag in images.items():
        assert rows[tag]["exit_code"] == 1 and CASES[name][1] in (rows[tag]["error"] or ""), (name, rows[tag])
        res = run("status", "--image", tag, "--pull", "never", "--via", "container", "--json")
        row = res.json["images"][0]
        assert res.returncode == 1 and CASES[name][1] in (row["error"] or ""), (name, row)


@pytest.mark.parametrize("name", sorted(CASES))
def test_verify_of_the_image_fails_naming_the_hook(name: str, images: dict[str, str], tmp_path: Path) -> None:
    res = run("verify", "--image", images[name], "--pull", "never", "--no-probe", "--report-dir", str(tmp_path))
    assert res.returncode == 1, (res.stdout[-2000:], res.stderr[-2000:])
    assert CASES[name][1] in res.stderr, res.stderr[-2000:]


USER, PASSWORD = "hooks", "s3cret-for-hooks"
NO_ENGINE = "tcp://127.0.0.1:9"


@pytest.fixture(scope="module")
def login_registry(tmp_path_factory: pytest.TempPathFactory):
    with login_registry_in(tmp_path_factory.mktemp("hooks-registry"), USER, PASSWORD) as reg:
        yield reg


def test_the_registry_routes_and_publish_name_each_hook(images: dict[str, str], login_registry, tmp_path: Path,
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    address, config, _ = login_registry
    env = {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(config), "DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    pushed = {}
    for name, tag in images.items():
        pushed[name] = f"{address}/hooks/{name}:1"
        push_only_to_registry(tag, pushed[name], config)
        status = run("status", "--via", "registry", "--image", pushed[name], "--json", env=env)
        row = status.json["images"][0]
        assert status.returncode == 1 and CASES[name][1] in (row["error"] or ""), (name, row)
        verify = run("verify", "--image", pushed[name], "--via", "registry", "--report-dir", str(tmp_path / name), env=env)
        assert verify.returncode == 1 and CASES[name][1] in verify.stderr, (name, verify.stderr[-2000:])

    # The job, in the image itself, as the CI path runs it; publish derives and refuses.
    tool = tool_folder(tmp_path_factory.mktemp("tool") / "dspark-patch")
    out = tmp_path / "job"
    done = _job(tool, out, APPLY, user="0", image=images["warnings-category"])
    assert done.returncode == 0, done.stderr[-3000:]
    dest = f"{address}/hooks/served:1-dspark"
    res = run("publish", "--image", pushed["warnings-category"], "--layer", str(out / "layer.tar"),
              "--report", str(out / "r/audit.json"), "--tag", dest, env=env)
    assert res.returncode == 1 and CASES["warnings-category"][1] in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    listed = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--authfile",
                             str(config / "config.json"), f"docker://{dest}"], capture_output=True, check=False)
    assert listed.returncode != 0   # nothing tagged
