"""Files the tool is handed are read as hostile (fast tier): an audit.json, a status shard, a key,
an --images-from list may come from an image's own job or a fork's pull request. Each is read
through ownfiles (no link followed, a size cap, JSON nesting capped before the decoder recurses):
a hostile one is one line and exit 2, never a traceback, never read without end.

publish reads its reports before it asks any registry: the registry here (a closed loopback port)
is never reached, so the refusal is the report's, and nothing can have been tagged.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from dspark_patch import ownfiles
from dspark_patch.errors import BadInput
from tests.support.cli import run

DEEP = b"[" * 200_000 + b"]" * 200_000


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _publish(report: Path, layer: Path) -> list[str]:
    host = f"127.0.0.1:{_closed_port()}"
    return ["publish", "--image", f"{host}/team/vllm:1", "--layer", str(layer), "--report", str(report),
            "--tag", f"{host}/team/vllm:1-patched"]


def _one_clean_line(result, *, says: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.stderr


@pytest.fixture
def deep_report(tmp_path: Path) -> Path:
    path = tmp_path / "audit.json"
    path.write_bytes(DEEP)
    return path


@pytest.fixture
def zero_link(tmp_path: Path) -> Path:
    path = tmp_path / "linked" / "audit.json"
    path.parent.mkdir()
    path.symlink_to("/dev/zero")
    return path


def test_a_report_nested_200000_deep_is_one_line_for_render_and_publish(deep_report: Path, tmp_path: Path) -> None:
    _one_clean_line(run("report", "render", str(deep_report), "--format", "md"), says="nested more than 64")
    layer = tmp_path / "layer.tar"
    layer.write_bytes(b"\0" * 1024)
    _one_clean_line(run(*_publish(deep_report, layer)), says="nested more than 64")


def test_a_report_that_links_to_dev_zero_is_refused_at_once(zero_link: Path, tmp_path: Path) -> None:
    layer = tmp_path / "layer.tar"
    layer.write_bytes(b"\0" * 1024)
    for args in (("report", "render", str(zero_link), "--format", "md"), _publish(zero_link, layer)):
        # promptly: a run still reading /dev/zero after a minute raises TimeoutExpired here
        _one_clean_line(run(*args, timeout=60), says="is a symbolic link")


def test_a_shard_nested_deep_or_linked_is_one_line_for_merge(deep_report: Path, zero_link: Path) -> None:
    _one_clean_line(run("report", "merge", str(deep_report)), says="nested more than 64")
    _one_clean_line(run("report", "merge", str(zero_link)), says="is a symbolic link")


def test_the_reader_counts_depth_without_recursing_and_skips_strings() -> None:
    assert ownfiles.json_depth(b'{"a": "[[[[[[", "b": ["\\"[[", {"c": []}]}') == 4
    assert ownfiles.json_depth(DEEP) == ownfiles.JSON_DEPTH + 1   # stops counting past the cap
    with pytest.raises(BadInput, match="nested more than 64 levels"):
        ownfiles.loads_json(DEEP, what="audit.json")
    assert ownfiles.loads_json(b"[" * 64 + b"]" * 64, what="x") is not None


def test_a_fifo_or_oversized_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "audit.json"
    os.mkfifo(fifo)
    with pytest.raises(BadInput, match="not a regular file"):
        ownfiles.read_json(fifo, limit=1 << 20, what="report")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(BadInput, match="more than the 1024 allowed"):
        ownfiles.read_json(big, limit=1024, what="report")


def test_a_key_that_is_a_link_is_refused(tmp_path: Path) -> None:
    from dspark_patch.attest.dsse import load_signer

    (tmp_path / "key.pem").symlink_to("/dev/zero")
    with pytest.raises(BadInput, match="is a symbolic link"):
        load_signer(tmp_path / "key.pem", allow_open=False)


def test_a_census_in_a_patch_set_is_read_bounded(tmp_path: Path) -> None:
    from dspark_patch.errors import InvalidPatchSet
    from dspark_patch.pipeline.port import load_census

    assert load_census(tmp_path / "absent.json") is None
    (tmp_path / "linked.json").symlink_to("/dev/zero")
    with pytest.raises(InvalidPatchSet, match="is a symbolic link"):
        load_census(tmp_path / "linked.json")
    (tmp_path / "deep.json").write_bytes(DEEP)
    with pytest.raises(InvalidPatchSet, match="nested more than 64"):
        load_census(tmp_path / "deep.json")
