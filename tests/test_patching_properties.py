"""Properties: any difflib diff of any text applies back to exactly the edited text; any bytes given
to the parser fail only with our own errors."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_patch.errors import DsparkPatchError
from dspark_patch.patching import parse_diff, plan_patch, split_lines
from tests.support.trees import udiff

# A small alphabet makes repeated lines (and so ambiguous-looking places) common.
_WORDS = st.sampled_from([b"", b"x", b"y", b"def f():", b"    return 1", b"# note", b"\xff\xfe odd", b"a\rb", b"\t"])
_ENDINGS = st.sampled_from([b"\n", b"\r\n"])


@st.composite
def texts(draw) -> bytes:
    lines = draw(st.lists(st.tuples(_WORDS, _ENDINGS), max_size=40))
    text = b"".join(word + ending for word, ending in lines)
    if text and draw(st.booleans()):
        text = text.rstrip(b"\n")  # no newline at end of file (a CRLF line keeps its \r)
    return text


@st.composite
def edits(draw) -> tuple[bytes, bytes]:
    old = draw(texts())
    lines = split_lines(old)
    for _ in range(draw(st.integers(0, 6))):
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        at = draw(st.integers(0, len(lines)))
        new_line = draw(_WORDS) + draw(_ENDINGS)
        if action == "insert":
            lines.insert(at, new_line)
        elif lines and at < len(lines):
            if action == "delete":
                del lines[at]
            else:
                lines[at] = new_line
    new = b"".join(lines)
    if new and draw(st.booleans()):
        new = new[:-1] if new.endswith(b"\n") else new
    return old, new


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits())
def test_difflib_diff_applies_back_to_the_edited_text(pair: tuple[bytes, bytes]) -> None:
    old, new = pair
    if old == new:
        return  # difflib writes nothing for equal texts; an empty diff is refused elsewhere
    diff = udiff(old, new)
    plan = plan_patch(parse_diff(diff), lambda path: old)
    assert plan.status == "apply"
    (file,) = plan.files
    assert file.pre == old
    if file.action == "delete":  # "+0,0": the edit emptied the file, and diff says delete
        assert new == b""
    else:
        assert file.post == new


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_fail_only_with_our_errors(data: bytes) -> None:
    try:
        parse_diff(data)
    except DsparkPatchError:
        pass


_DIFFISH = st.lists(
    st.sampled_from(
        [b"--- a/p/x.py\n", b"+++ b/p/x.py\n", b"--- /dev/null\n", b"+++ /dev/null\n", b"@@ -1,2 +1,2 @@\n",
         b"@@ -0,0 +1 @@\n", b"@@ -1 +0,0 @@\n", b" ctx\n", b"-old\n", b"+new\n", b"\\ No newline at end of file\n",
         b"diff --git a/p/x.py b/p/x.py\n", b"new file mode 100644\n", b"old mode 100644\n", b"\n", b"junk\n"]
    ),
    max_size=14,
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(_DIFFISH)
def test_diff_shaped_bytes_parse_or_fail_with_our_errors(data: bytes) -> None:
    try:
        diff = parse_diff(data)
    except DsparkPatchError:
        return
    try:
        plan_patch(diff, lambda path: b" ctx\nold\n")
    except DsparkPatchError:
        pass
