"""A tiny loopback registry that has the OCI 1.1 referrers API, for the one path the real
test registry (distribution 2.8) cannot show: a registry that lists referrers itself and says so
with the OCI-Subject header. Only what the attach/find code asks for: blob upload (POST + PUT),
blob and manifest GET/HEAD, manifest PUT, GET /v2/<name>/referrers/<digest>."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class _Store:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], tuple[bytes, str]] = {}  # (repo, tag or digest) -> (body, type)
        self.requests: list[str] = []


def _handler(store: _Store) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _route(self) -> tuple[str, str, str]:
            path = urlparse(self.path).path.removeprefix("/v2/")
            for kind in ("/blobs/uploads/", "/blobs/", "/manifests/", "/referrers/"):
                if kind in path:
                    repo, _, rest = path.partition(kind)
                    return repo, kind.strip("/"), rest
            return "", path, ""

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            store.requests.append(f"{self.command} {self.path}")
            repo, kind, rest = self._route()
            if kind == "" or self.path == "/v2/":
                return self._send(200, b"{}")
            if kind == "blobs":
                blob = store.blobs.get(rest)
                return self._send(200, blob, {"Docker-Content-Digest": rest}) if blob is not None else self._send(404)
            if kind == "manifests":
                found = store.manifests.get((repo, rest))
                if found is None:
                    return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                body, media_type = found
                return self._send(200, body, {"Content-Type": media_type,
                                              "Docker-Content-Digest": "sha256:" + hashlib.sha256(body).hexdigest()})
            if kind == "referrers":
                listed = []
                for (r, ref), (body, media_type) in store.manifests.items():
                    if r != repo or not ref.startswith("sha256:"):
                        continue
                    doc = json.loads(body)
                    if (doc.get("subject") or {}).get("digest") == rest:
                        listed.append({"mediaType": media_type, "digest": ref, "size": len(body),
                                       "artifactType": doc.get("artifactType"), "annotations": doc.get("annotations", {})})
                index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": listed}
                return self._send(200, json.dumps(index).encode(), {"Content-Type": "application/vnd.oci.image.index.v1+json"})
            return self._send(404)

        do_HEAD = do_GET  # noqa: N815

        def do_POST(self) -> None:  # noqa: N802
            store.requests.append(f"{self.command} {self.path}")
            repo, kind, _ = self._route()
            self._send(202, headers={"Location": f"/v2/{repo}/blobs/uploads/{uuid.uuid4().hex}"})

        def do_PUT(self) -> None:  # noqa: N802
            store.requests.append(f"{self.command} {self.path}")
            repo, kind, rest = self._route()
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
            if kind == "blobs/uploads":
                want = parse_qs(urlparse(self.path).query).get("digest", [""])[0]
                if want != digest:
                    return self._send(400)
                store.blobs[digest] = body
                return self._send(201, headers={"Docker-Content-Digest": digest})
            if kind == "manifests":
                media_type = self.headers.get("Content-Type", "")
                store.manifests[(repo, rest)] = (body, media_type)
                store.manifests[(repo, digest)] = (body, media_type)
                headers = {"Docker-Content-Digest": digest}
                subject = (json.loads(body).get("subject") or {}).get("digest")
                if subject:
                    headers["OCI-Subject"] = subject
                return self._send(201, headers=headers)
            return self._send(404)

    return Handler


@contextmanager
def referrers_registry() -> Iterator[tuple[str, _Store]]:
    store = _Store()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(store))
    # A short poll: shutdown() waits out serve_forever's poll (0.5 s by default) on every stop.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()
