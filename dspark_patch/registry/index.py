"""Image indexes in a registry: read one, list its platforms, compose and push a new one.

An index (OCI image index or Docker manifest list) names one image manifest per platform,
plus, from BuildKit, attestation manifests marked `unknown/unknown` that are not platforms.
A patched index must list exactly the source's platforms, in the source's order, with each
platform field as the source wrote it (os.version, variant, features...) and the source's
annotations; only the digests and sizes change. `republish` builds it that way from the source
descriptors and reads the result back (`check_republished`) before it can be pushed.

Manifests are kept as the bytes the registry served: a digest is the sha256 of those bytes, and
re-serialising JSON would change it. What a served body must be is `manifest.py`'s (strict,
pure). HTTP and credentials (Docker's config.json; basic or token auth) are oras-py's
(`oras.provider.Registry` and its session); this module chooses the requests and bounds them:
a timeout on each, one attempt (no minutes of back-off), a body of at most 4 MiB. Two answers
are not the registry's last word, and a read (GET, HEAD) is sent again for them: a 429 or 503
with `Retry-After` (seconds or an HTTP date), after the wait it asks for when that wait fits in
the request timeout (`retry_after`, at most `MAX_WAITS` times); and an answer broken off in its
body (the connection closed mid-answer), once.
"""

from __future__ import annotations

import email.utils
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from dspark_patch.errors import BadInput, CheckFailed, DsparkPatchError, EnvironmentProblem, TargetNotFound
from dspark_patch.imageref import ImageRef
from dspark_patch.registry.manifest import (
    ACCEPT,
    ATTESTATION_ANNOTATION,
    DOCKER_LIST,
    DOCKER_MANIFEST,
    IMAGE_TYPES,
    INDEX_TYPES,
    MANIFEST_LIMIT,
    OCI_INDEX,
    OCI_MANIFEST,
    BadManifest,
    Entry,
    ImageIndex,
    Manifest,
    digest_of,
    load_object,
    media_type_of,
    parse_index,
)
from dspark_patch.registry.platform_select import Platform

if TYPE_CHECKING:
    import oras.container
    import requests

# oras-py and requests are imported where a registry is first spoken to, not with this module:
# every command imports it, and those two cost a fifth of a second of each CLI start.

# A config or attestation blob read back through `fetch_blob`: bounded like a manifest, larger.
BLOB_LIMIT = 64 << 20
# The longest one answer may take in all: a registry that drips bytes under the read timeout
# must not hold a run for hours.
ANSWER_DEADLINE_S = 120.0
# How long one request may wait to connect and for each read, in seconds (pip's --timeout, for
# registries): a CI job on a slow link raises it, a check that must fail fast lowers it.
TIMEOUT_ENV = "DSPARK_PATCH_REGISTRY_TIMEOUT"
DEFAULT_TIMEOUT_S = 10.0
# A registry that sheds load (429 Too Many Requests, 503) says when to come back; a read waits
# that long at most this many times, each wait no longer than the request timeout.
MAX_WAITS = 3
_IDEMPOTENT = frozenset({"GET", "HEAD"})


def request_timeout() -> float:
    """$DSPARK_PATCH_REGISTRY_TIMEOUT (seconds, above 0, at most an hour), else 10."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:  # also NaN
        raise BadInput(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds between 0 and 3600",
                       hint=f"set it to the seconds a registry request may wait (default {DEFAULT_TIMEOUT_S:g}), or unset it")
    return value


class RegistryUnreachable(EnvironmentProblem):
    kind = "registry-unreachable"


class AnswerBrokenOff(RegistryUnreachable):
    """The connection closed in the middle of an answer's body: a read is sent once more."""


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """The seconds a `Retry-After` header asks to wait: delay-seconds or an HTTP date (RFC 9110
    10.2.3; a date already past is 0); None when it is absent or neither."""
    value = (value or "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():  # not str.isdigit alone: "²" is a digit to it, not to int()
        return float(int(value[-12:])) if len(value.lstrip("0")) <= 12 else float("inf")
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is in GMT and says so
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def registry_host(ref: str) -> str | None:
    """The registry a reference names (`127.0.0.1:5000/repo:tag` -> `127.0.0.1:5000`), or None
    for a Docker Hub name, whose first component is not a host (`ImageRef.host_of`)."""
    return ImageRef.host_of(ref)


def docker_config_file() -> str:
    """Where `docker login` keeps credentials: $DOCKER_CONFIG/config.json, else ~/.docker/config.json."""
    folder = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    return os.path.join(folder, "config.json")


def _has_login(config: str, host: str) -> bool:
    """Whether the docker config can give credentials for `host` (a helper or store is trusted to)."""
    try:
        with open(config, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict):
        return False
    if data.get("credsStore") or host in (data.get("credHelpers") or {}):
        return True
    return bool(((data.get("auths") or {}).get(host) or {}).get("auth"))


class RegistryRefused(EnvironmentProblem):
    """The registry answered, but refused: credentials, permissions, or a rejected manifest."""

    kind = "registry-refused"


def compose_index(
    *,
    media_type: str,
    images: Sequence[tuple[Manifest, Mapping[str, Any]]],
    annotations: Mapping[str, str] | None = None,
    attestations: Sequence[Mapping[str, Any]] = (),
) -> bytes:
    """A new index listing `images` (manifest, platform field) in order, then `attestations`."""
    if media_type not in INDEX_TYPES:
        raise BadInput(f"{media_type} is not an index media type")
    manifests = [
        {"mediaType": m.media_type, "digest": m.digest, "size": len(m.body), "platform": dict(p)}
        for m, p in images
    ]
    document: dict[str, Any] = {"schemaVersion": 2, "mediaType": media_type}
    document["manifests"] = manifests + [dict(a) for a in attestations]
    if annotations:
        document["annotations"] = dict(annotations)
    return json.dumps(document, indent=2).encode() + b"\n"


def republish(source: ImageIndex, patched: Mapping[Platform, Manifest]) -> bytes:
    """The patched index: the source's platforms in its order, each descriptor as the source
    wrote it except digest, size and media type; the source's annotations; no attestations
    (they describe the unpatched images, so carrying them would be a false statement).

    Every platform must have its patched manifest: nothing is published half patched. The
    result is read back (`check_republished`) before anyone can push it.
    """
    missing = [str(e.platform) for e in source.images if e.platform not in patched]
    if missing:
        raise BadInput(f"no patched image for {', '.join(missing)}; the index is not published")
    manifests = []
    for entry in source.images:
        assert entry.platform is not None  # images() keeps only entries with a platform
        new = patched[entry.platform]
        descriptor = dict(entry.raw)
        descriptor.update(mediaType=new.media_type, digest=new.digest, size=len(new.body))
        manifests.append(descriptor)
    document = {k: v for k, v in source.manifest.document().items() if k != "manifests"}
    document["manifests"] = manifests
    body = json.dumps(document, indent=2).encode() + b"\n"
    check_republished(source, patched, body)
    return body


def check_republished(source: ImageIndex, patched: Mapping[Platform, Manifest], body: bytes) -> None:
    """`body` lists exactly one patched image for each of the source's platform entries, in the
    source's order, and two different source images never share one patched image."""
    new = parse_index(Manifest(reference="the new index", media_type=source.manifest.media_type,
                               digest=digest_of(body), body=body))
    problems = []
    if len(new.entries) != len(source.images) or len(new.images) != len(source.images):
        problems.append(f"it lists {len(new.entries)} entries for {len(source.images)} platform images")
    for old, entry in zip(source.images, new.images, strict=False):
        assert old.platform is not None
        want = patched[old.platform]
        if entry.platform != old.platform or entry.digest != want.digest or entry.size != len(want.body):
            problems.append(f"{old.platform} is listed as {entry.platform} {entry.digest}, not {want.digest}")
    pairs = list(zip(source.images, new.images, strict=False))
    for i, (old_a, new_a) in enumerate(pairs):
        for old_b, new_b in pairs[i + 1:]:
            if old_a.digest != old_b.digest and new_a.digest == new_b.digest:
                problems.append(f"{old_a.platform} and {old_b.platform} would both be {new_a.digest}")
    if problems:
        raise CheckFailed("the new index does not list one patched image per source image: " + "; ".join(problems),
                          hint="nothing was pushed under the index tag; report this as a bug")


def check_before_pull(ref: str) -> None:
    """Before the engine pulls `ref` from a registry: if it names an index, that index must be
    well formed and list no platform twice (the engine would take one of the two silently).

    Only the index's own faults are raised (`BadManifest`); a registry this cannot reach or
    read is left for the engine's pull to report. A Docker Hub short name names no host here."""
    host = registry_host(ref)
    if host is None:
        return
    try:
        Registry(host).fetch_index(ref)
    except BadManifest:
        raise
    except DsparkPatchError:
        return


@cache
def _timeouts_adapter() -> type:
    import requests.adapters

    class _Timeouts(requests.adapters.HTTPAdapter):
        """Every request of the session gets a connect and read timeout unless it names one: oras'
        client sets none, and a registry that accepts the connection and never answers would hold
        the run for ever. The session's token requests go through it too."""

        def __init__(self, timeout_s: float) -> None:
            super().__init__()
            self._timeout_s = timeout_s

        def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:  # type: ignore[override]
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = self._timeout_s
            return super().send(request, **kwargs)

    return _Timeouts


def _one_request(client: Any, url: str, method: str, **kwargs: Any) -> requests.Response:
    """oras' `do_request` retries any failure five times with back-off (about two minutes). The
    function under its retry decorator does one request (and the auth challenge's retry), which
    is what a gate wants: a registry that fails is reported at once, exit 3."""
    import oras.provider

    do = oras.provider.Registry.do_request
    return getattr(do, "__wrapped__", do)(client, url, method, **kwargs)


class Registry:
    """Manifests in one registry, through oras-py's client.

    Loopback registries are spoken to over plain HTTP, as the Docker engine does for
    127.0.0.0/8 without being told; any other host needs TLS unless `insecure` says otherwise.
    Every request has a timeout (`timeout_s`, connect and each read; by default
    `request_timeout()`) and an answer is read for
    at most `ANSWER_DEADLINE_S`; a manifest body is read up to `MANIFEST_LIMIT` bytes and one
    byte more is a `BadManifest` (exit 2), as is a body that is not a manifest.
    """

    def __init__(self, host: str, *, insecure: bool | None = None, timeout_s: float | None = None,
                 scheme: str | None = None) -> None:
        self.host = host
        timeout_s = request_timeout() if timeout_s is None else timeout_s
        if insecure is None:
            insecure = host.split(":")[0] in ("localhost", "127.0.0.1", "[::1]") or host.startswith(
                "127."
            )
        self._prefix = "http" if insecure else "https"
        self._timeout_s = timeout_s
        # Basic-auth registries (htpasswd) and token registries need different oras backends;
        # the /v2/ challenge says which. Asking first also fails fast on a dead registry. A pool's
        # further clients of one registry (registry/pool.py) are given the first one's `scheme`.
        import oras.provider

        self.scheme = scheme = self._challenge_scheme() if scheme is None else scheme
        self._needs_login = scheme == "basic"
        self._client = oras.provider.Registry(
            hostname=host, insecure=insecure, auth_backend="basic" if scheme == "basic" else "token"
        )
        adapter = _timeouts_adapter()(timeout_s)
        self._client.session.mount("http://", adapter)
        self._client.session.mount("https://", adapter)

    def _challenge_scheme(self) -> str:
        import requests

        try:
            # stream=True and closed unread: only the status and the header are wanted.
            with requests.get(f"{self._prefix}://{self.host}/v2/", timeout=self._timeout_s, stream=True) as answer:
                challenge = answer.headers.get("Www-Authenticate", "")
        except requests.RequestException as exc:
            raise RegistryUnreachable(
                f"registry {self.host} does not answer ({type(exc).__name__})",
                hint="check the host and port, and that the registry is running",
            ) from None
        return challenge.split(" ", 1)[0].lower()

    def _container(self, reference: str) -> oras.container.Container:
        import oras.container

        try:
            container = oras.container.Container(reference)
        except ValueError as exc:
            raise BadInput(f"{reference!r} is not an image reference ({exc})") from None
        if container.registry != self.host:
            raise BadInput(f"{reference} is not in registry {self.host}")
        # Credentials from Docker's config.json (`docker login`), when there are any; oras by
        # itself reads only ~/.docker, so DOCKER_CONFIG's file is named to it.
        config = docker_config_file()
        if self._needs_login and not _has_login(config, self.host):
            raise RegistryRefused(f"registry {self.host} asks for a login and {config} has none for it",
                                  hint=f"run `docker login {self.host}` (or point DOCKER_CONFIG at a folder that has it)")
        self._client.auth.load_configs(container, configs=[config] if os.path.exists(config) else None)
        return container

    def _request(self, url: str, method: str, doing: str, *, limit: int, headers: dict[str, str],
                 data: bytes | None = None) -> tuple[requests.Response, bytes]:
        """One request through oras' client (its auth, its session), the answer read whole but
        bounded: at most `limit` bytes and `ANSWER_DEADLINE_S` seconds. A read whose answer breaks
        off mid-body is sent once more (a fresh connection); a second break is the error."""
        for attempt in (1, 2):
            answer = self._send(url, method, doing, data=data, headers=dict(headers), stream=True)
            with answer:
                try:
                    return answer, self._read(answer, doing, limit)
                except AnswerBrokenOff:
                    if attempt == 2 or method not in _IDEMPOTENT:
                        raise
        raise AssertionError("unreachable")

    def _send(self, url: str, method: str, doing: str, **kwargs: Any) -> requests.Response:
        """One request, its answer unread. A read the registry answers 429 or 503 with a
        `Retry-After` is sent again after that wait, at most `MAX_WAITS` times, while the wait fits
        in the request timeout; a longer wait is one line at once, never a stall."""
        import oras.auth
        import requests

        for waited in range(MAX_WAITS + 1):
            try:
                answer = _one_request(self._client, url, method, **kwargs)
            except requests.RequestException as exc:
                raise RegistryUnreachable(f"registry {self.host} did not answer {doing} ({type(exc).__name__})",
                                          hint="check that the registry is running and reachable") from None
            except (ValueError, oras.auth.AuthenticationException) as exc:  # oras: an auth challenge it cannot meet
                raise RegistryRefused(f"{self.host} refused {doing}: {exc}",
                                      hint=f"log in with `docker login {self.host}`") from None
            wait = retry_after(answer.headers.get("Retry-After")) if answer.status_code in (429, 503) else None
            if wait is None or method not in _IDEMPOTENT or waited == MAX_WAITS:
                return answer
            answer.close()
            if wait > self._timeout_s:
                raise RegistryUnreachable(
                    f"registry {self.host} answered {doing} with HTTP {answer.status_code} and asks to wait "
                    f"{wait:.0f} s, longer than the {self._timeout_s:g} s a request may wait",
                    hint=f"try again later, or raise {TIMEOUT_ENV}")
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _read(self, answer: requests.Response, doing: str, limit: int) -> bytes:
        import requests

        declared = answer.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BadManifest(f"{self.host} answered {doing} with {int(declared)} bytes, more than the "
                              f"{limit >> 20} MiB this tool reads", hint="check what was pushed under that name")
        deadline = time.monotonic() + ANSWER_DEADLINE_S
        chunks, total = [], 0
        try:
            for chunk in answer.iter_content(64 << 10):
                total += len(chunk)
                if total > limit:
                    raise BadManifest(f"{self.host} answered {doing} with more than the {limit >> 20} MiB "
                                      "this tool reads", hint="check what was pushed under that name")
                if time.monotonic() > deadline:
                    raise RegistryUnreachable(f"registry {self.host} took over {ANSWER_DEADLINE_S:.0f} s "
                                              f"to answer {doing}", hint="check the registry and the network")
                chunks.append(chunk)
        except requests.RequestException as exc:
            raise AnswerBrokenOff(f"registry {self.host} broke off its answer to {doing} ({type(exc).__name__})",
                                  hint="check that the registry is running and reachable") from None
        return b"".join(chunks)

    def fetch(self, reference: str) -> Manifest:
        """The manifest or index `reference` (a tag or @digest) names, as served."""
        container = self._container(reference)
        url = f"{self._prefix}://{container.manifest_url()}"
        doing = f"reading {reference}"
        answer, body = self._request(url, "GET", doing, limit=MANIFEST_LIMIT,
                                     headers={"Accept": ", ".join(ACCEPT)})
        if answer.status_code == 404:
            raise TargetNotFound(f"{reference} is not in the registry", hint="check the name and tag")
        self._check(answer, body, doing)
        digest = digest_of(body)
        served = answer.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise RegistryRefused(f"{reference}: the registry says {served} but the bytes are {digest}")
        if container.digest and container.digest != digest:
            raise RegistryRefused(f"{reference}: asked for {container.digest}, got {digest}")
        header_type = answer.headers.get("Content-Type", "").split(";")[0].strip()
        media_type = media_type_of(load_object(body, reference), header_type, reference)
        return Manifest(reference=reference, media_type=media_type, digest=digest, body=body)

    def fetch_index(self, reference: str) -> ImageIndex | None:
        """The index `reference` names, or None when it names a single-platform image."""
        manifest = self.fetch(reference)
        return parse_index(manifest) if manifest.is_index else None

    def fetch_platform(self, index: ImageIndex, platform: Platform) -> Manifest:
        """One platform's image manifest, fetched by the digest the index names; its size and
        media type must be what the index says."""
        entry = index.entry_for(platform)
        repository = ImageRef.parse(index.manifest.reference).name
        manifest = self.fetch(f"{repository}@{entry.digest}")
        if len(manifest.body) != entry.size or manifest.media_type != entry.media_type:
            raise BadManifest(
                f"{index.manifest.reference} lists {platform} as {entry.media_type}, {entry.size} bytes, "
                f"but {entry.digest} is {manifest.media_type}, {len(manifest.body)} bytes",
                hint="check what was pushed under that name")
        if manifest.media_type not in IMAGE_TYPES:
            raise BadManifest(f"{index.manifest.reference}: {platform} ({entry.digest}) is not an image manifest")
        return manifest

    def push(self, reference: str, body: bytes, media_type: str) -> Manifest:
        """Put a manifest or index under `reference` (a tag); returns it with its digest."""
        return self._put(reference, body, media_type)[0]

    def push_with_subject(self, reference: str, body: bytes, media_type: str) -> tuple[Manifest, bool]:
        """Put a manifest that names a `subject`; also says whether the registry acknowledged the
        subject (the OCI-Subject header of a registry with the referrers API). Without it the
        client keeps the fallback tag (registry/referrers.py)."""
        manifest, answer = self._put(reference, body, media_type)
        subject = json.loads(body).get("subject") or {}
        said = answer.headers.get("OCI-Subject")
        return manifest, bool(said) and said == subject.get("digest")

    def _put(self, reference: str, body: bytes, media_type: str) -> tuple[Manifest, requests.Response]:
        container = self._container(reference)
        url = f"{self._prefix}://{container.manifest_url()}"
        doing = f"pushing {reference}"
        answer, said = self._request(url, "PUT", doing, limit=MANIFEST_LIMIT, data=body,
                                     headers={"Content-Type": media_type})
        self._check(answer, said, doing)
        digest = digest_of(body)
        served = answer.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise RegistryRefused(f"{reference}: the registry stored {served}, not {digest}")
        return Manifest(reference=reference, media_type=media_type, digest=digest, body=body), answer

    def referrers(self, repository: str, digest: str) -> list[dict[str, Any]] | None:
        """The descriptors the referrers API lists for `digest`; None when the registry has no
        referrers API (a 404 for the endpoint, as distribution 2.8 answers), so the caller reads
        the fallback tag instead."""
        container = self._container(f"{repository}@{digest}")
        url = f"{self._prefix}://{container.registry}/v2/{container.api_prefix}/referrers/{digest}"
        doing = f"listing the referrers of {repository}@{digest}"
        answer, body = self._request(url, "GET", doing, limit=MANIFEST_LIMIT, headers={"Accept": OCI_INDEX})
        if answer.status_code == 404:
            return None
        self._check(answer, body, doing)
        try:
            document = json.loads(body)
        except ValueError:
            raise RegistryRefused(f"{self.host}: the referrers of {digest} are not JSON") from None
        if not isinstance(document, dict) or document.get("mediaType", OCI_INDEX) != OCI_INDEX:
            raise RegistryRefused(f"{self.host}: the referrers of {digest} are not an OCI index")
        listed = document.get("manifests") or []
        if not isinstance(listed, list):
            raise RegistryRefused(f"{self.host}: the referrers of {digest} are not an OCI index")
        return [d for d in listed if isinstance(d, dict)]

    def fetch_blob(self, reference: str, digest: str) -> bytes:
        """A blob (an image config, say) of the repository `reference` is in, checked by digest."""
        container = self._container(ImageRef.parse(reference).name)
        url = f"{self._prefix}://{container.get_blob_url(digest)}"
        doing = f"reading {digest} of {reference}"
        answer, body = self._request(url, "GET", doing, limit=BLOB_LIMIT, headers={})
        self._check(answer, body, doing)
        if digest_of(body) != digest:
            raise RegistryRefused(f"{reference}: blob {digest} does not match its digest")
        return body

    def open_blob(self, reference: str, digest: str) -> requests.Response:
        """A blob (a layer) of the repository `reference` is in, as a streamed answer the caller
        reads (bounded and checked by digest: registry/blobs.py) and closes."""
        container = self._container(ImageRef.parse(reference).name)
        url = f"{self._prefix}://{container.get_blob_url(digest)}"
        doing = f"reading {digest} of {reference}"
        answer = self._send(url, "GET", doing, headers={}, stream=True)
        if answer.status_code >= 300:
            with answer:
                said = next(answer.iter_content(200), b"") if answer.status_code != 404 else b""
            if answer.status_code == 404:
                raise RegistryRefused(f"{reference}: the registry has no blob {digest}",
                                      hint="the image is incomplete in its registry; push it again")
            self._check(answer, said, doing)
        return answer

    def push_blob(self, repository: str, blob: bytes) -> str:
        """Upload a small blob (a config, an attestation statement); returns its digest."""
        import requests

        container = self._container(f"{repository}:unused")
        digest = digest_of(blob)
        with tempfile.NamedTemporaryFile() as fh:  # oras uploads from a path
            fh.write(blob)
            fh.flush()
            try:
                answer = self._client.upload_blob(
                    fh.name, container, {"digest": digest, "size": len(blob)}
                )
            except (requests.RequestException, ValueError) as exc:
                raise RegistryUnreachable(f"uploading a blob to {repository} failed ({type(exc).__name__})",
                                          hint="check that the registry is running and reachable") from None
        self._check(answer, (answer.content or b"")[:200], f"uploading a blob to {repository}")
        return digest

    def call(self, repository: str, path: str, method: str, doing: str, *, headers: dict[str, str] | None = None,
             data: Any = None, limit: int = MANIFEST_LIMIT) -> tuple[requests.Response, bytes]:
        """One request about `repository` (HOST/NAME) with its credentials: `path` is under
        /v2/NAME/ (or a whole URL the registry gave, an upload's Location), the answer bounded as
        every other. For registry/upload.py; the status code is the caller's to judge."""
        container = self._container(f"{repository}:unused")
        url = path if path.startswith(("http://", "https://")) else \
            f"{self._prefix}://{self.host}/v2/{container.api_prefix}/{path}"
        # A HEAD answer's Content-Length is the size of what a GET would send; it has no body.
        return self._request(url, method, doing, limit=1 << 62 if method == "HEAD" else limit,
                             headers=headers or {}, data=data)

    def location(self, answer: requests.Response) -> str | None:
        """An upload's Location header as a whole URL (a registry may answer a path)."""
        where = answer.headers.get("Location", "")
        if not where:
            return None
        return where if where.startswith(("http://", "https://")) else f"{self._prefix}://{self.host}{where}"

    def check(self, answer: requests.Response, body: bytes, doing: str) -> None:
        """A refusal (4xx/5xx) as one line (RegistryRefused)."""
        self._check(answer, body, doing)

    def _check(self, answer: requests.Response, body: bytes, doing: str) -> None:
        if answer.status_code in (401, 403):
            raise RegistryRefused(
                f"{self.host} refused {doing} (HTTP {answer.status_code})",
                hint=f"log in with `docker login {self.host}`",
            )
        if answer.status_code >= 300:
            said = body[:200].decode("utf-8", "replace").replace("\n", " ").strip()
            raise RegistryRefused(f"{self.host} refused {doing}: HTTP {answer.status_code} {said}")


__all__ = [
    "ACCEPT", "ATTESTATION_ANNOTATION", "DOCKER_LIST", "DOCKER_MANIFEST", "INDEX_TYPES", "MANIFEST_LIMIT",
    "OCI_INDEX", "OCI_MANIFEST", "AnswerBrokenOff", "BadManifest", "Entry", "ImageIndex", "Manifest", "Registry",
    "RegistryRefused", "RegistryUnreachable", "check_before_pull", "check_republished", "compose_index",
    "digest_of", "docker_config_file", "parse_index", "registry_host", "republish", "retry_after",
]
