"""How ``fairlib --help`` reads: an example for every subcommand, every option's default, plain
text (no reStructuredText markup).

``HelpFormatter`` keeps descriptions and epilogs as written (the examples' line breaks) and ends
each option's help with its default, ``(default: X)``, unless the help already names it; a flag
says ``(default: off)``. ``EXAMPLES`` is the epilog of each subcommand.
"""
from __future__ import annotations

import argparse

__all__ = ["HelpFormatter", "EXAMPLES", "epilog"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option's default at the end of its help."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (not action.option_strings or action.required or action.default is argparse.SUPPRESS
                or "default" in text.lower()):
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return f"{text} (default: {'off' if isinstance(action, argparse._StoreTrueAction) else 'on'})"
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            return text
        if action.default is None or action.default == [] or action.default == "":
            return f"{text} (default: none)"
        return f"{text} (default: %(default)s)"


EXAMPLES = {
    "serve": """example:
  fairlib serve --port 8000 --iter-base-ms 8 --iter-slope-ms 1.5 --max-batch 16 --policy vtc
  (then: fairlib run --scenario noisy_neighbor --endpoint http://127.0.0.1:8000/v1)""",
    "gateway": """example:
  fairlib gateway --upstream http://127.0.0.1:8000/v1 --policy residency \\
      --cost-model runs/fits/vllm.json --port 8080      # in flight: a credit learned from the engine
  fairlib run --scenario seed000 --endpoint http://127.0.0.1:8080/v1 --server-policy gateway-residency""",
    "epp": """example:
  fairlib epp --upstream http://10.0.0.5:8000/v1 --policy residency --max-inflight 16 --port 9002
  (an Envoy whose ext_proc filter asks 127.0.0.1:9002; or let fairlib start one:
   fairlib gateway --data-plane envoy --upstream http://10.0.0.5:8000/v1 --policy residency --port 8080)""",
    "run": """examples:
  fairlib run --scenario noisy_neighbor --endpoint http://127.0.0.1:8000/v1 --out runs/nn/direct
  fairlib run --scenario noisy_neighbor --endpoint http://127.0.0.1:8080/v1 --label http:gateway-vtc \\
      --out runs/nn/gateway
  fairlib analyze --run runs/nn/direct --run runs/nn/gateway --out nn.md --plots""",
    "simulate": """examples:
  fairlib simulate --scenario noisy_neighbor --policy vtc --out runs/nn/sim-vtc
  fairlib simulate --scenario overload --rho 1.2 --seed 1 --policy residency""",
    "sweep": """example:
  fairlib sweep --scenario noisy_neighbor --policy fcfs --policy vtc --policy residency --seeds 0,1,2 \\
      --rho 0.6,0.9,1.2 --out runs/nn_sweep.csv""",
    "scenarios": """example:
  fairlib scenarios            (then: fairlib simulate --scenario NAME)""",
    "probe": """example:
  fairlib probe --endpoint http://127.0.0.1:8000/v1 --out runs/capacity/vllm.json
  fairlib run --scenario overload --endpoint http://127.0.0.1:8000/v1 --capacity-file runs/capacity/vllm.json""",
    "fit": """example:
  fairlib fit --endpoint http://127.0.0.1:8000/v1 --kind vllm --max-batch 16 --out runs/fits/vllm.json""",
}


def epilog(cmd: str, extra: str = "") -> str:
    """The examples of ``cmd``, after ``extra`` (e.g. the exit status) when given."""
    return (extra + "\n\n" if extra else "") + EXAMPLES[cmd]
