"""``python -m fairlib.serve ARGS``: the same server as ``fairlib serve ARGS``."""
import sys

from fairlib.serve.server import add_arguments, serve_from_args
from fairlib.servers import module_main


def main(argv=None) -> int:
    return module_main("python -m fairlib.serve",
                       "The engine model in real time over HTTP: a test double, not an engine.",
                       add_arguments, serve_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
