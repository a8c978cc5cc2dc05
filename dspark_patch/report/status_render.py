"""The forms of a status result: JSON (checked against `status.schema.json`), Markdown for a CI
step summary, JUnit with one test case per image."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from importlib import resources
from typing import Any

from dspark_patch.report.status_model import FleetStatus, ImageStatus


def load_status_schema() -> dict[str, Any]:
    return json.loads(resources.files("dspark_patch.report").joinpath("status.schema.json").read_text(encoding="utf-8"))


def _row(image: ImageStatus) -> dict[str, Any]:
    return {
        "ref": image.ref, "id": image.id, "platform": image.platform, "release": image.release,
        "python": image.python, "location": image.location, "patch_sets": dict(image.patch_sets),
        "unexplained": list(image.unexplained), "missing": list(image.missing), "added": list(image.added),
        "unimported": list(image.unimported),
        "reference": image.reference, "record_disagrees": list(image.record_disagrees),
        "bytecode": list(image.bytecode), "unverified": list(image.unverified),
        "error": image.error, "exit_code": image.exit_code,
        "attested": dict(image.attested), "attested_detail": list(image.attested_detail),
        "installer_metadata": list(image.installer_metadata), "installer_findings": list(image.installer_findings),
        "route": None if image.route is None else {"name": image.route.name, "reason": image.route.reason},
    }


def to_status_dict(fleet: FleetStatus) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema": fleet.schema, "tool_version": fleet.tool_version, "started_at": fleet.started_at,
                           "seconds": fleet.seconds, "exit_code": fleet.exit_code,
                           "patch_set_digests": dict(fleet.patch_set_digests)}
    if fleet.shard is not None:
        s = fleet.shard
        doc["shard"] = {"index": s.index, "count": s.count, "targets": s.targets, "list_sha256": s.list_sha256,
                        "positions": list(s.positions)}
    if fleet.merged is not None:
        m = fleet.merged
        doc["merged"] = {"count": m.count, "shards": list(m.shards), "missing": list(m.missing), "partial": m.partial}
    if fleet.notes:
        doc["notes"] = list(fleet.notes)
    doc["images"] = [_row(i) for i in fleet.images]
    return doc


def to_status_json(fleet: FleetStatus) -> str:
    return json.dumps(to_status_dict(fleet), indent=2) + "\n"


def verdict(image: ImageStatus) -> str:
    """One word per row: "not covered" is a release (or platform) with no reference and nothing
    else found: its files were not checked, so it is not clean, and not known to be changed."""
    if image.error:
        return "not read"
    if image.reference is None and not replace(image, reference="-").findings:
        return "not covered"
    return "changed" if image.findings else "clean"


def scope(fleet: FleetStatus) -> list[str]:
    """What share of the fleet a sharded or merged report covers; nothing for a whole run."""
    if fleet.shard is not None:
        s = fleet.shard
        return [f"Shard {s.index}/{s.count}: {len(s.positions)} of the list's {s.targets} target(s)."]
    if fleet.merged is not None and fleet.merged.partial:
        m = fleet.merged
        return [f"**Partial**: merged from shard(s) {', '.join(map(str, m.shards))} of {m.count}; shard(s) "
                f"{', '.join(map(str, m.missing))} missing, their images are not in this report (never clean)."]
    return []


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_status_markdown(fleet: FleetStatus) -> str:
    ids = fleet.patch_set_ids
    mark = {0: "✅", 1: "❌", 2: "⚠️", 3: "⚠️"}
    keyed = any(i.attested for i in fleet.images)
    lines = ["## dspark-patch status", "",
             f"{len(fleet.images)} image(s), exit code {fleet.exit_code}, {fleet.seconds:.1f}s.", "",
             *(f"{line}\n" for line in scope(fleet)),
             "| | image | vLLM | python | " + " | ".join(f"`{i}`" for i in ids) + " | unexplained | missing | added |"
             + (" attested |" if keyed else "") + " route |",
             "|---|---|---|---|" + "---|" * len(ids) + "---|---|---|" + ("---|" if keyed else "") + "---|"]
    for image in fleet.images:
        states = dict(image.patch_sets)
        attested = ", ".join(f"{pid}: {state}" for pid, state in image.attested) or "–"
        lines.append(f"| {mark[image.exit_code]} | `{_cell(image.ref)}` | {image.release or '–'} | {image.python or '–'} | "
                     + " | ".join(states.get(i, "–") for i in ids)
                     + f" | {len(image.unexplained)} | {len(image.missing)} | {len(image.added)} |"
                     + (f" {_cell(attested)} |" if keyed else "") + f" {_route_cell(image)} |")
    for image in fleet.images:
        if image.error or image.unexplained or image.missing or image.added or image.record_disagrees or image.bytecode \
                or image.unverified or image.attested_detail or image.unimported or image.installer_findings:
            lines += ["", f"### `{_cell(image.ref)}`", ""]
            if image.error:
                lines.append(f"not read: {_cell(image.error)}")
            lines += [f"- {_cell(line)}" for line in image.unverified]
            lines += [f"- attestation: {_cell(d)}" for d in image.attested_detail]
            for label, paths in (("unexplained", image.unexplained), ("missing", image.missing), ("added", image.added),
                                 ("RECORD disagrees with the wheel", image.record_disagrees), ("bytecode", image.bytecode),
                                 ("vLLM no interpreter imports (not read)", image.unimported),
                                 ("named like the installer's files, but not in their shape", image.installer_findings)):
                if paths:
                    lines += [f"{label}:", *(f"- `{p}`" for p in paths)]
    lines += _route_reasons(fleet)
    if fleet.notes:
        lines += ["", "### Notes", "", *(f"- {_cell(n)}" for n in fleet.notes)]
    return "\n".join(lines) + "\n"


def _route_cell(image: ImageStatus) -> str:
    return image.route.name if image.route is not None else "–"


def route_reasons(fleet: FleetStatus) -> list[tuple[str, str, int]]:
    """Each route the rows were read by, with its reason and how many rows: once, not per row."""
    counted: dict[tuple[str, str], int] = {}
    for image in fleet.images:
        if image.route is not None:
            key = (image.route.name, image.route.reason)
            counted[key] = counted.get(key, 0) + 1
    return [(name, reason, n) for (name, reason), n in counted.items()]


def _route_reasons(fleet: FleetStatus) -> list[str]:
    reasons = route_reasons(fleet)
    if not reasons:
        return []
    return ["", "### Routes", "", *(f"- `{name}` ({n} row(s)): {_cell(reason)}" for name, reason, n in reasons)]


def to_status_junit(fleet: FleetStatus) -> str:
    missing = fleet.merged.missing if fleet.merged is not None else ()
    tests = len(fleet.images) + len(missing)
    failures = sum(1 for i in fleet.images if i.exit_code == 1)
    errors = sum(1 for i in fleet.images if i.exit_code > 1) + len(missing)
    suites = ET.Element("testsuites", name="dspark-patch status", tests=str(tests),
                        failures=str(failures), errors=str(errors), time=f"{fleet.seconds:.3f}")
    suite = ET.SubElement(suites, "testsuite", name="status", tests=str(tests),
                          failures=str(failures), errors=str(errors), time=f"{fleet.seconds:.3f}")
    for index in missing:  # a partial merge: what was not read is an error, never a pass
        assert fleet.merged is not None
        case = ET.SubElement(suite, "testcase", classname="status", name=f"shard {index}/{fleet.merged.count}")
        ET.SubElement(case, "error", message=f"shard {index}/{fleet.merged.count} missing: its images were not read")
    for image in fleet.images:
        case = ET.SubElement(suite, "testcase", classname="status", name=image.ref)
        detail = [f"{pid}: {state}" for pid, state in image.patch_sets]
        detail += [f"unexplained: {p}" for p in image.unexplained]
        detail += [f"missing: {p}" for p in image.missing]
        detail += [f"added: {p}" for p in image.added]
        detail += [f"RECORD disagrees with the wheel: {p}" for p in image.record_disagrees]
        detail += [f"bytecode: {p}" for p in image.bytecode]
        detail += [f"installer file: {p}" for p in image.installer_findings]
        detail += list(image.unverified)
        detail += [f"attested {pid}: {state}" for pid, state in image.attested]
        detail += [f"attestation: {d}" for d in image.attested_detail]
        detail += [f"imported by no interpreter (not read): {p}" for p in image.unimported]
        if image.exit_code == 0:
            ET.SubElement(case, "system-out").text = "\n".join(detail)
            continue
        tag = "failure" if image.exit_code == 1 else "error"
        if image.error:
            message = image.error
        else:
            bad = [f"{pid} {s}" for pid, s in image.patch_sets if s in ("partial", "drifted")]
            bad += [f"{pid} attestation invalid" for pid, s in image.attested if s == "invalid"]
            message = "; ".join([*bad, *(f"{len(x)} {name}" for name, x in (
                ("unexplained", image.unexplained), ("missing", image.missing), ("added", image.added),
                ("RECORD rows disagree", image.record_disagrees), ("bytecode", image.bytecode),
                ("installer files not in an installer's shape", image.installer_findings)) if x)]
                + [u for u in image.unverified if u.startswith("no reference")])
        ET.SubElement(case, tag, message=message).text = "\n".join(detail)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
