"""The library: the view catalog, the live engine, the Teacher backends, and the workflows over them."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("teacher-mcts")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
