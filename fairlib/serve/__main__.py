"""``python -m fairlib.serve ARGS`` = ``fairlib serve ARGS``."""
import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
