"""https:// through the send loop's HTTP/1.1 client (fairlib.client.http1): a TLS server with a
self-signed certificate made by openssl for this test; verified against it (SSL_CERT_FILE, as
OpenSSL reads it, or an explicit context), refused without it."""
import asyncio
import shutil
import ssl
import subprocess

import pytest

from fairlib.client.http1 import ConnectError, HttpSession

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

BODY = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"6\r\ndata: \r\n5\r\nhello\r\n0\r\n\r\n")


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


async def serve_once(cert, client_ctx):
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(*map(str, cert))
    heads = []

    async def handle(reader, writer):
        try:
            while True:
                heads.append(await reader.readuntil(b"\r\n\r\n"))
                writer.write(BODY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    async with server, HttpSession(timeout_s=10, ssl_context=client_ctx) as session:
        got = []
        for _ in range(2):
            async with session.post(f"https://127.0.0.1:{port}/v1/completions", data=b"{}") as resp:
                got.append((resp.status, resp.content_type, await resp.read()))
        return got, dict(session.stats), heads


def test_https_verified_against_the_servers_certificate(cert):
    ctx = ssl.create_default_context(cafile=str(cert[0]))
    got, stats, heads = asyncio.run(serve_once(cert, ctx))
    assert got == [(200, "text/event-stream", b"data: hello")] * 2
    assert stats == {"connections": 1, "reused": 1, "retries": 0}     # keep-alive over TLS
    assert heads[0].startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")


def test_https_default_context_reads_ssl_cert_file(cert, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", str(cert[0]))
    got, _, _ = asyncio.run(serve_once(cert, None))       # the client's own default context
    assert got[0] == (200, "text/event-stream", b"data: hello")


def test_https_unknown_certificate_is_a_connect_error(cert, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        asyncio.run(serve_once(cert, None))
