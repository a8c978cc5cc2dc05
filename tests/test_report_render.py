"""The report's forms: audit.json against the shipped schema, audit.md, junit.xml, in-toto,
the report folder and the CI step summary. Pure rendering over realistic reports; the reports
of real local-tree and image runs are validated against the same schema in the pipeline tests."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from dspark_patch.errors import BadInput, TargetNotFound
from dspark_patch.report.model import (
    AuditReport,
    CompiledFile,
    CompileReport,
    DistributionInfo,
    ErrorReport,
    FileReport,
    HunkReport,
    ImageRecord,
    IntegrityReport,
    LayerChange,
    LayerReport,
    PatchReport,
    ProbeCase,
    ProbeReport,
    StepReport,
    TargetReport,
)
from dspark_patch.report.render import (
    PREDICATE_TYPE,
    from_json_dict,
    load_schema,
    read_report,
    render_as,
    to_intoto,
    to_json,
    to_junit,
    to_markdown,
    write_report_dir,
)
from dspark_patch.report.summary import append_step_summary, append_step_summary_from_env
from dspark_patch.serialise import to_data


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


SITE = "/opt/venv/lib/python3.11/site-packages"
FILES = (
    "vllm/v1/worker/gpu_model_runner.py",
    "vllm/v1/spec_decode/eagle.py",
    "vllm/envs.py",
)
SOURCE_ID = "sha256:" + sha("source image config")
RESULT_ID = "sha256:" + sha("result image config")
RESULT_MANIFEST = sha("result image manifest")
PROBE_CASES = ("ordinary", "partial-graph-staging", "all-staged")
LABEL_NS = "io.github.dspark-patch"


def file_reports() -> tuple[FileReport, ...]:
    return tuple(
        FileReport(
            path=path,
            action="modify",
            pre_sha256=sha(f"pre {path}"),
            post_sha256=sha(f"post {path}"),
            expected_pre_sha256=sha(f"pre {path}"),
            expected_post_sha256=sha(f"post {path}"),
            hunks=(HunkReport(index=1, source_start=100 * (n + 1), applied_at=100 * (n + 1) + n - 1, offset=n - 1, fuzz=0),),
        )
        for n, path in enumerate(FILES)
    )


def target() -> TargetReport:
    return TargetReport(
        kind="image",
        ref="vllm-serving:0.33.0",
        python="/opt/venv/bin/python3",
        python_version="3.11.2",
        distribution=DistributionInfo(name="vllm", version="0.33.0", location=SITE),
        image=ImageRecord(ref="vllm-serving:0.33.0", id=SOURCE_ID),
    )


def patch() -> PatchReport:
    return PatchReport(
        id="dspark-mtp-buffer",
        variant="0.33",
        sha256=sha("the diff"),
        source="patches/dspark-mtp-buffer",
        hash_checks=True,
    )


def applied_report() -> AuditReport:
    files = file_reports()
    return AuditReport(
        command="apply",
        status="applied",
        exit_code=0,
        tool_version="0.1.0",
        started_at="2025-11-29T14:20:00Z",
        target=target(),
        result_image=ImageRecord(
            ref="registry.local:5000/vllm-serving:0.33.0-dspark",
            id=RESULT_ID,
            repo_digest=f"registry.local:5000/vllm-serving@sha256:{RESULT_MANIFEST}",
        ),
        patch=patch(),
        files=files,
        compile=CompileReport(ok=True, ran=True, files=tuple(CompiledFile(path=f.path, ok=True) for f in files)),
        probe=ProbeReport(
            ok=True,
            ran=True,
            cases=tuple(ProbeCase(name=name, ok=True, detail="MTP residual never read") for name in PROBE_CASES),
        ),
        integrity=IntegrityReport(checked=2113, not_checked=("../../../bin/vllm",)),
        layer=LayerReport(
            ok=True,
            changes=tuple(LayerChange(kind="C", path=f"{SITE}/{f.path}") for f in files)
            + tuple(
                LayerChange(kind="A", path=f"{SITE}/{f.path.rsplit('/', 1)[0]}/__pycache__/{f.path.rsplit('/', 1)[1][:-3]}.cpython-311.pyc")
                for f in files
            ),
        ),
        labels={f"{LABEL_NS}.patch": "dspark-mtp-buffer", f"{LABEL_NS}.variant": "0.33"}
        | {f"{LABEL_NS}.post-sha256.{n}": f.post_sha256 or "" for n, f in enumerate(files)},
        steps=(
            StepReport(name="locate", status="ok", seconds=0.8),
            StepReport(name="plan", status="ok", seconds=0.1),
            StepReport(name="write", status="ok", seconds=0.3),
            StepReport(name="compile", status="ok", seconds=0.6),
            StepReport(name="probe", status="ok", seconds=7.5),
            StepReport(name="commit", status="ok", seconds=1.2),
        ),
        notes=("probe ran on CPU (CUDA_VISIBLE_DEVICES=\"\")",),
    )


FAILED_DETAIL = "AssertionError: poison residual was read in all-staged branch\x1b[0m"


def failed_probe_report() -> AuditReport:
    """The patch placed and compiled but the probe caught a read of the MTP residual: no tag."""
    files = file_reports()
    return dataclasses.replace(
        applied_report(),
        status="failed",
        exit_code=1,
        result_image=None,
        layer=None,
        labels={},
        probe=ProbeReport(
            ok=False,
            ran=True,
            cases=(
                ProbeCase(name="ordinary", ok=True, detail="ok"),
                ProbeCase(name="partial-graph-staging", ok=True, detail="ok"),
                ProbeCase(name="all-staged", ok=False, detail=FAILED_DETAIL),
            ),
        ),
        steps=(StepReport(name="probe", status="failed", seconds=6.9, detail="1 of 3 cases failed"),),
        errors=(
            ErrorReport(
                kind="probe-failed",
                message="probe case all-staged failed: poison residual was read",
                hint="the patch does not do what it claims on this release; do not ship this image",
                exit_code=1,
            ),
        ),
        files=files,
    )


def drifted_report() -> AuditReport:
    """A local tree where the first hunk's context is not found: nothing written, no check evidence."""
    return AuditReport(
        command="apply",
        status="failed",
        exit_code=1,
        tool_version="0.1.0",
        started_at="2025-11-29T14:21:00Z",
        target=TargetReport(
            kind="local",
            ref="/srv/site-packages",
            distribution=DistributionInfo(name="vllm", version="0.33.0", location="/srv/site-packages"),
        ),
        patch=patch(),
        errors=(
            ErrorReport(
                kind="hunk-does-not-apply",
                message="vllm/v1/worker/gpu_model_runner.py hunk #1: context not found at zero fuzz",
                hint="the file differs from the reviewed release; rebase the patch on it",
                exit_code=1,
            ),
        ),
    )


REPORTS = {"applied": applied_report, "failed-probe": failed_probe_report, "drifted": drifted_report}


def validate(doc: dict) -> None:
    jsonschema.Draft202012Validator(load_schema(), format_checker=jsonschema.FormatChecker()).validate(doc)


# --- audit.json -------------------------------------------------------------------------
def test_shipped_schema_is_a_valid_draft_2020_12_schema() -> None:
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("name", REPORTS)
def test_json_validates_against_the_schema_and_round_trips(name: str) -> None:
    report = REPORTS[name]()
    text = to_json(report)
    doc = json.loads(text)
    validate(doc)
    assert doc["schema"] == "dspark-patch/audit/v1"
    assert from_json_dict(doc) == report


def test_json_has_the_contract_field_names() -> None:
    doc = to_data(applied_report())
    assert list(doc) == [
        "schema", "command", "status", "exit_code", "tool_version", "started_at", "target", "route",
        "result_image", "patch", "series", "superseded", "files", "compile", "probe", "integrity", "layer", "labels",
        "index", "platforms", "attestations", "checks", "steps", "errors", "notes",
    ]  # fmt: skip
    assert doc["target"]["distribution"] == {"name": "vllm", "version": "0.33.0", "location": SITE}
    assert doc["target"]["image"] == {"ref": "vllm-serving:0.33.0", "id": SOURCE_ID, "repo_digest": None}
    assert doc["result_image"]["id"] == RESULT_ID
    assert set(doc["patch"]) == {"id", "variant", "sha256", "source", "hash_checks", "review"}
    assert doc["files"][1]["hunks"] == [{"index": 1, "source_start": 200, "applied_at": 200, "offset": 0, "fuzz": 0}]
    assert doc["labels"][f"{LABEL_NS}.patch"] == "dspark-mtp-buffer"
    assert [c["name"] for c in doc["probe"]["cases"]] == list(PROBE_CASES)


def _mutate(doc: dict, path: str, value: object) -> dict:
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("status", "patched"),                      # not a status
        ("status", "verified"),                     # a verify status on an apply run
        ("exit_code", 1),                           # "applied" but a failing exit code
        ("files.0.hunks.0.fuzz", 2),                # we never fuzz
        ("files.0.pre_sha256", "ABC"),              # not a sha256
        ("target.image.id", "1234"),                # not an image id
        ("target.kind", "vm"),
        ("probe.cases.0.ok", "yes"),
        ("layer.changes.0.kind", "M"),
        ("labels.x", 3),
        ("surprise", True),                         # unknown top-level field
        ("files.0.hunks.0.lines", 3),               # unknown nested field
        ("errors", [{"kind": "x", "message": "y", "hint": None, "exit_code": 0}]),
        ("notes", KeyError),                        # required field missing
    ],
)
def test_schema_is_strict(path: str, value: object) -> None:
    doc = _mutate(to_data(applied_report()), path, value)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_schema_requires_a_failed_run_to_say_why() -> None:
    doc = to_data(failed_probe_report())
    validate(doc)
    doc["errors"] = []
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_from_json_dict_names_the_bad_field() -> None:
    doc = to_data(applied_report())
    del doc["files"][2]["post_sha256"]
    with pytest.raises(BadInput, match=r"files\[2\]: 'post_sha256' is a required property"):
        from_json_dict(doc)
    with pytest.raises(BadInput, match="status: 'patched' is not one of"):
        from_json_dict({**to_data(applied_report()), "status": "patched"})
    with pytest.raises(BadInput, match="dspark-patch/audit/v2"):
        from_json_dict({**to_data(applied_report()), "schema": "dspark-patch/audit/v2"})


def test_reading_checks_what_only_the_schema_says() -> None:
    # Rules a type check alone would let through: a run that failed without saying why, an
    # "applied" run with a failing exit code, a fuzz other than 0.
    failed = to_data(failed_probe_report())
    failed["errors"] = []
    applied = {**to_data(applied_report()), "exit_code": 1}
    fuzzed = to_data(applied_report())
    fuzzed["files"][0]["hunks"][0]["fuzz"] = 2
    for doc in (failed, applied, fuzzed):
        with pytest.raises(BadInput, match="^audit report: "):
            from_json_dict(doc)


def test_read_report_errors_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(TargetNotFound) as missing:
        read_report(tmp_path / "audit.json")
    assert missing.value.exit_code == 2
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(BadInput, match="not JSON"):
        read_report(tmp_path / "bad.json")
    (tmp_path / "latin1.json").write_bytes(b'{"notes": ["caf\xe9"]}')
    with pytest.raises(BadInput, match="not UTF-8"):
        read_report(tmp_path / "latin1.json")
    doc = to_data(applied_report())
    doc["target"]["kind"] = "vm"
    (tmp_path / "vm.json").write_text(json.dumps(doc))
    with pytest.raises(BadInput) as invalid:
        read_report(tmp_path / "vm.json")
    assert invalid.value.exit_code == 2
    assert invalid.value.message == f"{tmp_path / 'vm.json'}: audit report: target.kind: 'vm' is not one of ['local', 'image']"


# --- audit.md ---------------------------------------------------------------------------
def test_markdown_puts_the_verdict_first_then_every_hash_hunk_and_probe_case() -> None:
    report = applied_report()
    md = to_markdown(report)
    first = md.splitlines()[0]
    assert first.startswith("## ✅") and "applied" in first
    assert "registry.local:5000/vllm-serving:0.33.0-dspark" in md.split("### Target")[0]  # the one-liner names the result
    for f in report.files:
        assert f.path in md and f.pre_sha256 in md and f.post_sha256 in md
    assert md.count("✅ matches") == 2 * len(report.files)
    for name in PROBE_CASES:
        assert f"`{name}`" in md
    assert SOURCE_ID in md and RESULT_ID in md and RESULT_MANIFEST in md
    assert "| 1 | 100 | 99 | -1 | 0 |" in md  # hunk placement: header line, placed at, offset, fuzz
    assert "cpython-311.pyc" in md  # the layer's content
    assert "0.33.0" in md and "`0.33`" in md  # release and variant


def test_markdown_of_a_failure_says_why_and_what_to_do_before_the_evidence() -> None:
    md = to_markdown(failed_probe_report())
    assert md.splitlines()[0].startswith("## ❌") and "failed" in md.splitlines()[0]
    head = md.split("### Target")[0]
    assert "probe case all-staged failed" in head
    assert "What to do: the patch does not do what it claims" in head
    probe = md.split("### Probe")[1]
    assert "| `all-staged` | ❌ |" in probe and "| `ordinary` | ✅ |" in probe


def test_markdown_shows_a_hash_that_differs() -> None:
    report = applied_report()
    bad = dataclasses.replace(report.files[0], pre_sha256=sha("someone edited it"))
    md = to_markdown(dataclasses.replace(report, files=(bad, *report.files[1:]), status="failed", exit_code=1))
    assert sha("someone edited it") in md and "❌ differs" in md


# --- junit.xml --------------------------------------------------------------------------
def _junit(report: AuditReport) -> ET.Element:
    return ET.fromstring(to_junit(report).encode())


def test_junit_of_a_good_run_has_one_passing_case_per_check_and_probe_case() -> None:
    root = _junit(applied_report())
    suite = root.find("testsuite")
    assert suite is not None
    names = [tc.get("name") for tc in suite.iter("testcase")]
    for f in FILES:
        for check in ("pre-image", "placement", "post-image", "compile"):
            assert f"{check}: {f}" in names
    for name in PROBE_CASES:
        assert f"probe: {name}" in names
    assert {"layer: exactly the expected files", "labels: name every post-image hash", "integrity: 2113 files of the published wheel"} <= set(names)
    assert suite.get("failures") == root.get("failures") == "0"
    assert int(suite.get("tests")) == len(names)


def test_junit_counts_exactly_the_failing_probe_case() -> None:
    root = _junit(failed_probe_report())  # the detail carries an ANSI escape; still parses
    failing = [tc for tc in root.iter("testcase") if tc.find("failure") is not None]
    assert [tc.get("name") for tc in failing] == ["probe: all-staged"]
    assert root.get("failures") == root.find("testsuite").get("failures") == "1"
    assert "poison residual was read" in failing[0].find("failure").text


def test_junit_shows_a_failure_no_check_covers() -> None:
    root = _junit(drifted_report())
    failing = [tc for tc in root.iter("testcase") if tc.find("failure") is not None]
    assert [tc.get("name") for tc in failing] == ["run: hunk-does-not-apply"]
    assert "hunk #1" in failing[0].find("failure").get("message")
    assert root.get("failures") == "1"


def test_junit_fails_a_file_whose_hash_differs_and_a_label_set_that_misses_it() -> None:
    report = applied_report()
    wrong = dataclasses.replace(report.files[2], post_sha256=sha("drifted"))
    root = _junit(dataclasses.replace(report, files=(*report.files[:2], wrong)))
    failing = sorted(tc.get("name") for tc in root.iter("testcase") if tc.find("failure") is not None)
    assert failing == ["labels: name every post-image hash", "post-image: vllm/envs.py"]
    assert root.get("failures") == "2"


# --- in-toto ----------------------------------------------------------------------------
def test_intoto_statement_names_the_result_image_and_carries_the_audit() -> None:
    report = applied_report()
    st = to_intoto(report, subject_name="registry.local:5000/vllm-serving", subject_digest=RESULT_ID)
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == PREDICATE_TYPE == "https://github.com/dspark-patch/attestation/audit/v1"
    assert st["subject"] == [{"name": "registry.local:5000/vllm-serving", "digest": {"sha256": RESULT_ID.removeprefix("sha256:")}}]
    validate(st["predicate"])
    assert from_json_dict(st["predicate"]) == report


def test_intoto_refuses_a_digest_that_is_not_sha256() -> None:
    with pytest.raises(BadInput, match="not a sha256"):
        to_intoto(applied_report(), subject_name="x", subject_digest="md5:abc")


def test_render_intoto_needs_a_result_image() -> None:
    with pytest.raises(BadInput, match="no result image"):
        render_as(failed_probe_report(), "intoto")


# --- report folder and step summary -----------------------------------------------------
def test_report_dir_holds_every_form_and_the_attestation_names_the_pushed_digest(tmp_path: Path) -> None:
    report = applied_report()
    written = write_report_dir(report, tmp_path / "reports")
    assert [p.name for p in written] == ["audit.json", "audit.md", "junit.xml", "attestation.intoto.json", "predicate.json"]
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == sorted(p.name for p in written)  # no temp files
    audit = json.loads((tmp_path / "reports/audit.json").read_text())
    assert audit == to_data(report)
    assert read_report(tmp_path / "reports/audit.json") == report
    statement = json.loads((tmp_path / "reports/attestation.intoto.json").read_text())
    # After a push, the subject is the registry manifest digest: what cosign signs and policies check.
    assert statement["subject"] == [{"name": "registry.local:5000/vllm-serving", "digest": {"sha256": RESULT_MANIFEST}}]
    assert json.loads((tmp_path / "reports/predicate.json").read_text()) == statement["predicate"] == audit
    ET.parse(tmp_path / "reports/junit.xml")


def test_unpushed_result_is_attested_by_its_image_id(tmp_path: Path) -> None:
    report = applied_report()
    report = dataclasses.replace(report, result_image=dataclasses.replace(report.result_image, repo_digest=None))
    write_report_dir(report, tmp_path)
    statement = json.loads((tmp_path / "attestation.intoto.json").read_text())
    assert statement["subject"][0]["digest"]["sha256"] == RESULT_ID.removeprefix("sha256:")


def test_a_failed_run_in_a_reused_folder_leaves_no_old_attestation(tmp_path: Path) -> None:
    write_report_dir(applied_report(), tmp_path)
    written = write_report_dir(failed_probe_report(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written) == ["audit.json", "audit.md", "junit.xml"]
    assert json.loads((tmp_path / "audit.json").read_text())["status"] == "failed"


def test_step_summary_is_appended_not_overwritten(tmp_path: Path) -> None:
    summary = tmp_path / "step_summary.md"
    summary.write_text("## Build image\nbuilt vllm-serving:0.33.0")  # an earlier step, no final newline
    append_step_summary(applied_report(), summary)
    append_step_summary_from_env(failed_probe_report(), {"GITHUB_STEP_SUMMARY": str(summary)})
    text = summary.read_text()
    assert text.startswith("## Build image\nbuilt vllm-serving:0.33.0\n\n## ✅ dspark-patch apply: applied")
    assert text.count("## ✅") == 1 and text.count("## ❌") == 1
    assert text.index("## ✅") < text.index("## ❌")


def test_no_step_summary_outside_ci(tmp_path: Path) -> None:
    assert append_step_summary_from_env(applied_report(), {}) is None


def verified_report() -> AuditReport:
    """`verify --image` on the result: the files hold only their post-images."""
    applied = applied_report()
    files = tuple(dataclasses.replace(f, pre_sha256=None, hunks=()) for f in applied.files)
    return dataclasses.replace(
        applied, command="verify", status="verified", target=dataclasses.replace(applied.target, image=applied.result_image),
        result_image=None, layer=None, files=files,
    )  # fmt: skip


def test_verify_report_compares_only_post_images() -> None:
    report = verified_report()
    validate(to_data(report))
    md = to_markdown(report)
    assert md.splitlines()[0] == "## ✅ dspark-patch verify: verified"
    assert "| before |" not in md.split("### Files")[1] and md.count("| now |") == 3
    names = [tc.get("name") for tc in _junit(report).iter("testcase")]
    assert not any(n.startswith(("pre-image", "placement")) for n in names)
    assert sum(n.startswith("post-image") for n in names) == 3


def test_already_applied_is_not_shown_as_a_pre_image_mismatch() -> None:
    applied = applied_report()
    files = tuple(dataclasses.replace(f, pre_sha256=f.post_sha256) for f in applied.files)  # the file already is the post-image
    report = dataclasses.replace(applied, status="already-applied", files=files, result_image=None, layer=None, labels={})
    validate(to_data(report))
    assert "❌" not in to_markdown(report)
    assert _junit(report).get("failures") == "0"
