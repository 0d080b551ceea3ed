"""Where fairlib's files are: one rule each, one environment override each.

- ``data_dir()``: the book's data (published figures, the reference grid, fitted engines, saved
  live runs, trace summaries): ``$FAIRLIB_DATA``, else the ``data/`` folder of the checkout the
  package is imported from (``fairlib/../data``). An install without a checkout sets
  ``FAIRLIB_DATA`` to a copy of that folder.
- ``repo_root()``: the checkout (``fairlib/..``), for logs, caches and the git commit of a run.
- ``engines_dir()``: the engines' environments and models (``make engines``):
  ``$FAIRLIB_ENGINES_DIR``, else ``<checkout>/.engines``.
- ``engine_logs_dir()``: engine server logs: ``$FAIRLIB_ENGINES_LOG_DIR``, else
  ``<checkout>/.cache/engines``.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PACKAGE_DIR", "repo_root", "data_dir", "data_path", "engines_dir", "engine_logs_dir"]

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path:
    """The folder above the package: the checkout for an editable install."""
    return PACKAGE_DIR.parent


def data_dir() -> Path:
    """``$FAIRLIB_DATA`` or ``<checkout>/data``."""
    env = os.environ.get("FAIRLIB_DATA")
    return Path(env).expanduser().resolve() if env else repo_root() / "data"


def data_path(*parts: str) -> Path:
    """A file under :func:`data_dir`; a missing file is reported by whoever opens it, with this path."""
    return data_dir().joinpath(*parts)


def engines_dir() -> Path:
    return Path(os.environ.get("FAIRLIB_ENGINES_DIR") or repo_root() / ".engines")


def engine_logs_dir() -> Path:
    return Path(os.environ.get("FAIRLIB_ENGINES_LOG_DIR") or repo_root() / ".cache" / "engines")
