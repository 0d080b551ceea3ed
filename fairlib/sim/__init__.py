"""The compiled engine model: state arrays, waiting lines and the iteration loop.

The state arrays' rows, scalar slots and status codes are named once, in ``state.py``. The Python
layer (simulate, online, gate, cluster, ``fairlib.serve.driver``, ``fairlib.sweep``) imports the module
as one object and reads ``state.ADMITTED``, ``state.STATUS``; the jitted kernels (loop, observed,
lines, policies/) import the names themselves, module-level ints that numba freezes as constants.
"""
