"""The bounds of a pool size (``num_gpu_blocks``): a leaf, so that everything can import them.

The command-line options (``--pool-blocks``), :mod:`kvtool.poolsize` (which reads a pool
size from a groups file or a recording) and the recording's metadata struct
(:mod:`kvtool.recording.ledger`) bound a pool size the same way. They live here, importing
nothing, so the recording package never imports :mod:`kvtool.poolsize` (which imports the
recording reader): the imports go one way.
"""

from __future__ import annotations

MIN_POOL_BLOCKS = 2
"""The smallest pool: vLLM's null block plus one usable block."""
MAX_POOL_BLOCKS = 2**40
"""Far above any real pool; larger values are refused as input errors."""
