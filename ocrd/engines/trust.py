"""Which servers a fleet's router may name: a router's worker list is only a suggestion.

vllm-router asks no key for `POST /workers`: whoever reaches its port can add a server
that would be sent pages and ocrd's API key. So a worker the router lists gets nothing
(no probe, no test page, no page, no key) unless the operator trusts it:
`engine.openai.trusted_workers` names hosts, CIDR networks or host:port (unset: the
router's own host), and `require_tls` asks for https. Servers in `base_urls` are trusted
as the operator listed them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from yarl import URL

from ocrd.config.engine import OpenAiConfig, TrustedEntry, trusted_entry

DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class WorkerTrust:
    entries: tuple[TrustedEntry, ...]
    require_tls: bool

    @classmethod
    def of(cls, config: OpenAiConfig) -> WorkerTrust:
        """The trusted set of `config`: its `trusted_workers`, or the router's host."""
        listed = config.trusted_workers
        if listed is None:
            host = urlsplit(config.router_url or "").hostname
            listed = (host,) if host else ()
        return cls(tuple(trusted_entry(entry) for entry in listed), config.require_tls)

    def refusal(self, url: str) -> str | None:
        """None if the worker at `url` may be sent pages, else why not (for people)."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return "its URL is not valid"
        if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            return "its URL is not an http(s) URL with a host"
        if parts.username is not None or parts.password is not None:
            return "its URL carries credentials"
        if parts.query or parts.fragment or "\\" in url:
            return "its URL carries a query, a fragment or a backslash"
        if not _read_alike(parts.hostname, port, url):
            return "its URL names another host or port to the HTTP client than it seems to"
        if self.require_tls and parts.scheme != "https":
            return "it is not https and engine.openai.require_tls is set"
        host = parts.hostname.lower()
        port = port or DEFAULT_PORTS[parts.scheme]
        if any(_matches(entry, host, port) for entry in self.entries):
            return None
        return (
            f"{host}:{port} is not in engine.openai.trusted_workers; add its host, network "
            "or host:port there if it is yours"
        )


def _read_alike(host: str, port: int | None, url: str) -> bool:
    """Whether aiohttp's URL parser (yarl), which the pages would go by, finds the host and
    port urlsplit found: a URL two parsers read differently could be trusted under one
    host and sent to another."""
    try:
        spoken = URL(url)
    except ValueError:
        return False
    if spoken.port != (port or DEFAULT_PORTS.get(spoken.scheme)):
        return False
    return _same_host(spoken.host or "", host)


def _same_host(one: str, other: str) -> bool:
    try:
        return ipaddress.ip_address(one) == ipaddress.ip_address(other)
    except ValueError:
        return one.lower() == other.lower()


def _matches(entry: TrustedEntry, host: str, port: int) -> bool:
    if entry.network is not None:
        try:
            return ipaddress.ip_address(host) in entry.network
        except ValueError:  # a name: only a name entry trusts it (no lookup to be fooled)
            return False
    return entry.host == host and entry.port in (None, port)
