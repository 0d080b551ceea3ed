"""``python -m fairlib.gateway ARGS``: the same gateway as ``fairlib gateway ARGS``."""
import sys

from fairlib.gateway.server import add_arguments, gateway_from_args
from fairlib.servers import module_main


def main(argv=None) -> int:
    return module_main("python -m fairlib.gateway",
                       "The fairness gateway: the book's policies in front of an engine.",
                       add_arguments, gateway_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
