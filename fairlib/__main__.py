"""The command line's entry: ``fairlib ...`` (the installed script) and ``python -m fairlib ...``.

Loading the commands' modules (numpy, pandas, numba, aiohttp) takes about a second; a Ctrl-C in
that second ends with one line on stderr and exit 130, not a traceback. Every command handles
SIGINT and SIGTERM itself once it runs (``fairlib.cli``)."""
import sys

try:
    from fairlib.cli import main as _cli_main
except KeyboardInterrupt:
    print("fairlib: interrupted (SIGINT) while starting", file=sys.stderr, flush=True)
    sys.exit(130)


def main() -> int:
    return _cli_main()


if __name__ == "__main__":
    sys.exit(main())
