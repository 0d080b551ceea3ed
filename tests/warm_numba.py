"""Load (or compile) every kernel entry point into numba's disk cache once, before ``make test``
starts its pytest-xdist workers: otherwise each worker compiles the same kernels at the same time
(30-90 s each on 2 cores) and they race to write the same cache files.

What it runs is what the commands run first (``fairlib.progress.KERNELS``): a simulation
(``loop.run``, ``loop.step_once``), ``fairlib serve``'s online step and the gateway's decisions,
each on a tiny case. Prints what it found cold. Run with the suite's ``NUMBA_CACHE_DIR``.
"""
import sys
import time

import pandas as pd


def main() -> int:
    from fairlib.progress import KERNELS, engine_model_compiled
    cold = [k for k in KERNELS if not engine_model_compiled(k)]
    t = time.monotonic()
    import fairlib
    from fairlib.sim.engine import Engine
    from fairlib.sim.gate import PolicyGate
    from fairlib.sim.online import OnlineEngine
    from fairlib.sim import loop, observed
    df = pd.DataFrame({"arrival_ms": [0.0, 1.0], "tenant": [0, 1], "prompt_tokens": [4, 4], "output_tokens": [2, 2]})
    fairlib.simulate(df)
    eng = OnlineEngine(Engine(), "fcfs", n_tenants=2, capacity=4)
    eng.submit(0, 1, 2, 0.0, priority=0)
    while eng.has_work() and eng.step().code != loop.ENDED:
        pass
    g = PolicyGate("fcfs", n_tenants=2, slots=2)
    a, _ = g.arrive(0, 1, 0.0, 1)
    b, _ = g.arrive(0, 1, 0.0, 1)
    for rid in g.admit(0.0):
        g.observe([rid], [1], [True], 1.0, 1.0)
    g.withdraw(b, 2.0)
    observed.clock(g.S, g.policy.pid, g.pf, g.pi, 3.0)   # set_replicas calls it (token_pool only)
    left = [k for k in KERNELS if not engine_model_compiled(k)]
    print(f"warm_numba: {', '.join(cold) or 'nothing'} cold; {time.monotonic() - t:.1f} s"
          + (f"; still cold: {left}" if left else ""), flush=True)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
