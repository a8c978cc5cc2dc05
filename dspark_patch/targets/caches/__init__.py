"""What this machine remembers between runs, in `$DSPARK_PATCH_CACHE` (cachedir.py): layer scans,
bytecode proofs and an image's answers to read-only checks. Each saves work and never decides a
verdict: an entry is believed only when sealed under this machine's key (seal.py)."""
