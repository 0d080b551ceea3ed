"""Where fairlib's files are: one rule each, one environment override each.

- ``checkout()``: the source checkout the package is imported from (``fairlib/..`` holding
  ``pyproject.toml``; an editable install), or None for an installed package.
- ``data_dir()``: the book's data (published figures, the reference grid, fitted engines, saved
  live runs, trace summaries): ``$FAIRLIB_DATA``, else ``<checkout>/data``. An installed package
  has no data folder of its own: set ``FAIRLIB_DATA`` to a copy of a checkout's ``data/``.
- ``engines_dir()``: the engines' environments and models (``make engines``):
  ``$FAIRLIB_ENGINES_DIR``, else ``<checkout>/.engines``, else ``~/.cache/fairlib/engines``.
- ``engine_logs_dir()``: engine server logs: ``$FAIRLIB_ENGINES_LOG_DIR``, else
  ``<checkout>/.cache/engines``, else ``~/.cache/fairlib/engine-logs``.
- ``repo_root()``: the checkout, else the working directory (where engine servers run and where
  a run's git commit is looked up).

Module constants built from these (``fairlib.chapters.published.DATA_FILE``,
``fairlib.chapters.grid.GRID_FILE``, ``fairlib.traces.DATA_DIR``) read the environment when
fairlib is imported.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = ["PACKAGE_DIR", "checkout", "repo_root", "data_dir", "data_path", "engines_dir", "engine_logs_dir",
           "user_cache_dir"]

PACKAGE_DIR = Path(__file__).resolve().parent


def checkout() -> Optional[Path]:
    """``fairlib/..`` when it is a source checkout (holds ``pyproject.toml``), else None."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() else None


def repo_root() -> Path:
    """The checkout, else the working directory."""
    return checkout() or Path.cwd()


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fairlib`` (default ``~/.cache/fairlib``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fairlib"


def data_dir() -> Path:
    """``$FAIRLIB_DATA``, else ``<checkout>/data`` (for an installed package: a path that does not
    exist, which every reader reports with the path when it opens a file)."""
    env = os.environ.get("FAIRLIB_DATA")
    if env:
        return Path(env).expanduser().resolve()
    return (checkout() or PACKAGE_DIR) / "data"


def data_path(*parts: str) -> Path:
    """A file under :func:`data_dir`."""
    return data_dir().joinpath(*parts)


def engines_dir() -> Path:
    env = os.environ.get("FAIRLIB_ENGINES_DIR")
    if env:
        return Path(env)
    root = checkout()
    return root / ".engines" if root else user_cache_dir() / "engines"


def engine_logs_dir() -> Path:
    env = os.environ.get("FAIRLIB_ENGINES_LOG_DIR")
    if env:
        return Path(env)
    root = checkout()
    return root / ".cache" / "engines" if root else user_cache_dir() / "engine-logs"
