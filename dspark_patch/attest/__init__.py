"""Signed attestations that travel with the image: a DSSE envelope around the in-toto Statement
(`dsse`), attached in the registry as an OCI artifact whose subject is the image's manifest
(`registry.referrers`), and checked there without pulling a layer (`check`)."""
