"""A ported variant as patch-set data: its diff from pre- and post-images, and its patch.toml table.

The diff is GNU `diff -u` with `a/` and `b/` labels, the style of every shipped variant (it
reproduces vllm-0.33.0.patch byte for byte from that release's files), and it is parsed back and
planned against the pre-images before anything is written: the diff must give exactly the
post-images, at zero fuzz.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import ownfiles
from ..errors import EnvironmentProblem, InvalidPatchSet
from ..patching.diff import parse_diff
from ..patching.plan import plan_patch


@dataclass(frozen=True, kw_only=True)
class CandidateFile:
    path: str            # relative to the site folder, as the diff names it
    pre: bytes | None    # the target release's pristine file (None: the diff adds it)
    post: bytes | None   # the resolved candidate (None: the diff deletes it)


def make_diff(files: tuple[CandidateFile, ...]) -> bytes:
    """The unified diff of every file (in the order given), checked to reproduce each post-image."""
    out = b"".join(_diff_one(f) for f in files)
    diff = parse_diff(out, strip=1)
    pres = {f.path: f.pre for f in files}
    plan = plan_patch(diff, pres.get)
    posts = {fp.path: fp.post for fp in plan.files}
    if plan.status != "apply" or any(posts.get(f.path) != f.post for f in files):
        raise InvalidPatchSet("the generated diff does not reproduce the candidate files exactly",
                              hint="this is a bug in dspark-patch port; nothing was written")
    return out


def _diff_one(f: CandidateFile) -> bytes:
    with tempfile.TemporaryDirectory(prefix="dspark-port-diff-") as tmp:
        pre, post = Path(tmp) / "pre", Path(tmp) / "post"
        pre.write_bytes(f.pre or b"")
        post.write_bytes(f.post or b"")
        # An added (deleted) file's other side is /dev/null, as diff -N and git write it.
        old = "/dev/null" if f.pre is None else f"a/{f.path}"
        new = "/dev/null" if f.post is None else f"b/{f.path}"
        try:
            done = subprocess.run(["diff", "-u", "--label", old, "--label", new, str(pre), str(post)],
                                  capture_output=True, timeout=120)
        except FileNotFoundError:
            raise EnvironmentProblem("port needs GNU diff (diffutils) to write the variant's diff",
                                     hint="install diffutils") from None
    if done.returncode not in (0, 1):
        raise EnvironmentProblem(f"diff failed: {done.stderr.decode('utf-8', 'replace').strip()[:200]}")
    return done.stdout


def sha256(data: bytes | None) -> str:
    """A port's files are all modified (both sides there); an absent side is an error here."""
    if data is None:
        raise ValueError("a ported file has both a pre- and a post-image")
    return hashlib.sha256(data).hexdigest()


def toml_table(*, name: str, release: str, diff_name: str, ported_from: str,
               files: tuple[CandidateFile, ...]) -> str:
    """The [[variants]] table appended to patch.toml (review starts "unreviewed")."""
    lines = [
        "",
        "[[variants]]",
        f"name = {_quote(name)}",
        f"releases = [{_quote(release)}]",
        f"diff = {_quote(diff_name)}",
        'review = "unreviewed"',
        f"ported_from = {_quote(ported_from)}",
    ]
    for f in files:
        lines += ["", f"[variants.files.{_quote(f.path)}]",
                  f"pre_sha256 = {_quote(sha256(f.pre))}", f"post_sha256 = {_quote(sha256(f.post))}"]
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_TOML_LIMIT = 1 << 20
BACKUP = ".patch.toml.before-port"


@dataclass(frozen=True, kw_only=True)
class WrittenVariant:
    """What `write_variant` put into the patch-set folder, for `undo_variant`/`forget_backup`."""

    folder: Path
    diff_name: str

    @property
    def diff(self) -> Path:
        return self.folder / self.diff_name


def write_variant(folder: Path, *, diff_name: str, diff: bytes, table: str) -> WrittenVariant:
    """Add the diff file and append the table to patch.toml; the caller validates and may undo.

    The patch-set folder may come from a pull request: every name is written through
    `ownfiles` (never through a link planted under it, the diff created exclusively)."""
    try:
        with ownfiles.open_folder(folder, create=False) as where:
            before = where.read("patch.toml", limit=_TOML_LIMIT)
            if before is None:
                raise InvalidPatchSet(f"{folder / 'patch.toml'} is missing")
            where.write(BACKUP, before)  # first: patch.toml can always be put back
            where.write(diff_name, diff, new=True)
            sep = b"" if before.endswith(b"\n") else b"\n"
            where.write("patch.toml", before + sep + table.encode("utf-8"))
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write the variant into {folder}: {exc.strerror or exc}",
                                 hint="check that the patch-set folder is writable") from None
    return WrittenVariant(folder=folder, diff_name=diff_name)


def undo_variant(written: WrittenVariant) -> None:
    """Put patch.toml back and remove the diff (when the patch set no longer loads)."""
    with ownfiles.open_folder(written.folder, create=False) as where:
        where.remove(written.diff_name)
        before = where.read(BACKUP, limit=_TOML_LIMIT)
        if before is not None:
            where.write("patch.toml", before)
            where.remove(BACKUP)


def forget_backup(written: WrittenVariant) -> None:
    with ownfiles.open_folder(written.folder, create=False) as where:
        where.remove(BACKUP)
