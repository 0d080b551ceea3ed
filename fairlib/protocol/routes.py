"""The aiohttp side of an OpenAI-compatible server: its error answers, its middlewares, reading a
JSON body, and :class:`OpenAIServer`, the handlers both of fairlib's servers are made of.

Every error a server answers is OpenAI's error JSON (:func:`fairlib.protocol.wire.error_body`):
400 naming the field, 401 without the API key, 404 naming the routes, 405 naming the allowed
methods, 413 over :data:`MAX_BODY_BYTES`, 500 for a fault of the server itself.
"""
from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod

from aiohttp import web

from fairlib.protocol.wire import BadRequest, error_body, error_type

__all__ = ["MAX_BODY_BYTES", "OpenAIServer", "error_response", "bad_request", "read_json", "bearer",
           "openai_error_middleware", "require_key"]

#: the largest request body taken (larger: 413)
MAX_BODY_BYTES = 64 * 2 ** 20


def error_response(status: int, message: str, type_: str, param=None) -> web.Response:
    """An answer with OpenAI's error JSON."""
    return web.Response(body=error_body(status, message, type_, param), status=status, content_type="application/json")


def bad_request(e: BadRequest) -> web.Response:
    """The error answer of a :class:`BadRequest`."""
    return error_response(e.status, e.message, e.type, e.param)


async def read_json(request: web.Request):
    """The request's JSON body (any JSON value); :class:`BadRequest` when it is not JSON or is
    nested too deeply to parse."""
    try:
        return await request.json(loads=json.loads)
    except ValueError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("the request body is not valid JSON: nested too deeply") from None


def bearer(request: web.Request) -> str:
    """The key of an ``Authorization: Bearer KEY`` header ('' without one)."""
    a = request.headers.get("Authorization", "")
    return a[7:].strip() if a[:7].lower() == "bearer " else ""


def openai_error_middleware(routes, max_body_bytes: int, fault: str = "internal server error"):
    """A middleware that answers every error in OpenAI's error JSON: aiohttp's own 404 (naming
    ``routes``), 405, 413 (over ``max_body_bytes``), and any fault of the server itself (500)."""

    @web.middleware
    async def openai_errors(request: web.Request, handler):
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            if e.status == 404:
                msg = f"no route {request.method} {request.path} (routes: {', '.join(routes)})"
            elif e.status == 405:
                allowed = ", ".join(sorted(getattr(e, "allowed_methods", ()) or ()))
                msg = f"method {request.method} is not allowed on {request.path} (allowed: {allowed})"
            elif e.status == 413:
                msg = f"the request body exceeds {max_body_bytes} bytes ({max_body_bytes / 2 ** 20:g} MiB)"
            else:
                msg = e.text or e.reason
            return error_response(e.status, msg, error_type(e.status))
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as e:  # a fault of the server: still an answer the client can parse
            return error_response(500, f"{fault}: {type(e).__name__}: {e}", "InternalServerError")

    return openai_errors


def require_key(key: str):
    """vLLM's ``--api-key``: a request to a ``/v1`` route without ``Authorization: Bearer <key>``
    gets 401 in OpenAI's error JSON; ``/health``, ``/version`` and ``/metrics`` stay open."""

    @web.middleware
    async def check(request: web.Request, handler):
        if request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
            return error_response(401, "Unauthorized: send 'Authorization: Bearer <api key>'",
                                  "AuthenticationError")
        return await handler(request)

    return check


class OpenAIServer(ABC):
    """An OpenAI-compatible server as one object: its routes are its methods.

    A subclass says which routes it answers (:meth:`routes`) and implements :meth:`generate`,
    :meth:`models`, :meth:`health` and :meth:`metrics`; :meth:`make_app` builds the aiohttp
    application, with the error middleware in front of every route. Each handler takes the
    ``aiohttp`` request and returns the response (a stream it wrote to its end, or JSON).
    """

    #: what a 500 calls a fault of this server ("internal server error: KeyError: ...")
    fault = "internal server error"

    @abstractmethod
    def routes(self) -> list:
        """Called once by :meth:`make_app`.
        Returns ``[(method, path, handler)]`` in the order a 404 lists them (GET routes answer HEAD too)."""

    def middlewares(self) -> list:
        """Called once by :meth:`make_app`.
        Returns the middlewares that run after the error middleware (none by default)."""
        return []

    async def on_startup(self, app: web.Application) -> None:
        """Called when the application starts, before it takes a request.
        Returns nothing; starts what the handlers need (a driver, a client session)."""
        return None

    async def on_cleanup(self, app: web.Application) -> None:
        """Called when the application stops, after the last request.
        Returns nothing; stops what :meth:`on_startup` started."""
        return None

    def make_app(self) -> web.Application:
        """Called once to serve: the routes, the middlewares and the start/stop hooks.
        Returns the aiohttp application (bodies up to :data:`MAX_BODY_BYTES`)."""
        routes = self.routes()
        errors = openai_error_middleware(tuple(f"{m} {p}" for m, p, _ in routes), MAX_BODY_BYTES, self.fault)
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[errors, *self.middlewares()])
        app.on_startup.append(self.on_startup)
        app.on_cleanup.append(self.on_cleanup)
        for method, path, handler in routes:
            (app.router.add_get if method == "GET" else app.router.add_post)(path, handler)
        return app

    @abstractmethod
    async def generate(self, request: web.Request, api: str) -> web.StreamResponse:
        """Called for each completions (``api == "completions"``) or chat (``"chat"``) request.
        Returns its answer: JSON, an event stream written to its end, or OpenAI's error JSON."""

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """Called for ``POST /v1/completions``.
        Returns :meth:`generate`'s answer for a completion."""
        return await self.generate(request, "completions")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """Called for ``POST /v1/chat/completions``.
        Returns :meth:`generate`'s answer for a chat completion."""
        return await self.generate(request, "chat")

    @abstractmethod
    async def models(self, request: web.Request) -> web.Response:
        """Called for ``GET /v1/models``.
        Returns the model list (``{"object": "list", "data": [...]}``) or an error JSON."""

    @abstractmethod
    async def health(self, request: web.Request) -> web.Response:
        """Called for ``GET /health`` (a load balancer's probe).
        Returns 200 with no body while the server takes requests, else 503 (or 500) error JSON."""

    @abstractmethod
    async def metrics(self, request: web.Request) -> web.Response:
        """Called for ``GET /metrics`` (a Prometheus scrape).
        Returns the text exposition format 0.0.4."""
