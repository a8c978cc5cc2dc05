"""Registry-facing pieces for multi-platform images: image indexes, platforms, publishing.

`platform` is pure (parse and select platforms); `index` reads and writes manifests through
oras-py's registry client, which owns HTTP, auth (Docker's config.json, basic and token) and
retries. Nothing here talks to the Docker engine.
"""
