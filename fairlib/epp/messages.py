"""The ``ext_proc`` answers the picker sends (``envoy.service.ext_proc.v3``, from the ``xds-protos``
package): continue a phase, continue with the upstream chosen (GIE's header and ``envoy.lb``
metadata), or answer the client at once."""
from __future__ import annotations

from typing import Optional

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from fairlib.epp.bootstrap import DEST_HEADER

__all__ = ["pb", "headers_continue", "body_continue", "body_response", "immediate"]

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
#: the answers that carry nothing, built once
_REQ_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
_RESP_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
_RESP_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse())


def _mutation(set_headers: dict, remove: tuple = ()) -> pb.HeaderMutation:
    hm = pb.HeaderMutation(remove_headers=list(remove))
    for k, v in set_headers.items():
        hm.set_headers.append(base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=k.lower(), raw_value=str(v).encode()), append_action=_OVERWRITE))
    return hm


def headers_continue(request: bool) -> pb.ProcessingResponse:
    """Go on with the request's (``request``) or the response's headers as they are."""
    return _REQ_HEADERS if request else _RESP_HEADERS


def body_response() -> pb.ProcessingResponse:
    """Go on with a response body chunk as it is."""
    return _RESP_BODY


def body_continue(set_headers: dict, remove: list, new_body: Optional[bytes], dest: str) -> pb.ProcessingResponse:
    """The request body phase's answer for an admitted request: headers set (the destination
    among them) and removed, the body replaced when ``new_body`` is given, and the destination in
    the dynamic metadata under ``envoy.lb`` as GIE's protocol has it (the two never differ)."""
    common = pb.CommonResponse(header_mutation=_mutation(set_headers, tuple(remove)))
    if new_body is not None:
        common.body_mutation.body = new_body
    md = struct_pb2.Struct()
    md.get_or_create_struct("envoy.lb")[DEST_HEADER] = dest
    return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common), dynamic_metadata=md)


def immediate(status: int, headers: dict, body: bytes) -> pb.ProcessingResponse:
    """Envoy answers the client at once: ``status``, ``headers`` (hop-by-hop and length headers
    left to Envoy) and ``body``."""
    keep = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "transfer-encoding", "connection")}
    ir = pb.ImmediateResponse(status=http_status_pb2.HttpStatus(code=status), headers=_mutation(keep),
                              body=bytes(body or b""))
    return pb.ProcessingResponse(immediate_response=ir)
