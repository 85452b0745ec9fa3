"""chatfleet: size, measure and serve an open chat model on a fleet of small GPUs."""

__version__ = "0.1.0"
