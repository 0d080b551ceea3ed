"""``python -m fairlib.serve ARGS``: the same server as ``fairlib serve ARGS``."""
import argparse
import sys

from fairlib.serve.server import add_arguments, serve_from_args


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairlib.serve",
                                description="The engine model in real time over HTTP: a test double, not an engine.")
    add_arguments(p)
    return serve_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
