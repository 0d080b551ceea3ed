"""Who sends a request: the API key is the identity, a fairness header only where it is trusted.

The trust model (book/gateway.md, "Identity"):

- **Open** (no key anywhere: no ``--api-key``, no tenant with ``api_key``): the fairness header
  (:data:`~fairlib.gateway.config.FAIRNESS_HEADERS`) names the tenant, as llm-d's and the Gateway
  API Inference Extension's do: the gateway trusts the network in front of it.
- **Keyed** (any key): a request without a key, or with a key the gateway does not hold, gets 401.
  A tenant's key names that tenant alone; a header naming another tenant gets 403 (counted as
  ``tenant_mismatch`` under the key's tenant). ``--api-key`` names the default tenant (the file's
  ``default_tenant``, open: ``default``) unless ``--trust-api-key`` says it is a front proxy's.
- **Trusted** (a tenant key with ``trusted = true``, or ``--api-key`` with ``--trust-api-key``):
  the key authenticates a front proxy that authenticated its own clients; its header names the
  tenant (none: the key's own tenant).

Keys are compared with :func:`hmac.compare_digest` against every key (the time taken does not
depend on which key matched, or how much of one), and are never logged or written (the state JSON
says ``"<set>"``). A tenant id, from any header, is refused with 400 before it reaches a label
unless it is valid UTF-8, printable and at most :data:`MAX_TENANT_ID_CHARS` characters.
"""
from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from typing import Optional

from fairlib.gateway.config import (
    DEFAULT_TENANT,
    FAIRNESS_HEADERS,
    MAX_TENANT_ID_CHARS,
    OVERFLOW_TENANT,
    GatewayConfig,
)

__all__ = ["Identity", "Who", "Unauthorized", "Forbidden", "BadTenantId", "check_tenant_id", "read_key", "KEY_ENV",
           "UPSTREAM_KEY_ENV", "tenant_index"]

#: the environment variables a key may come from (a flag's value is visible in ``ps``)
KEY_ENV = "FAIRLIB_GATEWAY_API_KEY"
UPSTREAM_KEY_ENV = "FAIRLIB_UPSTREAM_API_KEY"


def read_key(flag: Optional[str], path: Optional[str], env: str, what: str) -> Optional[str]:
    """A key from ``--X-file PATH`` (its first line), else the environment variable ``env``, else
    the flag's value (None: no key). ``ValueError`` for an unreadable or empty file, or two sources."""
    given = [n for n, v in ((f"--{what}", flag), (f"--{what}-file", path)) if v]
    if len(given) > 1:
        raise ValueError(f"--{what} and --{what}-file: give the key once")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                key = f.readline().strip()
        except OSError as e:
            raise ValueError(f"--{what}-file {path}: cannot read it ({e.strerror or e})") from None
        if not key:
            raise ValueError(f"--{what}-file {path}: the file's first line is empty (the key goes there)")
        return key
    return flag or os.environ.get(env) or None


class Unauthorized(Exception):
    """401: no key where one is needed, a key the gateway does not hold, or no tenant."""

    reason = "unauthorized"

    def __init__(self, message: str, reason: str = "unauthorized"):
        super().__init__(message)
        self.reason = reason


class Forbidden(Exception):
    """403: an untrusted key's request names another tenant in a fairness header."""

    reason = "tenant_mismatch"

    def __init__(self, message: str, tenant: str):
        super().__init__(message)
        self.tenant = tenant


class BadTenantId(ValueError):
    """400: a fairness id that is not valid UTF-8, not printable, or too long."""

    reason = "bad_tenant_id"


def check_tenant_id(v: str, header: str) -> str:
    """``v`` stripped, or :class:`BadTenantId`: valid UTF-8 (aiohttp hands undecodable header
    bytes over as surrogates), printable, 1..MAX_TENANT_ID_CHARS characters."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise BadTenantId(f"header {header}: the tenant id is not valid UTF-8") from None
    v = v.strip()
    if len(v) > MAX_TENANT_ID_CHARS:
        raise BadTenantId(f"header {header}: the tenant id has {len(v)} characters, at most "
                          f"{MAX_TENANT_ID_CHARS} are allowed")
    if not v.isprintable():
        raise BadTenantId(f"header {header}: the tenant id holds control characters")
    return v


@dataclass(frozen=True)
class Who:
    """What a request's credentials say: ``name`` (None: the default tenant or, keyed, none), and
    ``key_tenant`` (the tenant its key names, None: no key or a trusted one)."""
    name: Optional[str]
    key_tenant: Optional[str] = None


class Identity:
    """The keys of one gateway and how a request's headers name its tenant."""

    def __init__(self, cfg: GatewayConfig):
        tt = cfg.tenants
        #: (key bytes, tenant name or None for --api-key, trusted)
        self._keys: list = [(t.api_key.encode("utf-8"), t.name, t.trusted) for t in tt.tenants if t.api_key]
        if cfg.api_key:
            default = tt.default_tenant if not tt.is_open else DEFAULT_TENANT
            self._keys.append((cfg.api_key.encode("utf-8"), default, bool(cfg.trust_api_key)))
        self.keyed = bool(self._keys)

    def _match(self, key: str):
        """The entry of ``key`` (None: no such key), after comparing it with every key."""
        given = key.encode("utf-8", "surrogateescape")
        found = None
        for entry in self._keys:         # no early exit: every key is compared
            if hmac.compare_digest(given, entry[0]):
                found = entry
        return found

    @staticmethod
    def fairness_id(headers) -> Optional[str]:
        """The first fairness header's tenant id (checked: :func:`check_tenant_id`), or None."""
        for h in FAIRNESS_HEADERS:
            v = headers.get(h)
            if v is not None and v.strip():
                return check_tenant_id(v, h)
        return None

    def who(self, headers, key: str) -> Who:
        """The tenant a request names: :class:`Who`; raises :class:`Unauthorized` (401: keyed and
        no key, or a key the gateway does not hold), :class:`Forbidden` (403: an untrusted key and
        a header naming another tenant), :class:`BadTenantId` (400)."""
        fid = self.fairness_id(headers)
        if not self.keyed:
            return Who(fid)
        if not key:
            raise Unauthorized("Unauthorized: send 'Authorization: Bearer <api key>' (this gateway's tenants are "
                               "named by their keys)")
        entry = self._match(key)
        if entry is None:
            raise Unauthorized("Unauthorized: the API key is not one of this gateway's keys")
        _, name, trusted = entry
        if trusted:
            return Who(fid if fid is not None else name)
        if fid is not None and fid != name:
            raise Forbidden(f"the API key names tenant {name!r}; the header {FAIRNESS_HEADERS[0]} may not name "
                            f"another tenant (only a key marked trusted in the tenants file may)", name)
        return Who(name, name)


def tenant_index(names: list, by_name: dict, cfg: GatewayConfig, fid: Optional[str]) -> int:
    """The index of the tenant named ``fid`` (None: none named): a configured tenant, else the
    default tenant, else :class:`Unauthorized`; open: the next index as it first appears (``names``
    and ``by_name`` grow), up to ``max_tenants`` (the last one shared: ``other``)."""
    tt = cfg.tenants
    if not tt.is_open:
        if fid is not None and fid in by_name:
            return by_name[fid]
        if tt.default_tenant is not None:
            return by_name[tt.default_tenant]
        raise Unauthorized(f"no tenant {fid!r}: send a known fairness id ({FAIRNESS_HEADERS[0]}) or API key"
                           if fid else f"no tenant: send the {FAIRNESS_HEADERS[0]} header or a tenant's API key",
                           "unknown_tenant")
    name = fid or DEFAULT_TENANT
    i = by_name.get(name)
    if i is None:
        if len(names) < cfg.max_tenants - 1:        # a new index
            i = len(names)
        else:                                       # the last index is shared: "other"
            name = OVERFLOW_TENANT
            i = by_name.get(name, len(names))
        if name not in by_name:
            names.append(name)
            by_name[name] = i
    return i
