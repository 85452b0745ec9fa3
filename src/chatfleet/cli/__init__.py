"""The `chatfleet` command line."""

import os

# chatfleet makes no BLAS call, but OpenBLAS starts a helper thread per core when numpy is
# imported, and each spins for about 0.1 s of CPU before it sleeps: in this process and in every
# worker process a plan starts (they inherit the setting). Before anything imports numpy; a
# value the user set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from chatfleet.cli.app import app, main

__all__ = ["app", "main"]
