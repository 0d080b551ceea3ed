"""Progress of fairlib's long commands: a live bar while a person watches a terminal, one line
per stage otherwise, nothing but the result with ``--quiet``.

    prog = Progress("fairlib simulate", quiet=a.quiet)
    prog.compile_notice()                 # "compiling the engine model (first run only, ~30 s)"
    with prog.bar(total=3, unit="run") as bar:
        ...; bar.update(1)
    prog.stage("wrote runs/x")            # above the bar on a terminal, a plain line elsewhere

The bar is live only when both stdout and stderr are terminals (``interactive``): a pipe, a log
file or a notebook gets the stage lines alone, one per stage, and no control characters.

The bars are tqdm's: it is already a dependency (the sweep's bar), it has no dependencies of its
own, draws on stderr, lets lines be printed above a live bar (``tqdm.write``) and refreshes at a
bounded rate (``mininterval``), so a bar costs the sender nothing measurable. rich's live tables
would add a renderer and its markup for the same one-line bar.
"""
from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager
from typing import Optional

from tqdm import tqdm

from fairlib.sim import loop, observed

__all__ = ["Progress", "progress_line", "interactive", "engine_model_compiled", "COMPILE_NOTICE", "KERNELS"]

COMPILE_NOTICE = "compiling the engine model (first run only, ~30 s)"


def progress_line(*parts) -> None:
    """One progress line on stdout, flushed at once: through a pipe, print's block buffer would
    hold a long command's lines until it ends (a reader, or a test waiting for the first line
    before it signals, would see them only after the work is done)."""
    print(*parts, flush=True)


def interactive() -> bool:
    """A person watches: stdout and stderr are terminals, and the terminal can redraw a line."""
    def tty(f) -> bool:
        return bool(getattr(f, "isatty", lambda: False)())
    return tty(sys.stdout) and tty(sys.stderr) and os.environ.get("TERM", "") != "dumb"


#: The compiled entry points each kind of command runs first: a simulation's records
#: (``fairlib simulate``: ``fairlib.records.from_sim`` steps ``loop.step_once``, as ``fairlib
#: serve`` does), a sweep (``loop.run`` over whole tables) and the gateway's decisions
#: (``fairlib.sim.observed``).
KERNELS = {"simulate": (loop.step_once,), "sweep": (loop.run,), "serve": (loop.step_once,),
           "gateway": (observed.arrive, observed.admit, observed.observe, observed.clock, observed.withdraw)}


def engine_model_compiled(kind: str = "simulate") -> bool:
    """Whether the entry points ``kind`` runs (:data:`KERNELS`) are in memory or in numba's disk
    cache for this CPU and these kernel sources; ``False`` means the command compiles them first
    (tens of seconds)."""
    for d in KERNELS[kind]:
        if d.overloads:
            continue
        cache_file = getattr(getattr(d, "_cache", None), "_cache_file", None)
        try:
            index = cache_file._load_index() if cache_file is not None else {}
            magic = d.targetctx.codegen().magic_tuple()
        except Exception:   # noqa: BLE001 - an unreadable index: numba compiles, say so
            return False
        if not any(isinstance(k, tuple) and len(k) > 1 and k[1] == magic for k in index):
            return False
    return True


class _NoBar:
    """What ``Progress.bar`` gives when no bar is drawn: the same calls, doing nothing."""

    n = 0

    def update(self, k: int = 1) -> None:
        self.n += k

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


class Progress:
    """One command's progress: stage lines and bars (see the module docstring).

    ``quiet``: nothing at all; ``live``: draw bars (default: :func:`interactive`); ``out``: where
    stage lines go (default stdout; bars always draw on stderr)."""

    def __init__(self, cmd: str, quiet: bool = False, live: Optional[bool] = None, out=None):
        self.cmd = cmd
        self.quiet = bool(quiet)
        self.live = (not self.quiet) and (interactive() if live is None else bool(live))
        self.out = out
        self._open = 0

    def stage(self, text: str) -> None:
        """One line, ``"<cmd>: <text>"`` (printed above a live bar)."""
        if self.quiet:
            return
        line = f"{self.cmd}: {text}"
        out = self.out or sys.stdout
        if self._open:
            tqdm.write(line, file=out)
        else:
            print(line, file=out, flush=True)

    def compile_notice(self, kind: str = "simulate") -> bool:
        """Say :data:`COMPILE_NOTICE` when what ``kind`` runs is not compiled yet; returns whether it was not."""
        cold = not engine_model_compiled(kind)
        if cold:
            self.stage(COMPILE_NOTICE)
        return cold

    @contextmanager
    def bar(self, total: Optional[int], desc: str, unit: str = "it"):
        """A tqdm bar on stderr while live, else a bar that draws nothing; closed on the way out."""
        if not self.live:
            yield _NoBar()
            return
        # the terminal's width (a terminal that reports none, such as a fresh pseudo-terminal, gets 100)
        width = shutil.get_terminal_size((100, 24)).columns
        b = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, ncols=width, leave=False, mininterval=0.25,
                 smoothing=0.1)
        self._open += 1
        try:
            yield b
        finally:
            self._open -= 1
            b.close()
