"""A CPU hog for ``make test-busy``: one process spinning on one core until it is signalled (or
its parent, make, goes away), as another program on a developer's machine would.

    python tests/cpu_hog.py [SECONDS]     # default: until SIGTERM/SIGINT or the parent exits
"""
import os
import signal
import sys
import time


def main() -> int:
    limit = float(sys.argv[1]) if len(sys.argv) > 1 else float("inf")
    parent = os.getppid()
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: stop.append(s))
    t0 = time.monotonic()
    n = 0
    while not stop:
        for _ in range(100_000):         # ~5 ms of pure computation between checks
            n += 1
        if os.getppid() != parent or time.monotonic() - t0 > limit:
            break
    print(f"cpu_hog: spun {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
