"""``python -m fairlib.serve ARGS``: the same server as ``fairlib serve ARGS``."""
import argparse
import sys

from fairlib.serve.server import add_arguments, config_from_args, serve_forever


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairlib.serve",
                                description="The engine model in real time over HTTP: a test double, not an engine.")
    add_arguments(p)
    a = p.parse_args(argv)
    try:
        cfg = config_from_args(a)
    except ValueError as e:
        raise SystemExit(f"fairlib serve: {e}") from None
    serve_forever(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
