"""Reading an OpenAI completions or chat body: its fields checked, its prompt counted.

A prompt is counted as ``fairlib serve`` counts it and a proxy estimates it before the engine's
``usage`` says: a text prompt is its whitespace-separated words, a token-id prompt exactly its
length, a chat the words of every text content (at least 1). The maximum output is
``max_completion_tokens`` (chat, when given) else ``max_tokens``. Every error is a
:class:`~fairlib.protocol.wire.BadRequest` naming the field.

fairlib's extension: ``est_output_tokens`` (body) or the ``x-fairlib-est-output-tokens`` header,
the output estimate the size-aware policies read (default ``max_tokens``).
"""
from __future__ import annotations

from fairlib.protocol.wire import BadRequest

__all__ = ["answer_tokens", "EST_HEADER", "MAX_COUNT", "word_count", "is_int", "opt_int", "opt_bool", "prompt_length", "messages_length", "prompt_and_max_tokens",
           "parse_proxy_request", "prompt_text", "answer_text"]

#: the header that carries a request's output estimate
EST_HEADER = "x-fairlib-est-output-tokens"
#: the largest token count a request may name (a 32-bit signed integer, as vLLM's fields): larger
#: ones are a 400, never an overflow in the policy's 64-bit arrays
MAX_COUNT = 2 ** 31 - 1


def word_count(text: str, piece: int = 1 << 16) -> int:
    """``len(text.split())`` without the list of every word (a 10 MB prompt's list costs ~20x
    its size): the words of each ``piece`` of characters, less one for each word cut in two
    where two pieces meet."""
    if len(text) <= piece:
        return len(text.split())
    n, prev_word_end = 0, False
    for i in range(0, len(text), piece):
        part = text[i:i + piece]
        n += len(part.split())
        if prev_word_end and not part[0].isspace():
            n -= 1                  # the word that runs over the cut was counted twice
        prev_word_end = not part[-1].isspace()
    return n


def is_int(v) -> bool:
    """An integer and not a boolean (JSON's ``true`` is no count)."""
    return isinstance(v, int) and not isinstance(v, bool)


def opt_int(body: dict, name: str, low: int, default=None):
    """``body[name]``: an integer in ``low``..:data:`MAX_COUNT`, or ``default`` when absent or null."""
    v = body.get(name)
    if v is None:
        return default
    if not is_int(v) or not low <= v <= MAX_COUNT:
        raise BadRequest(f"'{name}' must be an integer in {low}..{MAX_COUNT}, got {str(v)[:40]}", name)
    return v


def opt_bool(body: dict, name: str, default: bool = False) -> bool:
    """``body[name]``: a boolean, or ``default`` when absent or null."""
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"'{name}' must be a boolean, got {v!r}", name)
    return v


def prompt_length(prompt):
    """(prompt_tokens, token ids or None)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        n = word_count(prompt)
        if n == 0:
            raise BadRequest("'prompt' is empty", "prompt")
        return n, None
    if isinstance(prompt, list):
        if not prompt:
            raise BadRequest("'prompt' is empty", "prompt")
        if all(is_int(t) and t >= 0 for t in prompt):
            return len(prompt), prompt
        if all(isinstance(t, (str, list)) for t in prompt):
            raise BadRequest("'prompt': only one prompt per request is supported", "prompt")
        raise BadRequest("'prompt' must be a string or a list of token ids (integers >= 0)", "prompt")
    raise BadRequest(f"'prompt' must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")


def messages_length(messages) -> int:
    """A chat's prompt tokens: the words of every text content, at least 1."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of messages", "messages")
    n = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"'messages[{i}]' must be an object with a string 'role'", "messages")
        c = m.get("content")
        if c is None:
            continue
        if isinstance(c, str):
            n += word_count(c)
        elif isinstance(c, list):
            for part in c:
                if not isinstance(part, dict):
                    raise BadRequest(f"'messages[{i}].content' parts must be objects", "messages")
                if part.get("type") == "text":
                    n += word_count(str(part.get("text", "")))
        else:
            raise BadRequest(f"'messages[{i}].content' must be a string, a list of parts or null", "messages")
    return max(n, 1)


def prompt_and_max_tokens(body: dict, api: str) -> tuple:
    """``(prompt_tokens, prompt token ids or None, max_tokens or None, the field max_tokens came
    from)`` of a chat (``api == "chat"``) or completions body."""
    if api == "chat":
        if "messages" not in body:
            raise BadRequest("'messages' is required", "messages")
        prompt_tokens, prompt_ids = messages_length(body["messages"]), None
        max_tokens = opt_int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = opt_int(body, "max_tokens", 1)
        mt_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    else:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required", "prompt")
        prompt_tokens, prompt_ids = prompt_length(body["prompt"])
        max_tokens = opt_int(body, "max_tokens", 1)
        mt_field = "max_tokens"
    return prompt_tokens, prompt_ids, max_tokens, mt_field


def parse_proxy_request(body, api: str, headers) -> dict:
    """What a proxy reads of a completions/chat body: prompt tokens (exact for token ids, else
    whitespace words), max_tokens, the estimate, priority, stream and include_usage."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    prompt_tokens, _, mt, _ = prompt_and_max_tokens(body, api)
    est = opt_int(body, "est_output_tokens", 1)
    h = headers.get(EST_HEADER)
    if est is None and h is not None:
        try:
            est = int(h) if len(h) < 20 else -1
        except ValueError:
            est = -1
        if not 1 <= est <= MAX_COUNT:
            raise BadRequest(f"header {EST_HEADER} must be an integer in 1..{MAX_COUNT}, got {h[:40]!r}", EST_HEADER)
    prio = body.get("priority")
    if prio is not None and (not is_int(prio) or abs(prio) > MAX_COUNT):
        raise BadRequest(f"'priority' must be an integer in -{MAX_COUNT}..{MAX_COUNT}, got {str(prio)[:40]}",
                         "priority")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"'stream' must be a boolean, got {stream!r}", "stream")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    if body.get("n", 1) != 1:
        raise BadRequest("'n': only one choice per request is supported", "n")
    return {"prompt_tokens": prompt_tokens, "max_tokens": mt, "est": est if est is not None else mt,
            "priority": prio, "stream": stream, "include_usage": bool(stream and so and so.get("include_usage"))}


def prompt_text(body: dict):
    """A request's prompt as text: a completion's prompt (text, or token ids), or a chat's
    message contents joined (text parts of multi-part contents included)."""
    if "messages" not in body:
        return body.get("prompt")
    parts = []
    for m in body.get("messages") or ():
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts += [x.get("text", "") for x in c if isinstance(x, dict) and isinstance(x.get("text"), str)]
    return "\n".join(parts)


def answer_text(obj) -> str:
    """The text of a JSON completion or chat answer (its first choice)."""
    try:
        ch = obj["choices"][0]
        return str(ch.get("text") if "text" in ch else (ch.get("message") or {}).get("content") or "")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""


def answer_tokens(obj) -> int:
    """A JSON answer's ``usage.completion_tokens`` when it is an integer >= 1, else 1 (no usage, or
    an odd one: the answer is charged as one token)."""
    n = (obj.get("usage") or {}).get("completion_tokens") if isinstance(obj, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
