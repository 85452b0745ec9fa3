"""chatfleet: size, measure and serve an open chat model on a fleet of small GPUs."""

__version__ = "0.1.0"

# before any other chatfleet module: a stale or partial compiled build stays out (_native.py)
from chatfleet._native import install as _install_native

NATIVE = _install_native()
