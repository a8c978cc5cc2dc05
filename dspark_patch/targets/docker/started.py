"""The image's own python, started as the image starts it (its USER, WORKDIR, Env, the
entrypoint's python and flags; targets/image_start.py), asked in the work container what it
imported at start and where it resolves the distribution (`inside/started.py`); the answer is
judged by targets/runtime.py `judge_started`. Findings only: code that ran first may lie.
"""

from __future__ import annotations

import json

from ...inside import source as inside_source
from .. import image_start, imageconfig, runtime
from .work_image import WorkImage


def as_started(image: WorkImage, distribution: str, location: str) -> tuple[str, ...]:
    """Findings from the image's python started as the image starts it, in `image`'s work
    container (module doc); nothing when the start is not a python the tool follows."""
    top = distribution.replace("-", "_").lower()
    config = image.source.config
    start = image_start.start_of(config, image.stat, image.read_small, what=f"{location}/{top}")
    argv = image_start.started_argv(start, top=top, source=inside_source("started"))
    if argv is None:
        return ()  # not a python the tool follows: `runs_first` names it as not verified
    user = str(config.get("User") or "0")
    workdir = str(config.get("WorkingDir") or "/")
    assigned = {k: v for k, v in start.env.items() if imageconfig.image_env(config).get(k) != v}
    result = image.container.call(argv, env=assigned, timeout=120 if image.emulated else 60, user=user,
                                  workdir=workdir)
    try:
        answer = json.loads(result.stdout[: 1 << 20]) if result.returncode == 0 else None
    except ValueError:
        answer = None
    if answer is None:
        said = (result.stderr.decode(errors="replace").strip().splitlines() or [f"exit {result.returncode}"])[-1]
        return (f"the image's python as the image starts it ({argv[0]} as user {user} in {workdir}) failed: "
                f"{said[-200:]}; what it runs before {location}/{top} is not verified",)
    return tuple(runtime.judge_started(answer, site=location, top=top))
