"""The inside scripts' answers, decoded at one seam (inside/answers.py): a real answer round-trips,
and anything not of the script's shape is one MalformedAnswer naming the field, which a kept copy
turns into a miss and a fresh integrity answer into the message a user has always read."""

from __future__ import annotations

import compileall
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dspark_patch.errors import VerifyMismatch
from dspark_patch.inside import integrity, locate
from dspark_patch.inside.answers import (
    MalformedAnswer,
    decode_compile,
    decode_integrity,
    decode_locate,
    encode_integrity,
    encode_locate,
)
from dspark_patch.pipeline import integrity_check
from dspark_patch.targets.base import Distribution, RunResult
from dspark_patch.targets.docker.locate import _kept_located


def _json(doc: Any) -> Any:
    return json.loads(json.dumps(doc))  # what the host reads: the printed JSON, parsed


def _located() -> dict:
    return _json(locate.locate("pytest"))


def _walked(tmp_path: Path) -> dict:
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("X = 1\n")
    (site / "pkg-1.0.dist-info").mkdir()
    (site / "pkg-1.0.dist-info" / "METADATA").write_text("Name: pkg\nVersion: 1.0\n")
    (site / "extra.pth").write_text("import os\n")
    (site / "bin").mkdir()
    (site / "bin" / "tool").write_text("#!/usr/bin/python3\n")
    (site / "bin" / "folder").mkdir()
    compileall.compile_dir(str(site / "pkg"), quiet=1)
    return _json(integrity.main({"location": str(site), "folders": ["pkg"], "scripts": ["bin/tool", "bin/folder",
                                                                                         "bin/none"]}))


def test_a_real_locate_answer_round_trips() -> None:
    doc = _located()
    answer = decode_locate(doc)
    assert answer.installed is not None and answer.installed.name == "pytest" and answer.installed.record
    assert encode_locate(answer) == doc
    assert decode_locate(_json(encode_locate(answer))) == answer
    missing = _json(locate.locate("no-such-distribution-here"))
    assert decode_locate(missing).installed is None and encode_locate(decode_locate(missing)) == missing


def test_a_real_integrity_answer_round_trips(tmp_path: Path) -> None:
    doc = _walked(tmp_path)
    answer = decode_integrity(doc)
    assert "pkg/__init__.py" in answer.files and answer.pth == {"extra.pth": b"import os\n"}
    assert answer.scripts == {"bin/tool": b"#!/usr/bin/python3\n", "bin/folder": "not a regular file", "bin/none": None}
    assert encode_integrity(answer) == doc
    assert decode_integrity(_json(encode_integrity(answer))) == answer


def _without(doc: dict, key: str) -> dict:
    return {k: v for k, v in doc.items() if k != key}


LOCATE_MALFORMED = [
    ("missing key", lambda d: _without(d, "python"), "python"),
    ("missing key when found", lambda d: _without(d, "location"), "location"),
    ("wrong type", lambda d: {**d, "found": "yes"}, "found"),
    ("wrong type in a list", lambda d: {**d, "sys_path": [1]}, "sys_path"),
    ("a record row too short", lambda d: {**d, "record": [["a", None]]}, "record"),
    ("a size that is a boolean", lambda d: {**d, "record": [["a", None, True]]}, "record"),
    ("extra nesting", lambda d: {"answer": d}, "found"),
    ("extra nesting in a list", lambda d: [d], ""),
    ("a record row nested", lambda d: {**d, "record": [d["record"]]}, "record"),
]


@pytest.mark.parametrize(("change", "field"), [(c, f) for _, c, f in LOCATE_MALFORMED],
                         ids=[name for name, _, _ in LOCATE_MALFORMED])
def test_a_malformed_locate_answer_is_one_error_naming_the_field(change: Any, field: str) -> None:
    with pytest.raises(MalformedAnswer) as refused:
        decode_locate(change(copy.deepcopy(_located())))
    assert refused.value.field == field and refused.value.script == "locate.py"
    assert str(refused.value).startswith("locate.py's answer: ") and "\n" not in str(refused.value)


INTEGRITY_MALFORMED = [
    ("missing files", lambda d: _without(d, "files"), "files"),
    ("missing pth", lambda d: _without(d, "pth"), "pth"),
    ("files a list", lambda d: {**d, "files": []}, "files"),
    ("a file without its size", lambda d: {**d, "files": {"a": ["0" * 64]}}, "files"),
    ("a file nested", lambda d: {**d, "files": {"a": [["0" * 64, 1]]}}, "files"),
    ("bytecode not text", lambda d: {**d, "bytecode": {"a.pyc": 0}}, "bytecode"),
    ("pth text that is not latin-1", lambda d: {**d, "pth": {"x.pth": "\u2603"}}, "pth"),
    ("a script object that is not a why", lambda d: {**d, "scripts": {"bin/x": {"why": "x", "more": 1}}}, "scripts"),
    ("a script why nested", lambda d: {**d, "scripts": {"bin/x": {"why": {"why": "x"}}}}, "scripts"),
    ("proofs reused a boolean", lambda d: {**d, "proofs_reused": True}, "proofs_reused"),
    ("others a text", lambda d: {**d, "others": "a"}, "others"),
    ("extra nesting", lambda d: {"answer": d}, "files"),
]


@pytest.mark.parametrize(("change", "field"), [(c, f) for _, c, f in INTEGRITY_MALFORMED],
                         ids=[name for name, _, _ in INTEGRITY_MALFORMED])
def test_a_malformed_integrity_answer_is_one_error_naming_the_field(tmp_path: Path, change: Any, field: str) -> None:
    with pytest.raises(MalformedAnswer) as refused:
        decode_integrity(change(_walked(tmp_path)))
    assert refused.value.field == field and refused.value.script == "integrity.py"
    assert "\n" not in str(refused.value)


def test_a_kept_answer_that_does_not_decode_is_a_miss(tmp_path: Path) -> None:
    walked = _walked(tmp_path)
    assert integrity_check._kept(walked) is not None
    for planted in ({**walked, "pth": []}, {**walked, "files": {"a": [None, 1]}}, [walked], None, "x"):
        assert integrity_check._kept(planted) is None
    row = {"interpreter": {"path": "/usr/bin/python3", "binary": "/usr/bin/python3", "venv": None},
           "found": _located()}
    assert _kept_located([row]) is not None and _kept_located([row])[0].answer == decode_locate(_located())
    for planted in ([{**row, "found": {**row["found"], "found": 1}}], [{**row, "interpreter": {"path": 1}}],
                    [{**row, "more": 1}], [row["found"]], [[row]], {"0": row}):
        assert _kept_located(planted) is None


class _Answers:
    """A target whose python prints `stdout` to every script."""

    def __init__(self, stdout: bytes) -> None:
        self.stdout = stdout

    def run_python(self, source: str, args: Any = (), **_: Any) -> RunResult:
        return RunResult(returncode=0, stdout=self.stdout, stderr=b"boom")


DIST = Distribution(name="pkg", version="1.0", location="/site", python="/usr/bin/python3", python_version="3.11.2",
                    cache_tag="cpython-311", record_file=None, record=())


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: _without(d, "files"), "the integrity check with /usr/bin/python3 answered without its files"),
    (lambda d: {**d, "files": {"a": [None, 1]}}, "the integrity check with /usr/bin/python3 answered without its files"),
    (lambda d: _without(d, "metadata"), "the integrity check with /usr/bin/python3 answered without its facts"),
    (lambda d: {**d, "pth": {"x.pth": 1}}, "the integrity check with /usr/bin/python3 answered without its facts"),
    (lambda d: [d], "the integrity check could not run with /usr/bin/python3: boom"),
])
def test_a_fresh_malformed_integrity_answer_fails_the_check_as_it_always_did(tmp_path: Path, change: Any,
                                                                              message: str) -> None:
    target = _Answers(json.dumps(change(_walked(tmp_path))).encode())
    with pytest.raises(VerifyMismatch) as refused:
        integrity_check._gathered(target, DIST, {"folders": ["pkg"]})  # type: ignore[arg-type]
    assert refused.value.message == message and refused.value.exit_code == 1


def test_a_real_compile_answer_decodes_one_row_per_file(tmp_path: Path) -> None:
    from dspark_patch.inside import compile as inside_compile

    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("X = 1\n")
    bad.write_text("def (:\n")
    rows = decode_compile(_json(inside_compile.compile_files([str(good), str(bad)])), 2)
    assert [(r.path, r.ok) for r in rows] == [(str(good), True), (str(bad), False)]
    assert rows[0].detail == "" and rows[1].detail


@pytest.mark.parametrize(("answer", "why"), [
    ({"files": [{"path": "a.py", "ok": True, "detail": ""}]}, "files holds 1 rows for 2 files"),
    ({"files": [{"path": "a.py", "ok": 1, "detail": ""}] * 2}, "ok holds an integer, not true or false"),
    ({"files": [{"path": "a.py", "ok": True}] * 2}, "detail is missing"),
    ({"files": ["a.py", "b.py"]}, "files holds a string, not an object"),
    ({"rows": []}, "files is missing"),
])
def test_a_malformed_compile_answer_fails_the_compile_with_one_line(answer: Any, why: str) -> None:
    # Before, a row without "ok" or "detail" was a KeyError traceback after the write.
    from dspark_patch.errors import CompileFailed
    from dspark_patch.pipeline.shared_steps import compiled_rows

    with pytest.raises(CompileFailed) as failed:
        compiled_rows(_Answers(json.dumps(answer).encode()), DIST, ["a.py", "b.py"], hint="restored")  # type: ignore[arg-type]
    assert failed.value.message == f"byte-compiling with /usr/bin/python3 failed: compile.py's answer: {why}"
    assert failed.value.hint == "restored"
