"""The book's pages show fairlib's commands as a user runs them: ``shell`` runs ``fairlib ARGS``
in a child process (a pipe: the stage lines, no progress bar) and returns what it printed after
the command line, so a page's console output is the command's own, never typed.

    out = shell(["simulate", "--scenario", "noisy_neighbor", "--out", "runs/nn"], cwd=work)
    print(out.text)       # "$ fairlib simulate ...\\n<its stdout and stderr>"
    section(report_text, "## Comparison")   # one section of a report
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Shell", "shell", "section"]


@dataclass(frozen=True)
class Shell:
    """A command's line, exit status and output (stdout, then stderr)."""

    args: tuple
    returncode: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        out = (self.stdout + self.stderr).rstrip("\n")
        return f"$ {shlex.join(('fairlib', *self.args))}\n{out}\n[exit status {self.returncode}]"


def shell(args: Sequence, cwd, timeout_s: float = 600.0) -> Shell:
    """Run ``fairlib ARGS`` (this interpreter's fairlib) in ``cwd``; its output, never raised on."""
    args = tuple(str(a) for a in args)
    env = {**os.environ, "COLUMNS": "160"}
    r = subprocess.run([sys.executable, "-m", "fairlib", *args], cwd=str(cwd), capture_output=True, text=True,
                       timeout=timeout_s, env=env)
    return Shell(args, r.returncode, r.stdout, r.stderr)


def section(markdown: str, heading: str) -> str:
    """The part of a Markdown report from the line starting with ``heading`` to the next heading of
    the same level (``ValueError`` naming the heading when it is not there)."""
    lines = markdown.splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    try:
        i = next(k for k, line in enumerate(lines) if line.startswith(heading))
    except StopIteration:
        raise ValueError(f"no section {heading!r} in the report") from None
    j = next((k for k in range(i + 1, len(lines))
              if lines[k].startswith("#") and len(lines[k]) - len(lines[k].lstrip("#")) <= level), len(lines))
    return "\n".join(lines[i:j]).strip() + "\n"
