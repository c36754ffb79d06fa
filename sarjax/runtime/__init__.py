"""Leaves every layer may use: XLA's compile cache, progress bars, run-directory fingerprints."""
