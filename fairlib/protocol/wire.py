"""The OpenAI wire format's small pieces, free of any HTTP library: compact JSON, the error body
and its ``type``, a request error that names its field, and the ``usage`` object.

An error body is ``{"error": {"message", "type", "param", "code"}}`` (vLLM's ``ErrorResponse``):
``type`` is the HTTP status's phrase in CamelCase + ``Error`` (:func:`error_type`), ``param`` the
offending request field (or ``None``), ``code`` the HTTP status.
"""
from __future__ import annotations

import json
from http import HTTPStatus

__all__ = ["dumps", "BadRequest", "ParamError", "error_type", "error_body", "usage"]

#: JSON as vLLM writes it: no spaces, UTF-8 kept (``dumps(obj) -> str``)
dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class BadRequest(Exception):
    """A request the server will not take: its message, the field at fault (``param``), the HTTP
    status (400 unless said) and the error ``type``."""

    def __init__(self, message: str, param=None, status: int = 400, type_: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.type = message, param, status, type_


class ParamError(ValueError):
    """A bad value of the request field ``param`` (a ``ValueError``: callers that catch those
    answer 400 and name ``param`` in the error JSON)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def error_type(status: int) -> str:
    """vLLM's error type for an HTTP status: its phrase in CamelCase + ``Error`` (404:
    ``NotFoundError``, 405: ``MethodNotAllowedError``, 500: ``InternalServerError``)."""
    try:
        name = "".join(w[:1].upper() + w[1:] for w in HTTPStatus(status).phrase.replace("-", " ").split())
    except ValueError:
        name = f"Http{status}"
    return name if name.endswith("Error") else name + "Error"


def error_body(status: int, message: str, type_: str, param=None) -> bytes:
    """The error JSON an OpenAI-compatible server answers with (encoded)."""
    return dumps({"error": {"message": message, "type": type_, "param": param, "code": status}}).encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """The ``usage`` object (vLLM's field order): prompt, total, completion tokens."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}
