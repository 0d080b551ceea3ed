"""Where the engines are set up and the command line that starts each kind: vLLM's OpenAI server,
llama.cpp's ``llama-server``, ``fairlib serve`` (or any command given), with the request settings
``EngineProcess.endpoint_config`` needs.

Each builder returns ``(command, env, served model name, model path, settings)``.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Optional

from fairlib.calibrate.processes import HOST
from fairlib.kinds import STARTABLE, EngineKind
from fairlib.paths import engines_dir, repo_root

__all__ = ["KINDS", "DEFAULT_SERVED_NAME", "EngineStartError", "vllm_python", "llama_server_path",
           "default_model", "engine_available", "flag_args", "vllm_command", "llamacpp_command",
           "fairlib_command"]

KINDS = STARTABLE
DEFAULT_SERVED_NAME = "tiny-llama"


class EngineStartError(RuntimeError):
    """The engine did not become healthy: it exited, or the timeout passed. The message ends with
    the tail of its log."""



# --- where things are -------------------------------------------------------------------------

def vllm_python() -> Path:
    return engines_dir() / "vllm-venv" / "bin" / "python"


def llama_server_path() -> Path:
    return engines_dir() / "llama.cpp" / "build" / "bin" / "llama-server"


def default_model(kind: str) -> Optional[Path]:
    """The tiny model made by engines/make_models.py: the HF folder (vllm) or the GGUF (llamacpp)."""
    models = engines_dir() / "models"
    metas = sorted(models.glob("*/fairlib_model.json"))
    # the default shape first (4 layers, hidden 512, vocab 8192, seed 0), else the first one made
    metas.sort(key=lambda p: p.parent.name != "tiny-llama-4l-512h-8192v-s0")
    for meta in metas:
        folder = meta.parent
        gguf = folder.parent / f"{folder.name}.gguf"
        if kind == EngineKind.VLLM and (folder / "config.json").exists():
            return folder
        if kind == EngineKind.LLAMACPP and gguf.exists():
            return gguf
    return None


def engine_available(kind: str) -> tuple:
    """``(True, "")`` when ``kind`` can be started here, else ``(False, why)``."""
    if kind not in KINDS:
        return False, f"unknown engine kind {kind!r} (one of {KINDS})"
    if kind == EngineKind.EXTERNAL:
        return True, ""
    if kind == EngineKind.FAIRLIB:
        missing = [m for m in ("aiohttp", "numba") if importlib.util.find_spec(m) is None]
        if missing:
            return False, f"`fairlib serve` needs {missing}: not installed in this environment"
        return True, ""
    setup = {"vllm": "engines/setup_vllm.sh", "llamacpp": "engines/setup_llamacpp.sh"}[kind]
    exe = vllm_python() if kind == EngineKind.VLLM else llama_server_path()
    if not exe.exists():
        return False, f"{exe} is missing: run {setup} (or make engines)"
    if default_model(kind) is None:
        return False, f"no tiny model in {engines_dir() / 'models'}: run engines/setup_models.sh"
    return True, ""


def flag_args(flags: dict) -> list:
    """``{"max_batch": 8, "verbose": True, "policy_param": ["a=1", "b=2"]}`` ->
    ``["--max-batch", "8", "--verbose", "--policy-param", "a=1", "--policy-param", "b=2"]``."""
    args = []
    for k, v in flags.items():
        if v is None or v is False:
            continue
        opt = "--" + k.replace("_", "-")
        if v is True:
            args.append(opt)
        elif isinstance(v, (list, tuple)):  # an "append" option: repeated
            for x in v:
                args += [opt, str(x)]
        else:
            args += [opt, str(v)]
    return args


def vllm_command(port, model=None, served_model_name=DEFAULT_SERVED_NAME, max_num_seqs=16, max_model_len=2048,
          dtype="bfloat16", scheduling_policy=None, kvcache_space_gib=1, omp_threads_bind="0-1",
          return_token_ids=True, per_request_metrics=True, extra_args=(), env=None, python=None):
    py = Path(python) if python else vllm_python()
    if not py.exists():
        raise EngineStartError(f"vllm: {py} is missing: run engines/setup_vllm.sh (or make engines)")
    model = Path(model) if model else default_model(EngineKind.VLLM)
    if model is None:
        raise EngineStartError("vllm: no model given and none in .engines/models (run engines/setup_models.sh)")
    root = repo_root()
    cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--served-model-name", served_model_name, "--host", HOST, "--port", port,
           "--dtype", dtype, "--max-num-seqs", max_num_seqs, "--max-model-len", max_model_len,
           "--disable-uvicorn-access-log"]
    if scheduling_policy:
        cmd += ["--scheduling-policy", scheduling_policy]
    if per_request_metrics:  # server-side TTFT/queue time per request, in the final usage chunk
        cmd += ["--enable-per-request-metrics"]
    cmd += list(extra_args)
    # compile caches: project-local unless the caller's environment already names a folder (CI can
    # keep them outside a fresh clone)
    vcache = Path(os.environ.get("VLLM_CACHE_ROOT") or root / ".cache" / "vllm")
    e = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": root / ".cache" / "huggingface",
         "VLLM_CACHE_ROOT": vcache, "VLLM_CPU_OMP_THREADS_BIND": omp_threads_bind,
         "VLLM_CPU_KVCACHE_SPACE": kvcache_space_gib, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
         "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR") or vcache / "inductor",
         **(env or {})}
    folder = model if (model / "tokenizer.json").exists() else None
    settings = {"extra_body": {"return_token_ids": True} if return_token_ids else {},
                "send_priority": scheduling_policy == "priority", "scheduling_policy": scheduling_policy or "fcfs",
                "max_num_seqs": max_num_seqs, "max_model_len": max_model_len, "dtype": dtype,
                "tokenizer_folder": str(folder) if folder else None}
    return cmd, e, served_model_name, model, settings


def llamacpp_command(port, model=None, alias=DEFAULT_SERVED_NAME, n_parallel=16, ctx_per_slot=2048, threads=2,
              cache_prompt=False, extra_args=(), env=None, binary=None):
    exe = Path(binary) if binary else llama_server_path()
    if not exe.exists():
        raise EngineStartError(f"llamacpp: {exe} is missing: run engines/setup_llamacpp.sh (or make engines)")
    model = Path(model) if model else default_model(EngineKind.LLAMACPP)
    if model is None:
        raise EngineStartError("llamacpp: no model given and none in .engines/models (run engines/setup_models.sh)")
    cmd = [exe, "-m", model, "--host", HOST, "--port", port, "-np", n_parallel,
           "-c", int(n_parallel) * int(ctx_per_slot), "-t", threads, "--poll", 0, "--metrics",
           "--no-webui", "--alias", alias, *extra_args]
    folder = model.parent / model.stem if model.suffix == ".gguf" else None
    settings = {"extra_body": {} if cache_prompt else {"cache_prompt": False},
                "n_parallel": n_parallel, "ctx_per_slot": ctx_per_slot, "threads": threads,
                "tokenizer_folder": str(folder) if folder and (folder / "tokenizer.json").exists() else None}
    return cmd, dict(env or {}), alias, model, settings


def fairlib_command(port, command=None, model=None, env=None, **flags):
    if command is None:  # fairlib serve (fairlib.cli): the engine model in real time, a test double
        model = model or "fairlib-sim"
        cmd = [sys.executable, "-m", "fairlib.cli", "serve", "--host", HOST, "--port", port,
               "--model", model, *flag_args(flags)]
    else:  # a generic command: "{port}" and "{host}" are filled in
        if flags:
            raise ValueError(f"a generic command takes no flags (got {sorted(flags)}): put them in the command")
        model = model or "default"
        cmd = [str(c).format(port=port, host=HOST) for c in command]
    return cmd, dict(env or {}), model, None, {}
