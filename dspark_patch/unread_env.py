"""Configuration nothing reads: a variable a known patch set introduces, set by an image whose
installed release does not read it. A note, never a finding.

Teams set a patch set's flag in their image's Env (`VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER=1`) and
keep it when they move to a release that has the change upstream in its own form (vLLM 0.34.0:
`needs_mtp_hidden_buffer`, no flag); the variable then does nothing, and says to a reader that
something is switched on. vLLM reads its variables in `vllm/envs.py`, by name, as string
literals (`environment_variables = {"VLLM_...": ...}`), so a name that is no string literal
there is read by nothing of vLLM's.

A patch set names what it introduces (`env = [...]` in its patch.toml, checked on load against
its diffs' added lines in that file: patchset.py), so an applied set's `vllm/envs.py` is its
post-image, which holds each name: the rule needs no patch-set state. Pure: the caller hands the
image's config, the patch sets and a way to read a file of the site folder.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .patchset import ENVS_FILE, PatchSet, known
from .targets.image_start import unwrap
from .targets.imageconfig import image_argv, image_env

ENV = "the image's Env"
ENTRYPOINT = "the image's entrypoint (env NAME=VALUE)"


def settings(config: Mapping[str, Any]) -> dict[str, str]:
    """Each variable the image sets, and where: its Env, or the entrypoint's `env NAME=VALUE`
    (the runtime model's reading of it, targets/image_start.py `unwrap`), which wins."""
    found = dict.fromkeys(image_env(config), ENV)
    found.update(dict.fromkeys(unwrap(image_argv(config))[1], ENTRYPOINT))
    return found


def reads(envs_py: bytes, name: str) -> bool:
    """Whether `name` is a string literal in vLLM's envs.py (in any quotes)."""
    return re.search(rb"""(['"])""" + re.escape(name.encode()) + rb"\1", envs_py) is not None


def notes(set_in: Mapping[str, str], patchsets: Iterable[PatchSet], read: Callable[[str], bytes | None], *,
          distribution: str, release: str) -> list[str]:
    """One line per variable a known patch set introduces that `set_in` (name -> where, as
    `settings` gives it) sets and the installed release's envs.py does not read. Nothing when
    envs.py cannot be read: then nothing is known."""
    wanted = [(name, p) for p in known(patchsets) if p.distribution.lower() == distribution.lower()
              for name in p.env if name in set_in]
    envs_py = read(ENVS_FILE) if wanted else None
    if envs_py is None:
        return []
    lines = []
    for name, patchset in wanted:
        if reads(envs_py, name):
            continue
        covered = any(release in v.releases for v in patchset.variants)
        fix = f"apply {patchset.id}, or remove it" if covered else "remove it"
        lines.append(f"{name} is set in {set_in[name]} but {distribution} {release} does not read it "
                     f"(introduced by {patchset.id}): {fix}")
    return list(dict.fromkeys(lines))
