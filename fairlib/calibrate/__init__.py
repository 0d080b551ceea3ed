"""Calibration: measuring a real engine so the simulator can stand in for it.

Modules: ``lifecycle`` (starting and stopping engine servers: vLLM, llama.cpp's server,
``fairlib serve``; their processes, ports, logs), ``probe`` (controlled request patterns that
time one iteration), ``fit`` (the engine model's cost parameters fitted from those timings, saved
to ``data/engines/<engine>.json``).
"""
