"""The kinds of OpenAI-compatible server fairlib knows, named once.

Each command or chapter accepts the subset it can work with; the subsets are tuples of the
kinds' string values, which is what fit files, run directories and command lines carry.
"""
from __future__ import annotations

from enum import Enum

__all__ = ["EngineKind", "REAL_ENGINES", "FIT_KINDS", "SAVED_FIT_KINDS", "ENDPOINT_KINDS", "STARTABLE", "DATA_PLANES"]


class EngineKind(str, Enum):
    """A server kind; its value is the name written to files and given on command lines."""

    VLLM = "vllm"            # vLLM's OpenAI-compatible server
    LLAMACPP = "llamacpp"    # llama.cpp's llama-server
    FAIRLIB = "fairlib"      # fairlib serve: the engine model behind the OpenAI API (a test double)
    OPENAI = "openai"        # any other OpenAI-compatible server: no kind-specific request settings
    EXTERNAL = "external"    # a server started elsewhere, reached at its base URL (not started here)


def _values(*kinds: EngineKind) -> tuple:
    return tuple(k.value for k in kinds)


#: the real engines the book starts, fits and measures (chapters 1-8 live)
REAL_ENGINES = _values(EngineKind.VLLM, EngineKind.LLAMACPP)
#: the server kinds a fit records (``fairlib.calibrate.fit``)
FIT_KINDS = _values(EngineKind.VLLM, EngineKind.LLAMACPP, EngineKind.FAIRLIB, EngineKind.OPENAI)
#: the kinds a saved fit is named by instead of a path (``load_fit("vllm")``: ``data/engines/vllm.json``)
SAVED_FIT_KINDS = _values(EngineKind.VLLM, EngineKind.LLAMACPP, EngineKind.FAIRLIB)
#: what ``fairlib fit --endpoint URL --kind`` may name (``fairlib serve`` always tells its own kind)
ENDPOINT_KINDS = _values(EngineKind.VLLM, EngineKind.LLAMACPP, EngineKind.OPENAI)
#: what ``fairlib.calibrate.lifecycle.start_engine`` starts (``external``: attaches to a base URL)
STARTABLE = _values(EngineKind.FAIRLIB, EngineKind.VLLM, EngineKind.LLAMACPP, EngineKind.EXTERNAL)
#: where the gateway's decisions run: ``python`` (``fairlib gateway`` relays every byte) or
#: ``envoy`` (Envoy in front, the same decisions in ``fairlib epp``): ``--data-plane``
DATA_PLANES = ("python", "envoy")
