"""Small synthetic trees and diffs for the engine and write tests."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

BASE = b"".join(b"line %d\n" % i for i in range(1, 41))


def lines_of(data: bytes) -> list[bytes]:
    """The oracle's own line split, shared with none of the code under test: only b"\n" ends a
    line (as diff and patch read files); the last line may have no ending."""
    return re.findall(rb"[^\n]*\n|[^\n]+\Z", data)


def udiff(old: bytes, new: bytes, path: str = "pkg/mod.py", *, context: int = 3) -> bytes:
    """A unified diff with a/ b/ prefixes, spelling a missing final newline the way diff -u does."""
    out = []
    for line in difflib.diff_bytes(
        difflib.unified_diff,
        lines_of(old),
        lines_of(new),
        fromfile=b"a/" + path.encode(),
        tofile=b"b/" + path.encode(),
        n=context,
    ):
        out.append(line)
        if not line.endswith(b"\n"):
            out.append(b"\n\\ No newline at end of file\n")
    return b"".join(out)


def edit(text: bytes, replace: dict[int, bytes]) -> bytes:
    """`text` with 1-based lines replaced (b"" deletes the line)."""
    lines = lines_of(text)
    for number, new in replace.items():
        lines[number - 1] = new
    return b"".join(lines)


def make_tree(root: Path, files: dict[str, bytes], modes: dict[str, int] | None = None) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, (modes or {}).get(rel, 0o644))
    return root


def snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under root: bytes, mode and inode (a rewrite changes the inode)."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            st = path.lstat()
            out[str(path.relative_to(root))] = (path.read_bytes(), st.st_mode, st.st_ino)
    return out
