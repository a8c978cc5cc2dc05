"""Issue 10: image shapes other than the fixture's, images that live behind a registry login,
and engines other than the local dockerd (Podman's compatible API, a remote dockerd over TCP).

Each combination runs the CLI the way a user does: `apply --image REF --tag T`, then
`verify --image T`, on the engine DOCKER_HOST names, and asserts which interpreter and site
folder were patched where an image has more than one to choose from.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from dspark_patch.targets.docker import CONFIG_FIELDS
from tests.support import images
from tests.support.cli import run
from tests.support.registry import login_registry_in, push_only_to_registry, put_image

LABEL_PREFIX = "io.github.dspark-patch"

pytestmark = pytest.mark.engine


def _inspect(docker_host: str | None, ref: str) -> dict | None:
    argv = ["docker", *(["--host", docker_host] if docker_host else []), "image", "inspect", ref]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return json.loads(done.stdout)[0] if done.returncode == 0 else None


def _remove(docker_host: str | None, ref: str) -> None:
    argv = ["docker", *(["--host", docker_host] if docker_host else []), "rmi", "--force", ref]
    subprocess.run(argv, capture_output=True, check=False)


def _our_containers(docker_host: str | None, image_id: str) -> list[str]:
    """The tool's containers made from `image_id` (other sessions may share the local engine,
    each on its own images, so only this image's containers are ours to count)."""
    argv = ["docker", *(["--host", docker_host] if docker_host else []), "ps", "-a",
            "--filter", f"ancestor={image_id}", "--format", "{{.Names}}"]
    names = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    return [n for n in names if n.startswith("dspark-patch--")]


def _assert_patched_result(docker_host: str | None, source: dict, tag: str, *, count_containers: bool = True) -> None:
    """What a user checks on a result: same config, one more layer, our labels, nothing left behind.

    `count_containers=False` where the source is the fixture's own image id under another name
    (other sessions run containers of it at any time)."""
    after = _inspect(docker_host, tag)
    assert after is not None, f"{tag} was not tagged"
    for field in CONFIG_FIELDS:
        if field != "Labels":
            assert after["Config"].get(field) == source["Config"].get(field), field
    assert after["RootFS"]["Layers"][:-1] == source["RootFS"]["Layers"]
    assert len(after["RootFS"]["Layers"]) == len(source["RootFS"]["Layers"]) + 1
    assert after["Config"]["Labels"][f"{LABEL_PREFIX}.patch.id"] == "dspark-skip-mtp-buffer"
    if count_containers:
        assert _our_containers(docker_host, source["Id"]) == []


def _owners(docker_host: str | None, image: str) -> str:
    """uid:gid of the patched files in `image`, as its own python (run as root) sees them."""
    site = "/usr/local/lib/python3.11/dist-packages/vllm/"
    code = (f"import os\nfor f in ('{site}envs.py', '{site}models/deepseek_v4/nvidia/model.py'):\n"
            "    print(f'{os.stat(f).st_uid}:{os.stat(f).st_gid}', end=' ')")
    host = ["-H", docker_host] if docker_host else []
    done = subprocess.run(["docker", *host, "run", "--rm", "--network", "none", "--user", "0", "--entrypoint",
                           "python3", image, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-1000:]
    return done.stdout.strip()


def _apply_and_verify(ref: str, tmp_path: Path, docker_host: str | None = None, *, tag: str | None = None,
                      push: bool = False, env: dict[str, str] | None = None, owners: bool = False) -> dict:
    """apply --image REF --tag T [--push], check the result, verify T; returns apply's audit."""
    env = {**(env or {}), **({"DOCKER_HOST": docker_host} if docker_host else {})}
    source = _inspect(docker_host, ref)
    assert source is not None, f"{ref} is not on the engine"
    tag = tag or f"dspark-patch/test-shape:{uuid.uuid4().hex[:10]}"
    try:
        res = run("apply", "--image", ref, "--tag", tag, *(["--push"] if push else []),
                  "--report-dir", str(tmp_path / "apply"), env=env)
        assert res.returncode == 0, res.stderr
        _assert_patched_result(docker_host, source, tag)
        if owners:   # Podman's archive API maps owners to the container's user: the files stay the source's
            assert _owners(docker_host, tag) == _owners(docker_host, ref)
        ok = run("verify", "--image", tag, "--json", "--report-dir", str(tmp_path / "verify"), env=env)
        assert ok.returncode == 0, ok.stderr
        assert ok.json["status"] == "verified"
        # The source is untouched.
        assert _inspect(docker_host, ref)["Id"] == source["Id"]
        return json.loads((tmp_path / "apply" / "audit.json").read_text())
    finally:
        _remove(docker_host, tag)


# --- image shapes on the local engine ---------------------------------------------------------

def test_the_no_shell_image_really_has_no_shell():
    """Guards the shape itself: if a shell crept back, the no-shell tests would prove nothing."""
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", images.no_shell_image(), "-c", "true"],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode != 0 and "/bin/sh" in done.stderr


def test_no_shell_image_applies_and_verifies(tmp_path):
    _apply_and_verify(images.no_shell_image(), tmp_path)


def test_non_writable_image_applies_as_root_keeping_owner_mode_and_user(tmp_path):
    ref = images.non_writable_image()
    tag = f"dspark-patch/test-shape:{uuid.uuid4().hex[:10]}"
    try:
        res = run("apply", "--image", ref, "--tag", tag, "--report-dir", str(tmp_path / "r"))
        assert res.returncode == 0, res.stderr
        result = _inspect(None, tag)
        assert result["Config"]["User"] == "10001:0"
        # Owner and mode of the patched files and their bytecode are those of the tree around them.
        listing = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", tag, "-c",
             "import os, pathlib\n"
             "root = pathlib.Path('/usr/local/lib/python3.11/dist-packages/vllm')\n"
             "for rel in ('envs.py', '__pycache__/envs.cpython-311.pyc', 'models/deepseek_v4/nvidia/model.py'):\n"
             "    st = (root / rel).stat(); print(rel, st.st_uid, st.st_gid, oct(st.st_mode & 0o7777), os.access(root / rel, os.W_OK))"],
            capture_output=True, text=True, check=True,
        ).stdout.splitlines()
        assert [line.split()[1:] for line in listing] == [["0", "0", "0o644", "False"]] * 3
    finally:
        _remove(None, tag)


def _where(audit: dict) -> tuple[str, str]:
    return audit["target"]["python"], audit["target"]["distribution"]["location"]


def test_two_pythons_image_patches_the_vllm_of_the_non_default_python(tmp_path):
    audit = _apply_and_verify(images.two_pythons_image(), tmp_path)
    # not python3 on PATH (which has no vLLM): the environment's own interpreter and folder
    assert _where(audit) == ("/opt/vllm-env/bin/python3", "/opt/vllm-env/lib/python3.11/site-packages")


def test_trixie_root_image_with_vllm_in_a_venv_off_path(tmp_path):
    audit = _apply_and_verify(images.trixie_venv_image(), tmp_path)
    # the venv the entrypoint's `#!` names, off PATH, with Debian's python 3.13
    assert _where(audit) == ("/opt/venv/bin/python3", "/opt/venv/lib/python3.13/site-packages")


# Two environments on one image, built on the fixture (whose vLLM is in the system
# dist-packages of /usr/bin/python3) with a venv first on PATH:
# - `same`: a venv with --system-site-packages sees the system's vLLM: one installation seen by
#   two interpreters, not a choice to make;
# - `two`: a venv of its own holding a second vLLM distribution (its dist-info and package):
#   two installations, and only the user can say which one to patch.
SECOND_VLLM = (
    "import os, shutil\n"
    "src, dst = '/usr/local/lib/python3.11/dist-packages', '/opt/venv2/lib/python3.11/site-packages'\n"
    "shutil.copytree(f'{src}/vllm-0.33.0.dist-info', f'{dst}/vllm-0.33.0.dist-info')\n"
    "os.makedirs(f'{dst}/vllm')\n"
    "open(f'{dst}/vllm/__init__.py', 'w').close()\n"
)
TWO_ENVS = {
    "same": ['RUN ["python3", "-m", "venv", "--without-pip", "--system-site-packages", "/opt/venv2"]'],
    "two": ['RUN ["python3", "-m", "venv", "--without-pip", "/opt/venv2"]',
            f"RUN {json.dumps(['python3', '-c', SECOND_VLLM])}"],
}


@pytest.fixture(scope="module")
def two_envs():
    """name -> ref of the `same` and `two` images (built here, removed afterwards)."""
    fixture_id = _inspect(None, images.fixture_image())["Id"]
    refs = {}
    try:
        for name, steps in TWO_ENVS.items():
            ref = f"dspark-patch/test-two-envs:{name}-{uuid.uuid4().hex[:8]}"
            dockerfile = "\n".join([f"FROM {fixture_id}", "USER root", *steps,
                                    "ENV PATH=/opt/venv2/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                    "USER vllm", ""])
            subprocess.run(["docker", "build", "--network", "none", "-q", "-t", ref, "-"], input=dockerfile,
                           text=True, capture_output=True, check=True)
            refs[name] = ref
        yield refs
    finally:
        for ref in refs.values():
            _remove(None, ref)


def test_a_venv_that_sees_the_system_vllm_is_not_a_second_installation(two_envs, tmp_path):
    res = run("apply", "--image", two_envs["same"], "--dry-run", "--json", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    assert res.json["target"]["distribution"]["location"] == "/usr/local/lib/python3.11/dist-packages"


def test_two_environments_holding_vllm_are_refused_naming_both(two_envs, tmp_path):
    ref = two_envs["two"]
    tag = f"dspark-patch/test-shape:{uuid.uuid4().hex[:10]}"
    res = run("apply", "--image", ref, "--tag", tag, "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(2)
    assert "/opt/venv2/bin/python3" in line and "/usr/bin/python3" in line
    assert "/opt/venv2/lib/python3.11/site-packages" in line and "/usr/local/lib/python3.11/dist-packages" in line
    assert "--python PATH" in line
    assert _inspect(None, tag) is None
    assert _our_containers(None, _inspect(None, ref)["Id"]) == []


def test_python_chooses_the_environment_in_an_image(two_envs, tmp_path):
    res = run("apply", "--image", two_envs["two"], "--python", "/usr/bin/python3", "--dry-run", "--json",
              "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    assert res.json["target"]["python"] == "/usr/bin/python3"
    assert res.json["target"]["distribution"]["location"] == "/usr/local/lib/python3.11/dist-packages"
    absent = run("apply", "--image", two_envs["two"], "--python", "/opt/nowhere/bin/python3", "--dry-run",
                 "--report-dir", str(tmp_path / "r2"))
    assert "/opt/nowhere/bin/python3" in absent.assert_clean_error(2)
    assert _our_containers(None, _inspect(None, two_envs["two"])["Id"]) == []


# --- a registry behind a login ----------------------------------------------------------------

USER, PASSWORD = "dspark", "s3cret-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def login_registry(tmp_path_factory):
    """A loopback registry asking for a login, and a DOCKER_CONFIG folder holding that login."""
    with login_registry_in(tmp_path_factory.mktemp("login-registry"), USER, PASSWORD) as reg:
        # A team's registry holds the source image beside the patched ones pushed here (the
        # engine then pushes only the new layer, as it would there).
        put_image(images.fixture_image(), f"{reg.address}/dspark-patch/patched:source")
        yield reg.address, reg.config


@pytest.fixture(scope="module")
def registry_only_fixture(login_registry):
    """The fixture pushed to the login registry and dropped from the local names: using it needs a pull."""
    address, config = login_registry
    ref = f"{address}/dspark-patch/vllm-fixture:0.33.0"
    push_only_to_registry(images.fixture_image(), ref, config)
    return ref


def _manifest_status(address: str, digest_ref: str, login: tuple[str, str] | None) -> int:
    repository, _, digest = digest_ref.removeprefix(address + "/").partition("@")
    request = urllib.request.Request(
        f"http://{address}/v2/{repository}/manifests/{digest}", method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json, "
                           "application/vnd.oci.image.manifest.v1+json"},
    )
    if login is not None:
        token = base64.b64encode(":".join(login).encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_push_to_a_registry_behind_a_login_uses_the_docker_config(login_registry, tmp_path):
    address, config = login_registry
    tag = f"{address}/dspark-patch/patched:{uuid.uuid4().hex[:8]}"
    try:
        res = run("apply", "--image", images.fixture_image(), "--tag", tag, "--push",
                  "--report-dir", str(tmp_path / "r"), env={"DOCKER_CONFIG": str(config)})
        assert res.returncode == 0, res.stderr
        pushed = json.loads((tmp_path / "r" / "audit.json").read_text())["result_image"]["repo_digest"]
        assert pushed.startswith(f"{address}/dspark-patch/patched@sha256:")
        # The registry holds it: its manifest answers for the pushed digest, behind the login.
        assert _manifest_status(address, pushed, (USER, PASSWORD)) == 200
        assert _manifest_status(address, pushed, None) == 401
    finally:
        _remove(None, tag)


def _images_named(address: str) -> set[str]:
    """Local names under the loopback registry (what a run could leave behind there)."""
    done = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", f"{address}/*/*"],
                          capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_registry_only_image_is_pulled_with_the_login_patched_and_pushed(registry_only_fixture, login_registry, tmp_path):
    address, config = login_registry
    tag = f"{address}/dspark-patch/patched:{uuid.uuid4().hex[:8]}"
    assert _inspect(None, registry_only_fixture) is None  # only the registry has it
    try:
        res = run("apply", "--image", registry_only_fixture, "--pull", "missing", "--tag", tag, "--push",
                  "--report-dir", str(tmp_path / "r"), env={"DOCKER_CONFIG": str(config)})
        assert res.returncode == 0, res.stderr
        # Without a terminal the pull shows one line per step (CI logs), on stderr.
        assert f"pull {registry_only_fixture}:" in res.stderr
        audit = json.loads((tmp_path / "r" / "audit.json").read_text())
        assert any(f"pulled {registry_only_fixture}" in note for note in audit["notes"])
        pushed = audit["result_image"]["repo_digest"]
        assert _manifest_status(address, pushed, (USER, PASSWORD)) == 200
        source = _inspect(None, registry_only_fixture)
        assert source is not None
        _assert_patched_result(None, source, tag, count_containers=False)
    finally:
        _remove(None, tag)
        _remove(None, registry_only_fixture)


def test_a_source_pinned_by_digest_is_pulled_and_its_commit_stays_untagged(login_registry, tmp_path):
    address, config = login_registry
    pinned = push_only_to_registry(images.fixture_image(), f"{address}/dspark-patch/pinned:{uuid.uuid4().hex[:8]}", config)
    assert "@sha256:" in pinned
    result = None
    try:
        res = run("apply", "--image", pinned, "--pull", "always", "--json", "--report-dir", str(tmp_path / "r"),
                  env={"DOCKER_CONFIG": str(config)})
        assert res.returncode == 0, res.stderr
        result = res.json["result_image"]
        assert result["ref"] == result["id"]  # no --tag: the new image has no name
        assert res.json["target"]["image"]["id"] == _inspect(None, images.fixture_image())["Id"]
        assert _inspect(None, result["id"])["RepoTags"] == []
    finally:
        if result is not None:
            _remove(None, result["id"])
        subprocess.run(["docker", "rmi", pinned], capture_output=True, check=False)  # the digest name only


def test_a_pull_with_a_wrong_password_is_one_line_naming_the_login(login_registry, tmp_path):
    address, _ = login_registry
    wrong = _wrong_login_config(tmp_path / "wrong-config", address)
    before = _images_named(address)
    res = run("apply", "--image", f"{address}/dspark-patch/vllm-fixture:0.33.0", "--pull", "always",
              "--tag", "dspark-patch/never:made", "--report-dir", str(tmp_path / "r"),
              env={"DOCKER_CONFIG": str(wrong)})
    line = res.assert_clean_error(3)  # a refused login is an environment problem
    assert f"the registry {address} refused the credentials for it in {wrong / 'config.json'}" in line
    assert f"docker login {address}" in line
    assert _inspect(None, "dspark-patch/never:made") is None
    assert _images_named(address) == before


def _wrong_login_config(folder: Path, address: str) -> Path:
    folder.mkdir()
    auth = base64.b64encode(f"{USER}:not-the-password".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {address: {"auth": auth}}}))
    return folder


def test_a_push_with_a_wrong_password_is_one_line_naming_the_login_and_leaves_no_tag(login_registry, tmp_path):
    address, _ = login_registry
    tag = f"{address}/dspark-patch/wrong-login:{uuid.uuid4().hex[:8]}"
    wrong = _wrong_login_config(tmp_path / "wrong-config", address)
    try:
        res = run("apply", "--image", images.fixture_image(), "--tag", tag, "--push",
                  "--report-dir", str(tmp_path / "r"), env={"DOCKER_CONFIG": str(wrong)})
        line = res.assert_clean_error(3)
        assert f"the registry {address} refused the credentials" in line and f"docker login {address}" in line
        assert _inspect(None, tag) is None
        audit = json.loads((tmp_path / "r" / "audit.json").read_text())
        assert audit["result_image"] is None
        # The committed image went with its only name.
        gone = next(n for n in audit["notes"] if n.startswith(f"the push failed, so the tag {tag} was removed"))
        committed = re.search(r"the image (sha256:[0-9a-f]{64}) went with it", gone)
        assert committed is not None, gone
        assert _inspect(None, committed.group(1)) is None
    finally:
        _remove(None, tag)


def test_pull_never_on_an_image_missing_locally_is_one_clean_line(login_registry, tmp_path):
    """--pull never must not reach out: a loopback-registry name the engine lacks is exit 2."""
    address, config = login_registry
    missing = f"{address}/dspark-patch/absent:{uuid.uuid4().hex[:8]}"
    res = run("apply", "--image", missing, "--pull", "never", "--tag", "dspark-patch/never:made",
              "--report-dir", str(tmp_path / "r"), env={"DOCKER_CONFIG": str(config)})
    line = res.assert_clean_error(2)
    assert missing in line and "not found on the engine" in line
    assert _inspect(None, "dspark-patch/never:made") is None


def test_an_image_neither_local_nor_in_its_registry_is_one_clean_line(login_registry, tmp_path):
    address, config = login_registry
    missing = f"{address}/dspark-patch/absent:{uuid.uuid4().hex[:8]}"
    res = run("verify", "--image", missing, "--report-dir", str(tmp_path / "r"), env={"DOCKER_CONFIG": str(config)})
    line = res.assert_clean_error(2)
    assert missing in line and f"nor in its registry {address}" in line
    assert _inspect(None, missing) is None


# --- engines other than the local dockerd -----------------------------------------------------

def test_fixture_applies_verifies_and_pushes_on_another_engine(fixture_on_other_engine, login_registry, tmp_path):
    """Podman writes /etc/hosts, resolv.conf and hostname into its containers and ignores a
    commit's config: the result must still be the source's config plus exactly our layer."""
    other, ref = fixture_on_other_engine
    address, config = login_registry
    # As in a team's registry, the repository already holds the source: the engine, which pulled
    # it, pushes only the patched layer.
    put_image(ref, f"{address}/dspark-patch/{other.name}:source")
    tag = f"{address}/dspark-patch/{other.name}:{uuid.uuid4().hex[:8]}"
    audit = _apply_and_verify(ref, tmp_path, other.docker_host, tag=tag, push=True,
                              env={"DOCKER_CONFIG": str(config)}, owners=True)
    pushed = audit["result_image"]["repo_digest"]
    assert pushed.startswith(f"{address}/dspark-patch/{other.name}@sha256:")
    assert _manifest_status(address, pushed, (USER, PASSWORD)) == 200
