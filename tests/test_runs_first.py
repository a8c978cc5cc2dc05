"""Images that run other code before the vLLM the tool checked (targets/runtime.py), on the engine.

Each image is the official shape (images/vllm-official: vLLM in dist-packages, USER 2000, `vllm
serve`) with one change a user or an attacker could make, all of which the image's own start
honours: a `vllm.py` in the USER's site folder or beside the `vllm` console script, `python -m`
with a `vllm/` in the working dir, `PYTHONPATH` (relative and absolute) and `PYTHONHOME` in the
Env, Debian's sitecustomize rewritten, an `apport_python_hook` it would import, the
`_distutils_hack` that setuptools' `.pth` imports rewritten or shadowed, and an entrypoint the
tool does not model (a shell with a command, a shell script), named as not verified. Before the rule,
each read `absent` with exit 0 (nothing said what runs). Now both status routes exit non-zero
naming it, `verify` fails naming it, and `apply` refuses with one line, exit 1, nothing tagged.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import docker
import pytest

from tests.support.cli import run
from tests.support.containers import left_by
from tests.support.images import official_variants

pytestmark = pytest.mark.engine

SITE = "/usr/local/lib/python3.11/dist-packages"
# name: (Dockerfile lines after FROM, as root; the path the finding names)
CASES = {
    "user-site": (["RUN mkdir -p /home/vllm/.local/lib/python3.11/site-packages "
                   "&& echo 'print(1)' > /home/vllm/.local/lib/python3.11/site-packages/vllm.py"],
                  "/home/vllm/.local/lib/python3.11/site-packages/vllm.py"),
    "script-folder": (["RUN echo 'print(1)' > /usr/local/bin/vllm.py"], "/usr/local/bin/vllm.py"),
    "workdir-with-m": (['ENTRYPOINT ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]',
                        "RUN mkdir -p /vllm-workspace/vllm && touch /vllm-workspace/vllm/__init__.py"],
                       "/vllm-workspace/vllm/__init__.py"),
    "relative-pythonpath": (["ENV PYTHONPATH=lib", "RUN mkdir -p /vllm-workspace/lib && touch /vllm-workspace/lib/vllm.py"],
                            "/vllm-workspace/lib/vllm.py"),
    "absolute-pythonpath": (["ENV PYTHONPATH=/opt/shadow", "RUN mkdir -p /opt/shadow && touch /opt/shadow/vllm.py"],
                            "/opt/shadow/vllm.py"),
    # status takes the package for the vLLM the image runs and finds no dist-info beside it (exit 1)
    "package-on-pythonpath": (["ENV PYTHONPATH=/opt/pkg", "RUN mkdir -p /opt/pkg/vllm && touch /opt/pkg/vllm/__init__.py"],
                              "/opt/pkg/vllm"),
    "pythonhome": (["ENV PYTHONHOME=/usr"], "PYTHONHOME=/usr"),
    "debian-sitecustomize": (["RUN echo 'import os' >> /etc/python3.11/sitecustomize.py"],
                             "/usr/lib/python3.11/sitecustomize.py"),
    "apport-hook": ([f"RUN echo 'def install(): pass' > {SITE}/apport_python_hook.py"],
                    f"{SITE}/apport_python_hook.py"),
    # setuptools' distutils-precedence.pth imports the first _distutils_hack on sys.path at start
    "distutils-hack-rewritten": ([f"RUN echo 'import os' >> {SITE}/_distutils_hack/__init__.py"],
                                 "_distutils_hack/__init__.py"),
    "distutils-hack-in-script-folder": (["RUN echo 'def add_shim(): pass' > /usr/local/bin/_distutils_hack.py"],
                                        "/usr/local/bin/_distutils_hack.py"),
    # what the tool cannot model is named "not verified", never read as clean
    "shell-entrypoint": (['ENTRYPOINT ["/bin/sh", "-c", "cd /tmp && exec vllm serve \\"$@\\"", "--"]'],
                         "is not verified"),
    "script-entrypoint": (["RUN printf '#!/bin/sh\\nexport PYTHONPATH=/opt/x\\nexec vllm serve\\n' > /start.sh "
                           "&& chmod 755 /start.sh", 'ENTRYPOINT ["/start.sh"]'],
                          "is not verified"),
    "usercustomize-in-user-site": (["RUN mkdir -p /home/vllm/.local/lib/python3.11/site-packages "
                                    "&& touch /home/vllm/.local/lib/python3.11/site-packages/usercustomize.py"],
                                   "/home/vllm/.local/lib/python3.11/site-packages/usercustomize.py"),
}
# A `.pth` in another site folder of the interpreter that imports a module there, and one that
# installs an import finder ahead of the site folders: verify and apply name what the image's
# own python, started as the image starts it, ran; status names the `.pth`.
OTHER_SITE = "/usr/lib/python3/dist-packages"
STARTED_CASES = {
    "pth-in-another-site-folder": ([f"RUN mkdir -p {OTHER_SITE} && echo 'import zz_hook' > {OTHER_SITE}/zz-hook.pth "
                                    f"&& echo 'X = 1' > {OTHER_SITE}/zz_hook.py"],
                                   f"{OTHER_SITE}/zz_hook.py"),
    "finder-installed-at-start": ([f"RUN mkdir -p {OTHER_SITE} && echo \"import sys; sys.meta_path.insert(0, type("
                                   f"'Redirect', (), {{'find_spec': staticmethod(lambda *a: None)}})())\" "
                                   f"> {OTHER_SITE}/zz-finder.pth"],
                                  "Redirect: an import finder installed at start"),
}
# What status, which runs nothing, names for those: the .pth itself (runtime.py `pth_first`).
STATUS_NAMES = {"pth-in-another-site-folder": f"{OTHER_SITE}/zz-hook.pth: runs `import zz_hook`",
                "finder-installed-at-start": f"{OTHER_SITE}/zz-finder.pth: runs `import sys; sys.meta_path"}


@pytest.fixture(scope="module")
def images():
    with official_variants({case: lines for case, (lines, _) in {**CASES, **STARTED_CASES}.items()}, "runs-first") as made:
        yield made


def test_both_status_routes_name_what_runs_first(images: dict[str, str]) -> None:
    res = run("status", *(a for tag in images.values() for a in ("--image", tag)), "--pull", "never", "--via", "layers",
              "--json")
    assert res.returncode == 1, res.stdout[-3000:]
    rows = {row["ref"]: row for row in res.json["images"]}
    named = {**{name: path for name, (_, path) in CASES.items()}, **STATUS_NAMES}
    for name, tag in images.items():
        row = rows[tag]
        assert row["exit_code"] == 1 and _named(named[name], row), (name, row)
        res = run("status", "--image", tag, "--pull", "never", "--via", "container", "--json")
        assert res.returncode == 1, (name, res.stdout[-2000:])
        assert _named(named[name], res.json["images"][0]), (name, res.json["images"][0])


def _named(path: str, row: dict) -> bool:
    """The row names `path`: as what runs first (its error), or, inside the site folder, as added."""
    return path in (row["error"] or "") or path in row["added"]


@pytest.mark.parametrize("name", sorted({**CASES, **STARTED_CASES}))
def test_verify_fails_and_apply_refuses(name: str, images: dict[str, str], tmp_path: Path) -> None:
    tag = images[name]
    named = {**CASES, **STARTED_CASES}[name][1]
    res = run("verify", "--image", tag, "--pull", "never", "--no-probe", "--report-dir", str(tmp_path / "verify"))
    assert res.returncode == 1, (res.stdout[-2000:], res.stderr[-2000:])
    assert named in res.stderr

    client = docker.from_env()
    result = f"dspark-patch/test-result:runs-first-{uuid.uuid4().hex[:8]}"
    res = run("apply", "--image", tag, "--pull", "never", "--tag", result, "--report-dir", str(tmp_path / "apply"))
    line = res.assert_clean_error(1)
    # What runs first is asked beside the write (off the critical path) and refused on before
    # anything is committed; a rewritten _distutils_hack in the site folder is refused earlier,
    # by the base check, as a file the published wheel does not have (before the write).
    assert named in line and ("nothing was committed" in line or "nothing was written" in line)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(result)
    assert left_by(client, res) == []
