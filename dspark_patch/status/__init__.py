"""`dspark-patch status`: a read-only audit of many images (or folders) at once.

`assess` is pure (a site folder's files + the known patch sets -> states and integrity lists);
`fleet` reads the targets concurrently through a read-only view and gathers one row each.
"""
