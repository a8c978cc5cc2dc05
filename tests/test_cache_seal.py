"""The cache folder saves work and never decides a verdict (targets/caches/seal.py): its entries are
believed only under this machine's cache key, which lives outside the folder. A CI cache that a
job from a fork can write may hold anything: answers copied from a patched image under another
image's name, a layer scan rewritten with its checksum recomputed, planted bytecode proofs
(tests/test_integrity.py plants those). Each is a recomputation and a note; the verdict is the
one an empty cache gives."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import zlib
from pathlib import Path

import pytest

from dspark_patch.targets.caches import answers, seal
from dspark_patch.targets.caches import scans as scan_cache
from tests.support import images
from tests.support.cli import run

SITE = "/usr/local/lib/python3.11/dist-packages"


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder and a key path of this test's own; the key loaded afresh."""
    monkeypatch.setenv("DSPARK_PATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DSPARK_PATCH_CACHE_KEY", str(tmp_path / "state/cache.key"))
    monkeypatch.setattr(seal, "_state", {})
    monkeypatch.setattr(seal, "_notes", [])
    return tmp_path


def _key(image_id: str = "sha256:" + "a" * 64) -> str:
    return answers.answer_key(image_id=image_id, engine="unix:///var/run/docker.sock", script="print(1)",
                           python="/usr/bin/python3", args=[])


def test_the_key_is_made_once_private_and_outside_the_cache(fresh: Path) -> None:
    answers.put(_key(), {"ok": 1})
    key = fresh / "state/cache.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_size == 32
    assert answers.get(_key()) == {"ok": 1} and seal.notes() == ()
    # another process (here: a fresh load) uses the same key and believes the entry
    seal._state.clear()
    assert answers.get(_key()) == {"ok": 1}
    # a new key (another machine's) believes nothing written under the old one, and says so
    key.unlink()
    seal._state.clear()
    assert answers.get(_key()) is None
    assert len(seal.notes()) == 1 and "answers entry in the cache folder" in seal.notes()[0]


@pytest.mark.parametrize("problem", ["inside the cache", "group-readable", "a link", "short", "a folder"])
def test_a_key_that_cannot_be_trusted_turns_the_caches_off_and_says_why(fresh: Path, problem: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    key = fresh / "state/cache.key"
    key.parent.mkdir()
    if problem == "inside the cache":
        key = fresh / "cache/my.key"
        monkeypatch.setenv("DSPARK_PATCH_CACHE_KEY", str(key))
    elif problem == "group-readable":
        key.write_bytes(secrets.token_bytes(32))
        key.chmod(0o640)
    elif problem == "a link":
        (fresh / "elsewhere").write_bytes(secrets.token_bytes(32))
        (fresh / "elsewhere").chmod(0o600)
        key.symlink_to(fresh / "elsewhere")
    elif problem == "short":
        key.write_bytes(b"0123")
        key.chmod(0o600)
    else:
        key.mkdir()
    answers.put(_key(), {"ok": 1})
    assert answers.get(_key()) is None
    assert not (fresh / "cache/answers").exists() or not any((fresh / "cache/answers").iterdir())
    (line,) = seal.notes()
    assert line.startswith(f"the cache key {key} ") and "caches not used" in line, line
    if problem == "inside the cache":
        assert not key.exists()


def test_an_entry_copied_under_another_name_or_rewritten_is_a_miss(fresh: Path) -> None:
    patched, other = _key("sha256:" + "a" * 64), _key("sha256:" + "b" * 64)
    answers.put(patched, {"verdict": "clean"})
    source = fresh / "cache/answers" / hashlib.sha256(patched.encode()).hexdigest()
    raw = source.read_bytes()
    # copied under the other image's name, its key rewritten to match
    copy = fresh / "cache/answers" / hashlib.sha256(other.encode()).hexdigest()
    copy.write_bytes(raw[:32] + raw[32:].replace(b"a" * 64, b"b" * 64))
    assert answers.get(other) is None
    copy.write_bytes(raw)
    assert answers.get(other) is None
    assert answers.get(patched) == {"verdict": "clean"}


# --- on the engine: the verdicts -----------------------------------------------------------------

def _edited_image(tmp_path: Path) -> tuple[str, str, str]:
    """The fixture with vllm/logger.py edited by hand: (tag, original sha256, edited sha256)."""
    fixture = images.fixture_image()
    logger = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", fixture,
                             f"{SITE}/vllm/logger.py"], check=True, capture_output=True).stdout
    edited = logger + b"\nimport os  # by hand\n"
    context = tmp_path / "context"
    context.mkdir()
    (context / "logger.py").write_bytes(edited)
    (context / "Dockerfile").write_text(f"FROM {fixture}\nUSER root\nCOPY logger.py {SITE}/vllm/logger.py\nUSER vllm\n")
    tag = f"dspark-patch-test/sealed:{secrets.token_hex(4)}"
    subprocess.run(["docker", "build", "--quiet", "--network", "none", "-t", tag, str(context)], check=True,
                   capture_output=True)
    return tag, hashlib.sha256(logger).hexdigest(), hashlib.sha256(edited).hexdigest()


def _image_id(ref: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.engine
def test_planted_answers_and_rewritten_scans_never_change_a_verdict(tmp_path: Path) -> None:
    env = {"DSPARK_PATCH_CACHE": str(tmp_path / "cache"), "DSPARK_PATCH_CACHE_KEY": str(tmp_path / "state/key")}
    fixture = images.fixture_image()
    tag, original, edited = _edited_image(tmp_path)
    try:
        def verify(ref: str, name: str) -> tuple[int, dict]:
            res = run("verify", "--image", ref, "--pull", "never", "--no-probe", "--json",
                      "--report-dir", str(tmp_path / name), env=env)
            assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr[-800:]
            return res.returncode, res.json

        def status(name: str) -> tuple[int, dict]:
            res = run("status", "--image", tag, "--via", "layers", "--json", "--report-dir", str(tmp_path / name), env=env)
            assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr[-800:]
            return res.returncode, res.json

        # The fixture is unpatched, so verify fails it for that alone; its integrity is clean.
        code, clean = verify(fixture, "v-fixture")
        assert clean["integrity"]["mismatched"] == [] and clean["integrity"]["kept_answer"] is False
        code, honest = verify(tag, "v-edited")
        assert code == 1 and honest["integrity"]["mismatched"] == ["vllm/logger.py"]
        code, before = status("s-edited")
        assert code == 1 and before["images"][0]["unexplained"] == ["vllm/logger.py"]

        # The fixture's answers copied under the edited image's names (its id written into them).
        answers = tmp_path / "cache/answers"
        fixture_id, edited_id = _image_id(fixture), _image_id(tag)
        for entry in list(answers.iterdir()):
            raw = entry.read_bytes()
            doc = json.loads(raw[32:])
            if fixture_id not in doc["key"]:
                continue
            key = doc["key"].replace(fixture_id, edited_id)
            body = json.dumps({"key": key, "answer": doc["answer"]}, separators=(",", ":")).encode()
            (answers / hashlib.sha256(key.encode()).hexdigest()).write_bytes(raw[:32] + body)
        # Every layer scan holding the edited file rewritten to the original hash, its checksum
        # recomputed (sha256 of the payload, where the reader once checked one).
        rewritten = 0
        for entry in (tmp_path / "cache/scans").glob("*/*.scan"):
            raw = entry.read_bytes()
            head = len(scan_cache.MAGIC)
            text = zlib.decompress(raw[head + 32:])
            if edited.encode() in text:
                payload = zlib.compress(text.replace(edited.encode(), original.encode()))
                entry.write_bytes(raw[:head] + hashlib.sha256(payload).digest() + payload)
                rewritten += 1
        assert rewritten == 1

        code, again = verify(tag, "v-planted")
        assert code == 1 and again["integrity"]["mismatched"] == ["vllm/logger.py"], again["integrity"]
        assert again["integrity"]["kept_answer"] is False
        assert any("answers entry in the cache folder" in n for n in again["notes"]), again["notes"]
        code, after = status("s-planted")
        assert code == 1 and after["images"][0]["unexplained"] == ["vllm/logger.py"]
        assert any("scans entry in the cache folder" in n for n in after["notes"]), after.get("notes")
        # the genuine image still reads clean from what is left
        code, fixture_again = verify(fixture, "v-fixture-2")
        assert fixture_again["integrity"]["kept_answer"] is True and not fixture_again["notes"]
        assert fixture_again["integrity"]["mismatched"] == [] and fixture_again["errors"] == clean["errors"]
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
