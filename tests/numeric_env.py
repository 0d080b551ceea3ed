"""Print the environment of the second numeric check (``make test``) as shell ``export`` lines.

The book compares saved data and stored notebook outputs exactly, so they must not depend on the
processor. ``make test`` runs those checks twice: as the machine is, and again with the vectorised
code paths switched off - numpy's dispatched SIMD loops (AVX2, AVX-512 families), OpenBLAS's
kernel (an older core), numba's target (``generic``, no FMA or AVX) - so a result that differs on a
reader's CPU fails here first. Only features this numpy dispatches *and* this CPU has are named:
numpy warns at import about the others, and that warning would itself change a notebook's output.
"""
import shlex

try:
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
except ImportError:  # numpy < 2
    from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__

env = {"OPENBLAS_CORETYPE": "Nehalem", "NUMBA_CPU_NAME": "generic"}   # generic: no CPU features
off = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
if off:
    env["NPY_DISABLE_CPU_FEATURES"] = " ".join(off)
for k, v in env.items():
    print(f"export {k}={shlex.quote(v)}")
