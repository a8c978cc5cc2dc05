"""Which python of an image owns a distribution, asked in the image target's work container.

The image's distinct interpreters (targets/interpreter.py: from its config and path stats; or
the one --python names) each run `inside/locate.py`, and one is chosen (`locate`); then the site
folders at the usual places that hold a copy none of the image's interpreters imports
(`unimported`). Both answers are kept by image id (targets/caches/answers.py) until anything is written
into the container.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...distname import filename_name
from ...errors import AmbiguousDistribution, BadInput, CheckFailed
from ...inside import ISOLATED
from ...inside.answers import LocateAnswer, MalformedAnswer, decode_locate, encode_locate
from .. import imageconfig, interpreter
from ..base import Distribution, RecordEntry
from ..caches import answers
from .work_image import WorkImage

_LOCATE_SOURCE = (Path(__file__).parent.parent.parent / "inside" / "locate.py").read_text()
# What locate's and unimported's kept answers (targets/caches/answers.py) are made by, besides the
# interpreter's own script: the code here and in target.py (its path stats and reads) that stats
# the image and chooses among its pythons.
_OWN_SOURCE = "".join((Path(__file__).parent.parent / name).read_text()
                      for name in ("docker/target.py", "docker/locate.py", "interpreter.py", "imageconfig.py"))


class ImageLocator:
    """`locate` and `unimported` for one image target, remembering which interpreters ran and
    which site folders they import from."""

    def __init__(self, image: WorkImage, *, python: str | None) -> None:
        self._image = image
        self._wanted_python = python      # --python: the interpreter to patch with, else discovered
        self._imported: set[str] = set()  # the site folders the located interpreters import from
        self._located: set[str] = set()   # the interpreters locate ran

    def locate(self, distribution: str) -> Distribution:
        """The distribution as the interpreter that owns it sees it (see interpreter.py)."""
        key = self._own_key("locate", distribution)
        results = _kept_located(answers.get(key)) if key else None
        failures: list[CheckFailed] = []
        if results is None:
            if self._wanted_python:
                pythons = [interpreter.Interpreter(path=self._wanted_python, binary=self._wanted_python, venv=None)]
            else:
                pythons = self._interpreters()
            results = []
            for python in pythons:
                try:
                    results.append(interpreter.Located(interpreter=python, answer=self._locate_with(python.path, distribution)))
                except CheckFailed as exc:  # one broken python (say, a python2) need not hide the others
                    failures.append(exc)
            if key and not failures:
                answers.put(key, [{"interpreter": {"path": r.interpreter.path, "binary": r.interpreter.binary,
                                                 "venv": r.interpreter.venv}, "found": encode_locate(r.answer)}
                                for r in results])
        self._note_imported(results)
        if failures and not any(r.answer.installed for r in results):
            raise failures[0]
        answer = interpreter.choose(self._image.ref, distribution, results).answer
        found = answer.installed
        assert found is not None  # choose() takes only an interpreter that has it
        if found.package_dir and posixpath.dirname(found.package_dir) != found.location:
            raise BadInput(
                f"in image {self._image.ref}, `import {distribution}` would load {found.package_dir}, "
                f"not the installed distribution at {found.location}",
                hint="remove the shadowing copy from the image's sys.path",
            )
        if found.duplicates:
            raise AmbiguousDistribution(
                f"in image {self._image.ref}, {answer.python} sees {len(found.duplicates)} {distribution} distributions: "
                + ", ".join(found.duplicates),
                hint="an installer leaves exactly one dist-info per distribution; which one is in use is not decidable")
        if found.record_error:
            raise BadInput(f"in image {self._image.ref}, the RECORD of {distribution} at {found.location}: {found.record_error}",
                           hint="the RECORD is malformed; rebuild the image from the release")
        return Distribution(
            name=found.name,
            version=found.version,
            location=found.location,
            python=answer.python,
            python_version=answer.python_version,
            cache_tag=answer.cache_tag,
            record_file=found.record_file,
            record=tuple(RecordEntry(path=p, sha256=h, size=s) for p, h, s in found.record),
        )

    def unimported(self, distribution: str) -> tuple[str, ...]:
        """The site folders at the usual places (imageconfig.site_candidates, the ones `status`
        lists as `unimported`) that hold `distribution`'s package but that no interpreter of the
        image imports it from: a decoy beside the copy that runs, or a stale second install.
        Stats only, after `locate`; with --python the image's other interpreters are asked too
        (a copy some interpreter imports is no decoy)."""
        key = self._own_key("unimported", distribution, sorted(self._imported), sorted(self._located))
        answer = answers.get(key) if key else None
        if isinstance(answer, list) and all(isinstance(a, str) for a in answer):
            return tuple(answer)
        left = self._unimported(distribution)
        if key:
            answers.put(key, list(left))
        return left

    def _unimported(self, distribution: str) -> tuple[str, ...]:
        top = filename_name(distribution)
        stat = self._image.stat
        sites = imageconfig.site_candidates(self._image.source.config, lambda p: imageconfig.is_dir(stat(p)))
        holding = [s for s in sites if stat(f"{s}/{top}/__init__.py") is not None]
        left = [s for s in holding if posixpath.normpath(s) not in self._imported]
        if left:
            others = [p for p in self._interpreters() if p.path not in self._located]
            results = []
            for python in others:
                try:
                    results.append(interpreter.Located(interpreter=python, answer=self._locate_with(python.path, distribution)))
                except CheckFailed:
                    continue  # a python that does not run imports nothing
            self._note_imported(results)
            left = [s for s in left if posixpath.normpath(s) not in self._imported]
        return tuple(left)

    def _own_key(self, what: str, *args: Any) -> str | None:
        if self._image.written:
            return None
        return answers.answer_key(image_id=self._image.source.id, engine=self._image.engine.host,
                               script=_OWN_SOURCE + _LOCATE_SOURCE, python=self._wanted_python or "", args=[what, *args])

    def _note_imported(self, results: Sequence[interpreter.Located]) -> None:
        self._located |= {r.interpreter.path for r in results}
        self._imported |= {posixpath.normpath(r.answer.installed.location) for r in results
                           if r.answer.installed is not None and r.answer.installed.location}

    def _interpreters(self) -> list[interpreter.Interpreter]:
        """The image's distinct python environments, entrypoint's first (stats only; nothing runs)."""
        def read_head(path: str) -> bytes | None:
            data = self._image.read_small(path)
            return data[:512] if data is not None else None

        stat = self._image.stat
        found = interpreter.existing(interpreter.candidates(self._image.source.config, stat, read_head), stat)
        return found or [interpreter.Interpreter(path=self._image.container.python, binary=self._image.container.python, venv=None)]

    def _locate_with(self, python: str, distribution: str) -> LocateAnswer:
        result = self._image.container.call([python, *ISOLATED, "-c", _LOCATE_SOURCE, distribution], timeout=120)
        if result.returncode != 0:
            raise CheckFailed(
                f"locating {distribution} in image {self._image.ref} with {python} failed "
                f"(exit {result.returncode}): {result.stderr.decode(errors='replace').strip()[-500:]}"
            )
        try:
            return decode_locate(json.loads((result.stdout.decode().strip().splitlines() or [""])[-1]))
        except (ValueError, MalformedAnswer) as exc:  # not UTF-8 or JSON (a ValueError), or not locate.py's shape
            why = exc if isinstance(exc, MalformedAnswer) else "its output is not JSON"
            raise CheckFailed(f"locating {distribution} in image {self._image.ref} with {python} failed: {why}") from None


def _kept_located(answer: Any) -> list[interpreter.Located] | None:
    """A kept `locate` answer (each interpreter and what its locate.py said), or None: none
    kept, or an entry that is not one (a miss)."""
    if not isinstance(answer, list):
        return None
    try:
        return [_kept_row(row) for row in answer]
    except MalformedAnswer:
        return None


def _kept_row(row: Any) -> interpreter.Located:
    python = row.get("interpreter") if isinstance(row, dict) and row.keys() == {"interpreter", "found"} else None
    if not isinstance(python, dict) or python.keys() != {"path", "binary", "venv"} \
            or not isinstance(python["path"], str) or not isinstance(python["binary"], str) \
            or not isinstance(python["venv"], str | None):
        raise MalformedAnswer("locate.py", "", "was kept without the interpreter that gave it")
    return interpreter.Located(interpreter=interpreter.Interpreter(**python), answer=decode_locate(row["found"]))
