"""``python -m fairlib.gateway ARGS``: the same gateway as ``fairlib gateway ARGS``."""
import argparse
import sys

from fairlib.gateway.server import add_arguments, gateway_from_args


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairlib.gateway",
                                description="The fairness gateway: the book's policies in front of an engine.")
    add_arguments(p)
    return gateway_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
