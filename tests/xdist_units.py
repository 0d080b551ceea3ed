"""How ``make test`` shares the test files among pytest-xdist workers (``-n N``).

One work unit per file (a module's fixtures, e.g. a server started once per module, stay in one
worker), and the files that own a real engine (:data:`ENGINE_FILES`) as one unit, so that each
engine is started once (tests/conftest.py's session fixture) in one worker. Units go out longest
first (:data:`LONGEST_FIRST`, from ``--durations`` on this 2-core machine), the rest in
collection order.
"""
from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

#: the files that start vLLM or llama.cpp (pytest -m engine): one unit, sent out first
ENGINE_FILES = ("tests/test_engines_smoke.py", "tests/test_real_engines.py")
ENGINE_UNIT = "real engines"
#: the longest units (`--durations` of the parallel phase on 2 cores, 4 workers, 2026-12-04),
#: longest first; a long unit started last would leave the other workers idle at the end
LONGEST_FIRST = (
    "notebooks/08_simulator_fidelity.ipynb", "tests/test_client_signals.py", "notebooks/05_drift_calibration.ipynb",
    "notebooks/06_token_pools.ipynb", "tests/test_fidelity.py", "tests/test_gateway.py", "tests/test_cli_measure.py",
    "tests/test_client_runner.py", "tests/test_client_scrape.py", "tests/test_cli.py", "tests/test_cli_errors.py",
    "notebooks/07_measuring_a_real_engine.ipynb", "tests/test_layout.py", "tests/test_agreement.py",
    "tests/test_fit_endpoint.py", "tests/test_properties.py", "tests/test_experiments.py", "tests/test_sweep.py",
)


#: Tests that assert a process's own timing (the client's send lag, samples per second, a cost
#: fitted from measured streams, a bar's redraws): marked ``timing`` (tests/conftest.py) and run
#: by make test after the parallel phase, alone on the machine with the real-engine tests. Each
#: failed beside 3 other workers on 2 cores (2026-12-04: send lag p50 11 ms against a 5 ms bound,
#: 1 /metrics sample of 4, a fitted prefill cost 20% off; the second run, fairlib serve's
#: real-time iterations 8 ms late on a 19.5-ms TTFT), and passes when the machine is its own.
TIMING_TESTS = (
    "tests/test_client_runner.py::test_fixture_replay_timings",
    "tests/test_client_runner.py::test_slow_server_does_not_delay_sends",
    "tests/test_client_runner.py::test_workers_shard_and_share_one_clock",
    "tests/test_client_runner.py::test_metrics_env_and_config",
    "tests/test_client_scrape.py::test_a_slow_metrics_endpoint_does_not_delay_sends",
    "tests/test_serve.py::test_metrics_have_vllms_names_and_count_what_was_sent",
    "tests/test_serve.py::test_single_request_follows_the_engine_model",
    "tests/test_serve.py::test_a_joining_request_shows_its_prefill_and_slows_the_batch",
    "tests/test_serve.py::test_the_servers_policy_decides_who_goes_next",
    "tests/test_cli.py::test_probe_cli_writes_a_loadable_engine",
    "tests/test_fit_endpoint.py::test_fit_recovers_the_served_cost_model",
    "tests/test_probe.py::test_probe_recovers_the_servers_parameters",
    "tests/test_cli_measure.py::test_progress_on_a_terminal_and_not_in_a_pipe",
    "tests/test_cli.py::test_run_against_serve_then_analyze",
    "tests/test_gateway.py::test_residency_from_the_streams_matches_the_engine_models_charge",
    "tests/test_chapter7_http.py",
    # the drain's cut and exit within 0.2 s on the gateway's own clock (issue 26)
    "tests/test_gateway_faults.py::test_a_cut_drain_exits_on_time_saying_what_was_in_flight",
)


def is_timing(nodeid: str) -> bool:
    """Whether ``nodeid`` is one of :data:`TIMING_TESTS` (a file, a test, or a parametrized case)."""
    return any(nodeid == t or nodeid.startswith(t + "::") or nodeid.startswith(t + "[") for t in TIMING_TESTS)


def unit_of(nodeid: str) -> str:
    """The work unit of a test id: its file, or :data:`ENGINE_UNIT` for an engine file."""
    path = nodeid.split("::", 1)[0]
    return ENGINE_UNIT if path in ENGINE_FILES else path


def rank(unit: str, size: int) -> tuple:
    """Sort key: the engine unit, then :data:`LONGEST_FIRST` in its order, notebooks, the rest."""
    if unit == ENGINE_UNIT:
        return (0, 0, 0)
    if unit in LONGEST_FIRST:
        return (1, LONGEST_FIRST.index(unit), 0)
    if unit.endswith(".ipynb"):
        return (2, 0, -size)
    return (3, 0, -size)


class FileUnits(LoadScopeScheduling):
    """LoadScopeScheduling with :func:`unit_of` as the scope and :func:`rank` as the order."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def schedule(self) -> None:
        """LoadScopeScheduling.schedule with the work queue in :func:`rank` order (xdist 3.8's own
        orders by test count only). The workers' collections stay as collected: tests are sent by
        their index in them."""
        if self.collection is not None or not self._check_nodes_have_same_collection():
            return super().schedule()
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        units: dict = {}
        for nodeid in self.collection:
            units.setdefault(unit_of(nodeid), {})[nodeid] = False
        for unit, nodeids in sorted(units.items(), key=lambda kv: rank(kv[0], len(kv[1]))):
            self.workqueue[unit] = nodeids
        for _ in range(max(0, len(self.nodes) - len(self.workqueue))):
            unused, _assigned = self.assigned_work.popitem()
            unused.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()
