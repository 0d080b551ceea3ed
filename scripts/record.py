"""Record a chapter's live data on a real engine: one entry point for the four recorders.

    python scripts/record.py 1-4 vllm            # chapters 1-4: the policies through the gateway
    python scripts/record.py 5 vllm              # chapter 5: DriftSched's protocol through the gateway
    python scripts/record.py 6 llamacpp          # chapter 6: the token pools' two experiments
    python scripts/record.py 8 vllm --no-refit   # chapter 8: every scenario and seed000, live

Everything after the chapter goes to that chapter's recorder (``python scripts/record.py 8
--help`` lists its options). Each recorder starts the engine as the book does, waits for a
quiet machine, writes the full run directories first and keeps the small files of each run under
``data/runs`` with one function (``fairlib.chapters.fidelity_runs.store_run_files``).

The recorders are book-only code (``fairlib.chapters``): nothing in the library imports them, so
this script, not a ``fairlib`` subcommand, is their command line.
"""
from __future__ import annotations

import argparse
import importlib
import sys

#: chapter -> the module whose ``main(["record", ...])`` records it
RECORDERS = {"1-4": "fairlib.chapters.gateway_record", "5": "fairlib.chapters.driftsched",
             "6": "fairlib.chapters.token_pools_live", "8": "fairlib.chapters.fidelity"}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python scripts/record.py", description=__doc__.split("\n\n")[0],
                                 epilog="chapters: " + ", ".join(f"{c} ({m})" for c, m in RECORDERS.items()))
    ap.add_argument("chapter", choices=list(RECORDERS), help="the chapter whose live data to record")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the recorder's own arguments (KIND first)")
    a = ap.parse_args(argv)
    mod = importlib.import_module(RECORDERS[a.chapter])
    return int(mod.main(["record", *a.args]) or 0)


if __name__ == "__main__":
    sys.exit(main())
