"""The one rule for free text copied into evidence: error lines, step details, notes.

Reports travel: the attestation is pushed beside the image, and CI uploads audit.*, junit.xml
and status.* as artifacts. An error line written for the user at the terminal may name things
a published report should not (docs/evidence.md):

- a user name or password in a URL or reference (`https://user:pw@host`, `ssh://user@host`,
  `user:pw@host/repo`): `***@host`;
- the engine's address, `DOCKER_HOST` (an `ssh://` login, an internal `tcp://` address):
  `$DOCKER_HOST`;
- a path under this host's home folder ($HOME: the docker config's, a checkout's), which names the user: `~/...`; a home folder inside an image (its USER's site) is a fact of the verdict and stays.

The report model applies `redact` when a record is built (`ErrorReport`, `StepReport`,
`AuditReport.notes`, `ImageStatus.error`), so every renderer and every writer gets the same
text; stderr gets the exception's own line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# `scheme://userinfo@` and `userinfo@host/...` (a reference's userinfo: what precedes '@' is
# followed, in the same word, by a '/'; a digest `repo@sha256:...` never holds one).
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^\s/@]+@")
_REF_USERINFO = re.compile(r"(?<![^\s'\"(<])[^\s/@'\"()<>]+@(?=[^\s@'\"]*/)")
# Only this host's own home folder ($HOME) is redacted: a path like /home/vllm/.local in an
# error is the image's (the user site that runs first) and is what the verdict is about.


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` as a published report may hold it (the rules in this module's docstring)."""
    if not text:
        return text
    env = os.environ if environ is None else environ
    docker_host = env.get("DOCKER_HOST", "")
    if docker_host:
        text = text.replace(docker_host, "$DOCKER_HOST")
    home = env.get("HOME", "").rstrip("/")
    if home and home != "/" and home.count("/") >= 1:
        text = re.sub(rf"{re.escape(home)}(?=/|\s|$|['\"),:;])", "~", text)
    text = _URL_USERINFO.sub(r"\g<scheme>***@", text)
    return _REF_USERINFO.sub("***@", text)


def redact_all(texts: tuple[str, ...], environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    return tuple(redact(t, environ) for t in texts)
