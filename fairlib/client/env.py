"""``env.json``: the client's environment and what the endpoint says about itself.

Asks the endpoint for ``/v1/models`` (OpenAI), ``/version`` (vLLM) and ``/props`` (llama.cpp, a
few fields), and records the ``Server`` header. A question the server cannot answer is recorded as
an error string, never raised. The endpoint's credentials are sent with each question and masked
in what is returned (``fairlib.client.endpoint.redact``).
"""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib import metadata

from fairlib.client.endpoint import mask_url, redact
from fairlib.paths import repo_root

__all__ = ["collect_env", "fetch_json"]

PACKAGES = ("aiohttp", "numpy", "pandas", "fairlib")
PROPS_KEYS = ("build_info", "model_path", "total_slots", "n_ctx", "model_alias")

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch_json(url: str, timeout_s: float = 3.0, headers: dict | None = None) -> dict:
    """``{"status", "server", "body"}`` or ``{"error": ...}`` for one GET (with ``headers``)."""
    try:
        with _opener.open(urllib.request.Request(url, headers=dict(headers or {})), timeout=timeout_s) as r:
            raw = r.read(1 << 20)
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw[:2000].decode("utf-8", "replace")
            return {"status": r.status, "server": r.headers.get("Server"), "body": body}
    except urllib.error.HTTPError as e:
        return {"error": f"HTTP {e.code}"}
    except (OSError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _versions() -> dict:
    out: dict = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git_commit() -> str | None:
    root = repo_root()
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=5)
        out = r.stdout.strip()
        return out if r.returncode == 0 and len(out) == 40 else None
    except (OSError, subprocess.SubprocessError):
        return None


def collect_env(endpoint) -> dict:
    """Client environment plus the endpoint's model list and version, as far as it tells; no
    secret of ``endpoint`` in it."""
    root = endpoint.server_root
    auth = {**endpoint.headers, **endpoint.auth_headers}
    models = fetch_json(endpoint.plain_base_url.rstrip("/") + "/models", headers=auth)
    version = fetch_json(root + "/version", headers=auth)
    props = fetch_json(root + "/props", headers=auth)
    if isinstance(props.get("body"), dict):
        props["body"] = {k: props["body"][k] for k in PROPS_KEYS if k in props["body"]}
    server_version = None
    if isinstance(version.get("body"), dict):
        server_version = version["body"].get("version")
    elif isinstance(props.get("body"), dict):
        server_version = props["body"].get("build_info")
    return redact({
        "collected_wall": time.time(),
        "python": sys.version,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "packages": _versions(),
        "fairlib_git_commit": _git_commit(),
        "endpoint": {
            "base_url": mask_url(endpoint.base_url),
            "model": endpoint.model,
            "server_version": server_version,
            "server_header": models.get("server") or version.get("server"),
            "models": models,
            "version": version,
            "props": props,
        },
    }, endpoint.secrets)
