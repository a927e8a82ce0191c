"""The real torch offload engine (paged KV pools, selection, I/O engine, sparse attention). Not built yet:
see the engine issue. Imports torch; never imports ``sim``."""
