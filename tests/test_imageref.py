"""ImageRef.parse: Docker's reference grammar and default-registry rules (fast tier).

(No argument is called `registry`: that is the loopback registry's fixture name, tests/support/tiers.py.)"""

from __future__ import annotations

import pytest

from dspark_patch.errors import BadInput
from dspark_patch.imageref import ImageRef

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("text", "host", "repository", "tag", "digest"), [
    ("ubuntu", None, "ubuntu", None, None),
    ("ubuntu:24.04", None, "ubuntu", "24.04", None),
    ("vllm/vllm-openai:v0.33.0", None, "vllm/vllm-openai", "v0.33.0", None),
    # a port is not a tag; the tag is after the last slash
    ("127.0.0.1:5000/dspark/vllm", "127.0.0.1:5000", "dspark/vllm", None, None),
    ("127.0.0.1:5000/dspark/vllm:1.0", "127.0.0.1:5000", "dspark/vllm", "1.0", None),
    (f"127.0.0.1:5000/dspark/vllm@{DIGEST}", "127.0.0.1:5000", "dspark/vllm", None, DIGEST),
    (f"127.0.0.1:5000/dspark/vllm:1.0@{DIGEST}", "127.0.0.1:5000", "dspark/vllm", "1.0", DIGEST),
    # localhost without a port, a dotted host, an uppercase first component: each is a registry
    ("localhost/repo", "localhost", "repo", None, None),
    ("localhost:5000/repo:t", "localhost:5000", "repo", "t", None),
    ("registry.example/a/b/c:tag", "registry.example", "a/b/c", "tag", None),
    ("Registry/repo", "Registry", "repo", None, None),
    ("[::1]:5000/repo", "[::1]:5000", "repo", None, None),
    # without a dot, a colon or localhost the first component is a Docker Hub namespace
    ("localhostx/repo", None, "localhostx/repo", None, None),
    # Docker Hub written out is Docker Hub; its library/ namespace is the short name
    ("docker.io/library/ubuntu:24.04", None, "ubuntu", "24.04", None),
    ("index.docker.io/vllm/vllm-openai", None, "vllm/vllm-openai", None, None),
    # odd but valid: separators, a 128-character tag, a tag of uppercase and underscores
    ("a__b/c.d/e-f---g:T_1.x-Y", None, "a__b/c.d/e-f---g", "T_1.x-Y", None),
    ("repo:" + "t" * 128, None, "repo", "t" * 128, None),
    ("repo:_", None, "repo", "_", None),
])
def test_parse_reads_docker_references(text: str, host: str | None, repository: str,
                                       tag: str | None, digest: str | None) -> None:
    ref = ImageRef.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (host, repository, tag, digest)


def test_name_and_str_keep_what_was_written() -> None:
    ref = ImageRef.parse("127.0.0.1:5000/dspark/vllm:1.0")
    assert ref.name == "127.0.0.1:5000/dspark/vllm"
    assert str(ref) == "127.0.0.1:5000/dspark/vllm:1.0"
    assert str(ref.with_digest(DIGEST)) == f"127.0.0.1:5000/dspark/vllm@{DIGEST}"
    assert str(ref.with_tag("1.0-linux-arm64")) == "127.0.0.1:5000/dspark/vllm:1.0-linux-arm64"
    assert ImageRef.parse("vllm/vllm-openai").tag_or_latest == "latest"
    assert ImageRef.parse(f"repo@{DIGEST}").name == "repo"


def test_host_of_is_none_for_hub_names_ids_and_non_references() -> None:
    assert ImageRef.host_of("127.0.0.1:5000/x:1") == "127.0.0.1:5000"
    assert ImageRef.host_of("vllm/vllm-openai:v1") is None
    assert ImageRef.host_of("sha256:" + "0" * 64) is None
    assert ImageRef.host_of("UPPER:tag") is None


@pytest.mark.parametrize(("text", "why"), [
    ("", "empty"),
    ("UPPER", "must be lowercase"),
    ("127.0.0.1:5000/Repo", "must be lowercase"),
    ("repo:", "the tag ''"),
    ("repo:-bad", "the tag '-bad'"),
    ("repo:" + "t" * 129, "the tag"),
    ("repo@sha256:abc", "not ALGORITHM:HEX"),
    ("repo@sha256:" + "a" * 40, "64 hex digits, not 40"),
    ("repo@sha256:" + "a" * 63, "64 hex digits, not 63"),
    ("repo@md5", "not ALGORITHM:HEX"),
    ("a//b", "'' is not a path component"),
    ("a/b/", "'' is not a path component"),
    ("-a/b", "'-a' is not a path component"),
    ("a_-b", "is not a path component"),
    ("host-.example/repo", "is not a registry host"),
    (":tag", "names no repository"),
    ("a" * 256, "longer than 255"),
    ("0" * 64, "is an image id"),
])
def test_parse_refuses_with_one_line(text: str, why: str) -> None:
    with pytest.raises(BadInput) as caught:
        ImageRef.parse(text)
    message = str(caught.value)
    assert why in message
    assert "\n" not in message
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("text", [
    "alice:CANARYpw@127.0.0.1:5000/dspark/vllm:1.0",
    "alice@127.0.0.1:5000/dspark/vllm",
    "https://alice:CANARYpw@127.0.0.1:5000/dspark/vllm:1.0",
    "alice:CANARY@pw@127.0.0.1:5000/dspark/vllm",
    "alice:CANARYpw@127.0.0.1:5000",
])
def test_a_reference_with_a_user_or_password_is_refused_without_repeating_it(text: str) -> None:
    with pytest.raises(BadInput) as caught:
        ImageRef.parse(text)
    line = caught.value.line()
    assert "CANARY" not in line and "alice" not in line and "\n" not in line
    assert caught.value.exit_code == 2
    assert "127.0.0.1:5000" in line   # what it names is still said


def test_the_command_line_refuses_a_password_in_image_or_tag_before_any_work(tmp_path) -> None:
    from tests.support.cli import run

    # No engine is reached (the fast tier points DOCKER_HOST at nothing: that would be exit 3),
    # no report is written, and the password is on no line.
    for args in (["apply", "--image", "alice:CANARYpw@127.0.0.1:5000/x:1"],
                 ["verify", "--image", "alice:CANARYpw@127.0.0.1:5000/x:1"],
                 ["apply", "--image", "127.0.0.1:5000/x:1", "--tag", "alice:CANARYpw@127.0.0.1:5000/x:2"],
                 ["status", "--image", "alice:CANARYpw@127.0.0.1:5000/x:1"]):
        res = run(*args, "--report-dir", str(tmp_path / "r"), env={"DOCKER_HOST": "unix:///nonexistent"})
        line = res.assert_clean_error(2)
        assert "CANARY" not in res.stderr + res.stdout and "***@127.0.0.1:5000/x" in line, args
        assert not (tmp_path / "r").exists()


def test_a_malformed_tag_is_one_line_and_exit_2_before_any_work(tmp_path) -> None:
    from tests.support.cli import run

    res = run("apply", "--image", "127.0.0.1:5000/x:1", "--tag", "repo/UPPER:1", "--report-dir", str(tmp_path / "r"),
              env={"DOCKER_HOST": "unix:///nonexistent"})
    line = res.assert_clean_error(2)
    assert "'repo/UPPER:1' is not an image reference" in line and "lowercase" in line
    assert not (tmp_path / "r").exists()
