"""How fairlib compiles kernel code.

The kernel allocates nothing, so it runs without numba's runtime (NRT): with it, every array
handed to a helper or policy hook costs two atomic reference-count updates, which made those
updates most of the loop's time (about 1.7 ms of a 2 ms seed-000 run).

- `inline`: helpers and policy hooks, inlined into the loop at numba-IR level (never cached on
  their own: they exist only inside the entry points).
- `entry`: functions called from Python (`run`, `step_once`), cached on disk.

numba keys a cached function on its own source file only, but the entry points inline the
policies: a changed policy would silently run the old code. So `entry` stamps its cache with a
hash of every kernel source file (``KERNEL_FILES``: the state, lines, loop, observed and this module, and
fairlib/sim/policies/*.py) instead.
"""
import hashlib
from pathlib import Path

import numba as nb

_HERE = Path(__file__).resolve().parent
#: The files compiled into the kernels (the engine model's Python layer, e.g. simulate.py, is not).
KERNEL_FILES = tuple([_HERE / f for f in ("jit.py", "state.py", "lines.py", "loop.py", "observed.py")]
                     + sorted((_HERE / "policies").glob("*.py")))


def kernel_stamp() -> bytes:
    """sha256 over the names and contents of every kernel source file."""
    h = hashlib.sha256()
    for f in KERNEL_FILES:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.digest()


_STAMP = kernel_stamp()

inline = nb.njit(inline="always", _nrt=False)


def entry(fn):
    """Compile `fn` as a cached kernel entry point whose cache follows every kernel source."""
    dispatcher = nb.njit(cache=True, _nrt=False)(fn)
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if cache_file is not None and hasattr(cache_file, "_source_stamp"):
        cache_file._source_stamp = _STAMP    # numba compares this with the stamp stored in its index
    return dispatcher
