"""An image's answers to read-only checks, kept by image id (targets/caches/answers.py):
a second check of one image runs neither locate nor the integrity walk again and says so;
another image (another id) never gets them; a damaged entry is asked again; nothing is kept
once the work container was written into."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from dspark_patch.targets.caches import answers
from dspark_patch.targets.docker import ImageTarget
from tests.support import images
from tests.support.cli import run

SITE = "/usr/local/lib/python3.11/dist-packages"


def _key(image_id: str = "sha256:" + "a" * 64, **over: object) -> str:
    parts: dict = {"image_id": image_id, "engine": "unix:///var/run/docker.sock", "script": "print(1)",
                   "python": "/usr/bin/python3", "args": [{"location": SITE}]}
    return answers.answer_key(**{**parts, **over})


def test_an_answer_is_kept_under_its_whole_key_and_anything_else_is_a_miss(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSPARK_PATCH_CACHE", str(tmp_path / "cache"))
    answer = {"files": {"vllm/__init__.py": ["ab" * 32, 10]}, "pth": {}, "bytecode": {}}
    answers.put(_key(), answer)
    assert answers.get(_key()) == answer
    # every part of the key matters: another image, engine, script, interpreter or request asks again
    for other in ({"image_id": "sha256:" + "b" * 64}, {"engine": "tcp://127.0.0.1:2375"}, {"script": "print(2)"},
                  {"python": "/usr/bin/python3.11"}, {"args": [{"location": "/opt/venv"}]}):
        assert answers.get(_key(**other)) is None, other
    # a torn, foreign or mislabelled entry is a miss, never an error
    (entry,) = (tmp_path / "cache/answers").iterdir()
    for damage in (entry.read_bytes()[:40], b"\x00\xff not json", json.dumps({"key": _key(python="x"), "answer": 1}).encode()):
        entry.write_bytes(damage)
        assert answers.get(_key()) is None


def test_the_kept_answers_are_bounded_and_the_least_recently_used_go(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSPARK_PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(answers, "MAX_ENTRIES", 3)
    keys = [_key(image_id=f"sha256:{i:064x}") for i in range(5)]
    for i, key in enumerate(keys):
        answers.put(key, i)
        entry = tmp_path / "cache/answers" / hashlib.sha256(key.encode()).hexdigest()
        assert answers.get(key) == i
        stamp = 1_000_000 + i
        os.utime(entry, (stamp, stamp))
    assert len(list((tmp_path / "cache/answers").iterdir())) == 3
    assert [answers.get(k) for k in keys] == [None, None, 2, 3, 4]


def _verify(image: str, out: Path, env: dict[str, str]) -> dict:
    res = run("verify", "--image", image, "--pull", "never", "--no-probe", "--json", "--report-dir", str(out), env=env)
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr[-800:]
    return res.json


def _same_findings(a: dict, b: dict) -> None:
    strip = ("kept_answer", "bytecode_proofs_reused")
    assert {k: v for k, v in a["integrity"].items() if k not in strip} == \
        {k: v for k, v in b["integrity"].items() if k not in strip}
    assert a["target"] == {**b["target"], "image": a["target"]["image"]} and a["errors"] == b["errors"]


@pytest.mark.engine
def test_a_second_check_of_an_image_reuses_its_answers_and_another_image_never_gets_them(tmp_path: Path) -> None:
    fixture = images.fixture_image()
    env = {"DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    first = _verify(fixture, tmp_path / "v1", env)
    assert first["integrity"]["kept_answer"] is False and first["integrity"]["bytecode_checked"] > 3000
    answers = sorted((tmp_path / "cache/answers").iterdir())
    assert len(answers) == 3, answers  # locate, the decoy search, the integrity walk
    second = _verify(fixture, tmp_path / "v2", env)
    assert second["integrity"]["kept_answer"] is True
    _same_findings(first, second)
    assert {"locate", "integrity"} <= {s["name"] for s in second["steps"]}

    # Another image (one vLLM module edited, so another id) is checked afresh and its edit found.
    context = tmp_path / "context"
    context.mkdir()
    logger = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", fixture,
                             f"{SITE}/vllm/logger.py"], check=True, capture_output=True).stdout
    (context / "logger.py").write_bytes(logger + b"\nimport os  # by hand\n")
    (context / "Dockerfile").write_text(f"FROM {fixture}\nUSER root\nCOPY logger.py {SITE}/vllm/logger.py\nUSER vllm\n")
    tag = f"dspark-patch-test/kept:{secrets.token_hex(4)}"
    subprocess.run(["docker", "build", "--quiet", "--network", "none", "-t", tag, str(context)], check=True,
                   capture_output=True)
    try:
        edited = _verify(tag, tmp_path / "v3", env)
        assert edited["integrity"]["kept_answer"] is False
        assert edited["integrity"]["mismatched"] == ["vllm/logger.py"], edited["integrity"]
        assert "vllm/logger.py: does not match the published wheel" in edited["errors"][0]["message"]
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)

    # A damaged entry is asked again, with the same findings.
    for entry in answers:
        entry.write_text(json.dumps({"key": "not this one", "answer": {"files": 1}}))
    third = _verify(fixture, tmp_path / "v4", env)
    assert third["integrity"]["kept_answer"] is False
    _same_findings(first, third)

    # Once anything was written into the work container, nothing is kept or reused.
    with ImageTarget(fixture) as target:
        target.locate("vllm")
        assert target.answer_key("print(1)", []) is not None
        target.put_handshake(".dspark-patch-go-test", b"go")
        assert target.answer_key("print(1)", []) is None
