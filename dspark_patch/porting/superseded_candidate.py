"""What `port` writes when a release appears to ship the change (its effect cases pass on the
pristine release): an unreviewed `[[superseded]]` table for patch.toml and its review note, both
beside the work folder (docs/porting.md, "Moving to a new release")."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..report.model import ProbeCase, ProbeReport


@dataclass(frozen=True, kw_only=True)
class Recognised:
    name: str                      # "superseded-vllm-0.34.0": the files' stem
    where: tuple[str, ...]         # "path:function": where the release decides
    behaviour: tuple[str, ...]     # what the probe sees differ from the patch
    record: str                    # the unreviewed [[superseded]] table
    effects: tuple[ProbeCase, ...]
    distribution: str
    release: str

    @property
    def summary(self) -> str:
        where = self.where[0] if self.where else "(the probe names no place)"
        return f"its {len(self.effects)} effect cases pass on the pristine release, decided at {where}"

    def review(self, pid: str) -> str:
        return review(pid, self.distribution, self.release, self.effects, self.behaviour, self.where)


def recognise(effect_cases: Sequence[str], probed: ProbeReport | None, distribution: str, release: str,
              sha256_of: Callable[[str], str | None]) -> Recognised | None:
    """The release appears to ship the change when every effect case passed on its pristine files
    (`probed`: the whole probe run there). None when there are none, or one failed."""
    if probed is None or not effect_cases:
        return None
    by_name = {c.name: c for c in probed.cases}
    effects = [by_name.get(name) for name in effect_cases]
    passed = tuple(c for c in effects if c is not None and c.ok)
    if len(passed) != len(effects):
        return None
    behaviour = tuple(f"{c.name}: {c.detail}" for c in passed if "beyond" in c.detail)
    own = [c.name for c in probed.cases if not c.ok and c.name not in effect_cases]
    if own:   # the patch's own code is not in the release: one line, its groups named
        groups = ", ".join(dict.fromkeys(n.split(":", 1)[0] for n in own))
        behaviour += (f"{len(own)} cases of the patch's own code fail, as expected where it is not applied ({groups})",)
    files = {path: sha256_of(path) for path in sorted({w.split(":", 1)[0] for w in probed.where})}
    name = f"superseded-{distribution}-{release}"
    return Recognised(name=name, where=probed.where, behaviour=behaviour, effects=passed, distribution=distribution,
                      release=release, record=record(f"{distribution}-{release}", release, probed.where, files,
                                                     f"{name}.md"))


def record(name: str, release: str, where: tuple[str, ...], files: Mapping[str, str | None],
                      review_file: str) -> str:
    """An unreviewed `[[superseded]]` table for patch.toml (TOML basic strings are JSON's)."""
    q = json.dumps
    lines = ["# Written by `dspark-patch port`: the effect cases pass on the pristine release. A person",
             "# reads the review note, writes `upstream` in their own words, copies the note beside",
             "# patch.toml, sets review = \"reviewed\" and adds this table to patch.toml.",
             "[[superseded]]", f"name = {q(name)}", f"releases = [{q(release)}]",
             f"upstream = {q('TO WRITE: what ' + release + ' does instead, in one line')}",
             "where = [" + ", ".join(q(w) for w in where) + "]",
             'review = "unreviewed"', f"review_file = {q(review_file)}", "", "[superseded.files]"]
    lines += [f"{q(path)} = {q(digest)}" for path, digest in files.items() if digest is not None]
    return "\n".join(lines) + "\n"


def review(pid: str, distribution: str, release: str, effects: Sequence[ProbeCase | None], behaviour: tuple[str, ...],
                      where: tuple[str, ...]) -> str:
    out = [f"# Review: {pid} appears superseded by {distribution} {release}", "",
           f"`dspark-patch port` could not merge the patch onto {release}, and the patch set's effect cases",
           "pass on the pristine release. The candidate record beside this note is **unreviewed**.", "",
           "## Where the release decides", "", *[f"- `{w}`" for w in where], "",
           "## The effect cases on the pristine release", "", "| case | result | detail |", "|---|---|---|",
           *[f"| {c.name} | {'ok' if c.ok else 'FAILED'} | {c.detail.replace('|', '/')} |" for c in effects if c is not None],
           "", "## What the probe sees differ from the patch", "",
           *([f"- {b}" for b in behaviour] or ["- nothing"]), "",
           "## For the reviewer", "",
           "State upstream's scope against the patch's reviewed scope (see vllm-0.34.0.superseded.md for the",
           "shipped example): where the release skips more or less than the patch did, and why that is safe.", ""]
    return "\n".join(out)
