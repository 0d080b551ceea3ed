"""``fairlib serve``: an OpenAI-compatible HTTP server whose token timing is the engine model's.

**A test double and a live demonstration of a policy, not an engine.** It runs no model: one
asyncio task drives ``fairlib.sim.online.OnlineEngine`` (the simulator's own compiled step) against
the wall clock and emits each iteration's tokens when the model says the iteration ends
(``dt = iter_base + iter_slope * B + prefill * P`` ms). Numbers measured against it measure the
engine model plus this server's own small timing error, never an engine; they are never to be
presented as an engine's.

It speaks vLLM's wire format (``/v1/completions``, ``/v1/chat/completions`` streaming and not,
``/v1/models``, ``/health``, ``/version``, ``/metrics`` with vLLM's metric names) so that the
measurement client (``fairlib.client``) can be tested end to end, and a scheduling policy
(``fcfs``, ``priority`` as vLLM does them, and fairlib's others: ``vtc``, ...) can be watched
serving real HTTP traffic. Tenants are told apart by the ``X-Tenant`` header.

Timing error: the lag between an iteration's intended end and the moment its tokens are handed
to the request handlers (``fairlib_serve_emission_lag_seconds``) and written to the sockets
(``fairlib_serve_write_lag_seconds``); ``/fairlib/stats`` gives its percentiles. The model clock never
waits for the server, so lag does not accumulate.

    from fairlib.serve import ServeConfig, ServerProcess
    with ServerProcess(["--iter-base-ms", "8", "--policy", "vtc"]) as srv:
        ...  # srv.base_url is the OpenAI base URL (ending in /v1)

Command line: ``fairlib serve --port 8000 --iter-base-ms 8 --iter-slope-ms 1.5 --policy vtc``.
Modules: ``config`` (ServeConfig), ``driver`` (the real-time loop, metrics), ``app`` (the HTTP
handlers and response bodies), ``server`` (start/stop: foreground, thread, process; CLI options),
``replay`` (a second double: replays fixture streams, for the client's tests). The wire format and
the metrics registry it shares with the gateway are ``fairlib.protocol``'s.
"""
from fairlib.serve.app import make_app, parse_request
from fairlib.serve.config import ServeConfig
from fairlib.serve.driver import Driver
from fairlib.serve.server import ServerProcess, ServerThread, add_arguments, config_from_args, serve_forever, start, wait_ready

__all__ = ["ServeConfig", "make_app", "parse_request", "Driver", "ServerProcess",
           "ServerThread", "add_arguments", "config_from_args", "serve_forever", "start", "wait_ready"]
