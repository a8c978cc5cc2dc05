"""Probe of the vllm-math-positive-divisor patch set (stdlib only; never imports vllm).

Loads vllm/utils/math_utils.py from --site by file path (vLLM's package __init__ pulls in its
whole dependency tree, which a serving check does not need) and checks two behaviours:

- cdiv-positive-divisor: cdiv keeps its results for positive divisors and raises ValueError
  naming the divisor for 0 and a negative one;
- round-up-positive-multiple: the same for round_up.

Contract (shared by every patch set's probe): `--site DIR --json`; stdout one JSON object
{"schema": "dspark-patch/probe/v1", "ok": bool, "cases": [{"name", "ok", "detail"}]};
exit 0 all cases pass, 1 a case failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

SCHEMA = "dspark-patch/probe/v1"
MODULE = "vllm/utils/math_utils.py"


def load(site: Path):
    spec = importlib.util.spec_from_file_location("dspark_probe_math_utils", site / MODULE)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(site / MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refuses(fn, *args) -> str:
    """'' when fn(*args) raises ValueError naming the bad value, else what happened instead."""
    bad = args[-1]
    try:
        got = fn(*args)
    except ValueError as exc:
        return "" if str(bad) in str(exc) else f"ValueError without the value {bad}: {exc}"
    except Exception as exc:  # the unpatched file: ZeroDivisionError for 0
        return f"{fn.__name__}{args} raised {type(exc).__name__}, not ValueError"
    return f"{fn.__name__}{args} returned {got!r} instead of refusing"


def case(name: str, fn, expected) -> dict:
    wrong = [f"{fn.__name__}{args} = {fn(*args)}, expected {want}" for args, want in expected if fn(*args) != want]
    wrong += [w for w in (refuses(fn, 7, 0), refuses(fn, 7, -2)) if w]
    detail = "; ".join(wrong) if wrong else f"{fn.__name__}: {len(expected)} positive divisors unchanged; 0 and -2 refused"
    return {"name": name, "ok": not wrong, "detail": detail}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", required=True, type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not (args.site / MODULE).is_file():
        print(f"probe: {args.site / MODULE} not found", file=sys.stderr)
        return 2
    math_utils = load(args.site)
    cases = [
        case("cdiv-positive-divisor", math_utils.cdiv, [((7, 2), 4), ((8, 2), 4), ((0, 3), 0), ((1, 4096), 1)]),
        case("round-up-positive-multiple", math_utils.round_up, [((7, 4), 8), ((8, 4), 8), ((0, 16), 0), ((4097, 4096), 8192)]),
    ]
    ok = all(c["ok"] for c in cases)
    if args.json:
        print(json.dumps({"schema": SCHEMA, "ok": ok, "cases": cases}))
    else:
        for c in cases:
            print(f"{'PASS' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
