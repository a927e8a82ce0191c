"""The real torch offload engine: paged KV pools, block summaries and selection, the I/O engine
(per_fragment vs gather_scatter), sparse decode attention and a Llama-style decoder; see README.md.
Imports torch; never imports ``sim``."""
