"""Consumer CPU probe for the dspark-skip-mtp-buffer patch set (stdlib + torch): the entry.

Run by the target's own interpreter, never importing vLLM (images may lack its GPU
libraries):

    PYTHON -B probe.py --site SITE_PACKAGES_DIR [--json]     (from this folder)
    PYTHON -B -c "<bundle>" --site SITE_PACKAGES_DIR          (dspark_patch.probe.run.bundle)

The probe is split by idea into the probe_* modules next to it (patch.toml lists them after
this entry); the runner bundles them into the one source it sends. It carries the claim
"nothing on the DSpark Model Runner V2 path reads _mtp_hidden_buffer when the patch leaves it
unallocated" from the *installed* sources alone (no hashes), reading each release's own
structure rather than 0.33.0's method names:

- probe_census: every reference to the buffer, its accessor and the drafter helper in the
  whole installed vllm tree, found by AST, each with a verdict (reached on the DSpark V2 path
  or not, None-safe or not; an unguarded reader on the path fails, named by file:line); the
  consumer that chooses between aux states and the residual (a method of its own in 0.33.0,
  inline in propose in 0.32.0); the layer-id resolver the V2 runner reaches;
- probe_decision: the patched function driven with that resolver and the tree's own
  SpeculativeConfig methods, over every speculative method the tree declares, V1/V2, PP 1/2,
  the flag unset/0/1/invalid and layer ids at and beyond their bounds;
- probe_allocation: the allocation site in DeepseekV4Model.__init__;
- probe_consumers: the consumer, graph-replay preparation and the FULL graph's context step
  run with a poison residual that fails on any read; every other method receiving the
  residual may only hand it on; the drafter helper's fallback;
- probe_runner: the V2 runner's call sites that feed the drafter.

Each case is registered by name (probe_common.case) and named after the promise it guards;
where a release lacks what a case checks, the case says "not present in this release" and
passes only if the case carrying the claim instead passes. Stdout: one JSON object
{"schema", "ok", "cases": [{"name", "ok", "detail"}], "census": [...]}.
Exit 0 all cases pass, 1 any case failed, 2 bad usage, 3 torch not importable. Writes
nothing to disk and does not rely on __file__.
"""
from __future__ import annotations

import argparse
import ast
import gc
import json
import sys
from pathlib import Path

from probe_allocation import (
    allocation_case,
)
from probe_census import (
    Ref,
    Scan,
    census_case,
    dspark_mro,
    find_consumer,
    forward_case,
    mro_definitions,
    resolved_methods,
    run_census,
    runner_resolver,
    scan_tree,
)
from probe_common import (
    AUX_RESOLVER_FN,
    C_ALLOC,
    C_CENSUS,
    C_EFFECT,
    C_FORWARD,
    C_IMPORTS,
    C_METHODS,
    C_NO_VLLM,
    C_PASSES,
    C_RESOLUTION,
    C_RESOLVER,
    C_RUNNER,
    CASES,
    CONSUMER_CLASS,
    CONSUMER_METHOD,
    DECISION_FN,
    DRAFTER_FN,
    ENVS_FILE,
    MODEL_FILE,
    PATCH_SET,
    REPLAY_METHOD,
    SCHEMA,
    SPEC_CONFIG_CLASS,
    SPEC_CONFIG_FILE,
    SPEC_METHOD_LITERAL,
    CaseResult,
    Missing,
    Sources,
    not_present,
)
from probe_consumers import (
    InlineSlice,
    _pad_slot_id,
    compile_methods,
    consumer_branch_case,
    consumer_runner,
    drafter_fallback_case,
    drafter_helper_present,
    graph_forward_case,
    negative_control_case,
    replay_case,
    residual_passing_case,
)
from probe_decision import (
    Decision,
    Envs,
    decision_cases,
    envs_registration_case,
    invalid_flag_case,
    load_envs,
    load_spec_config_class,
)
from probe_effect import (
    EFFECT_WHERE,
    effect_case,
)
from probe_runner import (
    runner_case,
)


class _NoVllmImports:
    """Turns any import of vllm during the probe into an error (a case then fails)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "vllm" or fullname.startswith("vllm."):
            raise ImportError(f"the probe must not import {fullname}")
        return None


def _failed(exc: Exception) -> str:
    return str(exc) if isinstance(exc, Missing) else f"{type(exc).__name__}: {exc}"


def run_cases(site: Path, torch, scan: Scan | None = None) -> tuple[list[CaseResult], list[Ref]]:
    """Every case, on the tree at `site`; `scan`: the census's walk of that tree, made beside
    (`--census-from`), else walked here."""
    sources = Sources(site)
    cases: list[CaseResult] = []

    try:
        envs, envs_problem = load_envs(sources)
    except Exception as exc:
        envs, envs_problem = Envs({}), f"reading {ENVS_FILE} failed: {_failed(exc)}"
    cases.append(envs_registration_case(envs, envs_problem))

    # What the installed tree declares: speculative methods, SpeculativeConfig's own
    # predicates, DSpark's classes and the resolver its speculator uses.
    spec_cls, methods = None, []
    try:
        spec_cls, methods = load_spec_config_class(sources)
        cases.append(CaseResult(C_METHODS, "dspark" in methods and "dflash" in methods,
                               f"{len(methods)} methods from {SPEC_METHOD_LITERAL} in "
                               f"{SPEC_CONFIG_FILE}: {', '.join(methods)}"))
    except Exception as exc:
        cases.append(CaseResult(C_METHODS, False, _failed(exc)))
    mro: list[tuple[str, ast.ClassDef]] = []
    mro_problem = ""
    try:
        mro = dspark_mro(sources)
    except Exception as exc:
        mro_problem = _failed(exc)
    resolver, resolver_file, resolver_how = None, "", ""
    try:
        resolver, resolver_file, resolver_how = runner_resolver(sources, mro)
    except Exception as exc:
        resolver_file = _failed(exc)
    decision = None
    try:
        decision = Decision(sources, envs)
        if decision.problems:
            cases.append(CaseResult(C_IMPORTS, False, "; ".join(decision.problems)))
            decision = None
        else:
            cases.append(CaseResult(C_IMPORTS, True, f"{DECISION_FN} in {MODEL_FILE}: "
                                   + (", ".join(decision.resolved) or "no imported names")))
    except Exception as exc:
        cases.append(CaseResult(C_IMPORTS, False, _failed(exc)))
    if decision is None:
        cases.append(CaseResult(C_RESOLVER, False, f"{DECISION_FN} could not be loaded"))
    elif resolver is None:
        cases.append(CaseResult(C_RESOLVER, False, f"the runner's resolver: {resolver_file}"))
    elif decision.resolver_from is None:
        cases.append(CaseResult(C_RESOLVER, False, f"{DECISION_FN} does not call "
                               f"{AUX_RESOLVER_FN}: it bypasses the runner's layer-id resolver"))
    elif decision.resolver_from[0] != resolver_file:
        cases.append(CaseResult(C_RESOLVER, False, f"{DECISION_FN} takes {AUX_RESOLVER_FN} from "
                               f"{decision.resolver_from[0]}, the runner from {resolver_file}"))
    else:
        cases.append(CaseResult(C_RESOLVER, True, f"{AUX_RESOLVER_FN} from {resolver_file}, as the "
                               f"DSpark V2 path takes it: {resolver_how}"))
    ready = decision is not None and spec_cls is not None and resolver is not None
    cases.extend(decision_cases(torch, decision if ready else None, spec_cls, methods, resolver))
    cases.append(invalid_flag_case(torch, decision if ready else None, spec_cls, methods))
    if spec_cls is None:
        cases.append(CaseResult(C_ALLOC, False, f"{SPEC_CONFIG_CLASS} could not be loaded"))
    else:
        cases.append(allocation_case(torch, sources, decision, envs, spec_cls))
    if spec_cls is None:
        cases.append(CaseResult(C_EFFECT, False, f"{SPEC_CONFIG_CLASS} could not be loaded"))
    else:
        cases.append(effect_case(torch, sources, decision, envs, spec_cls, methods))

    # The consumers: every DSparkSpeculator method that touches target hidden states, found
    # by structure (the choice between aux states and the residual), run as DSpark runs them.
    found, consumer, consumer_problem = None, None, ""
    resolved: dict[str, tuple[str, str, ast.FunctionDef]] = resolved_methods(mro) if mro else {}
    if mro:
        try:
            found = find_consumer(mro)
            consumer = consumer_runner(torch, found)
        except Exception as exc:
            consumer_problem = _failed(exc)
    prefill = None  # where the consumer is inline: does a FULL-graph step combine its rows first?
    if found is not None and consumer is not None and found.layout == "inline":
        ok, why = InlineSlice(found).eager_before_graph()
        prefill = CaseResult(f"FULL-graph prefill: {found.cname}.{found.name} combines every row eagerly", ok, why)
    why = mro_problem or consumer_problem
    branches = {b: consumer_branch_case(torch, consumer, b, found, prefill, why)
                for b in ("ordinary", "partial-graph-staging", "all-staged")}
    if consumer is None or found is None:
        cases.append(CaseResult(C_RESOLUTION, False, mro_problem or consumer_problem or
                               f"{CONSUMER_METHOD} is not defined on {CONSUMER_CLASS} or its bases"))
    elif found.name == CONSUMER_METHOD:
        names = [c.name for _r, c in mro]
        chain = " -> ".join(f"{c.name} ({r})" for r, c in mro[: names.index(found.cname) + 1])
        via = f" ({'; '.join(found.passed)})" if found.passed else ""
        cases.append(CaseResult(C_RESOLUTION, True, f"{CONSUMER_CLASS}.{CONSUMER_METHOD} from {chain}{via}"))
    else:
        cases.append(not_present(C_RESOLUTION, f"no {CONSUMER_METHOD}: the choice between aux states and "
                                 f"the residual is made {'inline in' if found.layout == 'inline' else 'in'} "
                                 f"{found.describe()}", branches["ordinary"]))
    cases.extend(branches.values())
    cases.append(negative_control_case(torch, consumer, why))
    pad_slot = _pad_slot_id(sources)
    # The graph-replay bench calls the consumer DSpark runs (past pass-through overrides).
    runs = {**resolved, found.name: (found.rel, found.cname, found.fn)} if found is not None else resolved
    compiled = compile_methods(torch, runs, pad_slot) if resolved else {}
    cases.append(replay_case(torch, compiled, pad_slot, prefill))
    cases.append(graph_forward_case(torch, compiled, resolved, pad_slot,
                                    inline=consumer if prefill is not None else None))
    run_with_poison = {REPLAY_METHOD} | ({found.name} if found is not None and found.layout == "method" else set())
    cases.append(residual_passing_case(mro_definitions(mro), found, run_with_poison) if resolved else
                 CaseResult(C_PASSES, False, mro_problem or f"{CONSUMER_CLASS} not resolved"))

    # The census: every reader of the buffer in the installed tree.
    refs: list[Ref] = []
    helper = drafter_helper_present(sources)
    try:
        refs, problems = run_census(sources, {(rel, c.name) for rel, c in mro}, scan)
        census = census_case(refs, problems)
        cases.append(forward_case(refs))
        cases.append(runner_case(refs, helper))
        cases.append(census)
    except Exception as exc:
        census = None
        for name in (C_FORWARD, C_RUNNER, C_CENSUS):
            cases.append(CaseResult(name, False, f"census failed: {_failed(exc)}"))
    named = any(r.symbol == DRAFTER_FN and r.kind != "definition" for r in refs)
    cases.append(drafter_fallback_case(torch, sources, census, referenced=named))

    loaded = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
    cases.append(CaseResult(C_NO_VLLM, not loaded,
                           f"vllm modules imported: {loaded}" if loaded else
                           "no vllm module was imported"))
    return in_registered_order(cases), refs


def in_registered_order(cases: list[CaseResult]) -> list[CaseResult]:
    """The cases in the order the modules registered their names; a registered case nobody
    reported, or a reported one nobody registered, fails."""
    by_name: dict[str, CaseResult] = {}
    for c in cases:
        if c.name in by_name:
            by_name[c.name] = CaseResult(c.name, False, f"reported twice: {by_name[c.name].detail} / {c.detail}")
        else:
            by_name[c.name] = c
    out = [by_name.pop(n, None) or CaseResult(n, False, "registered, but no module reported it") for n in CASES]
    return out + [CaseResult(c.name, False, f"not a registered case: {c.detail}") for c in by_name.values()]


CENSUS_SCHEMA = "dspark-skip-mtp-buffer/census-walk/v1"


def _scan_from(path: str | None, site: Path) -> Scan | None:
    """The walk --census wrote to `path` for this very `site` (read to its end: the child may
    still be walking), or None: then run_cases walks the tree itself."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.loads(fh.read())
        if not isinstance(doc, dict) or doc.pop("schema", None) != CENSUS_SCHEMA or doc.pop("site", None) != str(site):
            return None
        return Scan.from_json(doc)
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="probe.py", description=f"CPU probe for the {PATCH_SET} patch set"
    )
    parser.add_argument("--site", required=True, help="site-packages folder holding vllm/")
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    # The census's walk needs no torch: where the probe starts early (patch.toml probe_beside),
    # a child of the early process runs it with --census beside torch's import, after the same
    # go-ahead, and the probe reads its output with --census-from (unreadable: it walks itself).
    parser.add_argument("--census", action="store_true", help="print only the census's walk (JSON) and exit")
    parser.add_argument("--census-from", metavar="PATH", help="the census's walk, as --census printed it")
    # A release that ships the change in its own form is judged on the effect cases alone (the
    # patch set's `superseded` record names them): the others are about the patch's own code.
    parser.add_argument("--only", metavar="CASE", action="append", default=[],
                        help="report and judge only this case (repeatable; an unknown name fails)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    site = Path(args.site)
    if not (site / "vllm").is_dir():
        print(f"probe.py: no vllm package under {site} (pass the site-packages folder)",
              file=sys.stderr)
        return 2
    if args.census:
        gc.disable()  # as below: the walk's trees are garbage only once the process ends
        guard = _NoVllmImports()
        sys.meta_path.insert(0, guard)
        try:
            doc = scan_tree(Sources(site)).as_json()
        finally:
            sys.meta_path.remove(guard)
        print(json.dumps({"schema": CENSUS_SCHEMA, "site": str(site), **doc}))
        return 0
    try:
        import torch
    except Exception as exc:  # the image's interpreter lacks torch: an environment problem
        print(f"probe.py: torch is not importable: {exc}", file=sys.stderr)
        return 3
    sys.dont_write_bytecode = True
    # The cases parse about 100 installed modules into ASTs that stay alive to the end (millions
    # of objects, beside torch's): every full collection walks them all, for no garbage, and that
    # was three quarters of the cases' time (natively 4.3 s -> 1.2 s; under qemu the same share).
    # The process ends once it has printed its verdict; nothing here relies on a collection.
    gc.disable()
    guard = _NoVllmImports()
    sys.meta_path.insert(0, guard)
    try:
        cases, refs = run_cases(site, torch, _scan_from(args.census_from, site))
    finally:
        sys.meta_path.remove(guard)
    if args.only:
        by_name = {c.name: c for c in cases}
        cases = [by_name.get(n) or CaseResult(n, False, "not a case of this probe") for n in dict.fromkeys(args.only)]
    ok = all(c.ok for c in cases)
    print(json.dumps({"schema": SCHEMA, "ok": ok, "cases": [c.as_json() for c in cases], "where": EFFECT_WHERE,
                      "census": [r.as_json() for r in refs]}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

