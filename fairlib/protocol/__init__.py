"""The wire formats fairlib's servers speak, on a floor of their own below both of them.

``fairlib serve`` (the test double) and ``fairlib gateway`` (the proxy) read and answer the OpenAI
completions and chat API as vLLM does, and expose Prometheus metrics; this package is what they
share, so that neither imports the other. The measurement client reads streams with the same
parser.

    wire.py        compact JSON, the error body and its type, BadRequest, usage (no HTTP library)
    parse.py       a completions/chat body checked field by field, its prompt counted
    sse.py         Server-Sent Events: the incremental parser, the chunk interpreter, the frames
                   a server writes (data lines, [DONE], the in-stream error event)
    routes.py      aiohttp: error answers, the error and API-key middlewares, OpenAIServer (the
                   handlers of an OpenAI-compatible server as the methods of one object)
    prometheus.py  the metrics (prometheus_client, a registry per server) and their exposition

The package itself imports nothing: ``fairlib.protocol.sse`` does not load aiohttp.
"""
