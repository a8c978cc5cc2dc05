"""scripts/test's set-up seeds the fixtures as the builders print them (tests/support/seed.py):
a builder that never prints the name asked for fails the set-up with one line naming it, instead
of leaving every registry test to push the 2 GB fixture again on the engine tier's clock."""

from __future__ import annotations

import subprocess
import sys

from tests.support.images import ROOT


def test_a_name_the_builder_never_printed_fails_with_one_line_naming_it():
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.seed", "vllm-fixture", "--into=podman"],
        input="base dspark-patch/bookworm-python:bookworm-0123456789ab\nvllm-fixture-0.32.0 x:1\n",
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "seed: the image builder printed no vllm-fixture line: nothing to put into the seed registry"
    ]
    assert done.stdout == ""
