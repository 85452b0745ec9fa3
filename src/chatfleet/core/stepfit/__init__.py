"""Fitting the engine model's step time to the steps a live sweep observed."""
