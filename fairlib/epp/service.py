"""``fairlib epp``'s gRPC service: ``envoy.service.ext_proc.v3.ExternalProcessor/Process``, one
bidirectional stream per HTTP request, each handled by an :class:`~fairlib.epp.exchange.Exchange`
on the gateway's event loop (grpc.aio), so the policy, the waiting line and the charge are the
one :class:`~fairlib.gateway.core.Gateway`'s."""
from __future__ import annotations

import os

# Envoy is started with fork + exec (it must die with its parent: PR_SET_PDEATHSIG before exec);
# gRPC's fork handlers are for a child that goes on running Python, which this one never does.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402 - after the fork setting, which gRPC reads once
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from fairlib.epp.exchange import Exchange
from fairlib.gateway.app import GatewayApp

__all__ = ["Picker", "start_grpc"]


class Picker(pb_grpc.ExternalProcessorServicer):
    """The endpoint picker: the gateway's decisions (``ga``: its handlers) over ``ext_proc``."""

    def __init__(self, ga: GatewayApp):
        self.ga = ga
        self.streams = 0            # ext_proc streams open now

    async def Process(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        """Each phase Envoy sends, answered in order; an immediate response ends the exchange."""
        ex = Exchange(self.ga)
        self.streams += 1
        try:
            async for msg in request_iterator:
                kind = msg.WhichOneof("request")
                if kind == "request_headers":
                    out = ex.on_request_headers(msg.request_headers)
                elif kind == "request_body":
                    out = await ex.on_request_body(msg.request_body)
                elif kind == "response_headers":
                    out = ex.on_response_headers(msg.response_headers)
                elif kind == "response_body":
                    out = ex.on_response_body(msg.response_body)
                else:                   # trailers: the bootstrap skips them; pass them on
                    continue
                yield out
                if out.HasField("immediate_response"):
                    return
        finally:
            self.streams -= 1
            ex.close()


async def start_grpc(ga: GatewayApp, host: str, port: int):
    """The picker's gRPC server bound on ``host:port`` (0: a free port) and started:
    ``(server, picker, port)``."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    picker = Picker(ga)
    pb_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port} for gRPC (the port is in use?)")
    await server.start()
    return server, picker, bound
