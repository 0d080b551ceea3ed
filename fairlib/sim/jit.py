"""How fairlib compiles kernel code.

The kernel allocates nothing, so it runs without numba's runtime (NRT): with it, every array
handed to a helper or policy hook costs two atomic reference-count updates, which made those
updates most of the loop's time (about 1.7 ms of a 2 ms seed-000 run).

- `inline`: helpers and policy hooks, inlined into the loop at numba-IR level.
- `entry`: functions called from Python (`run`, `step_once`).
"""
import numba as nb

inline = nb.njit(cache=True, inline="always", _nrt=False)
entry = nb.njit(cache=True, _nrt=False)
