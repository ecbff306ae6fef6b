"""Who the client is, behind proxies: `X-Forwarded-For` is believed only from a peer in
--trusted-proxies (any peer can write the header).

Used where the answer depends on the client being local (`/metrics` is open to loopback
clients without a key). uvicorn's own proxy-header handling is off (api/operations/connections.py): it
trusted 127.0.0.1 by default, so behind a proxy on the same host every client counted as
local, and any local process could name any client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import Scope

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("["):  # [v6]:port
        text = text[1 : text.find("]")] if "]" in text else text
    elif text.count(":") == 1:  # v4:port
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class TrustedProxies:
    def __init__(self, entries: Iterable[str]) -> None:
        """`entries`: addresses or networks (`10.0.0.0/8`); validated by config (its checks)."""
        self.networks: tuple[Network, ...] = tuple(ipaddress.ip_network(e, strict=False) for e in entries)

    def trusts(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(address in net for net in self.networks)

    def client(self, scope: Scope) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        """The client's address, or None where it is unknown: a request that says it was
        forwarded (X-Forwarded-For or Forwarded) by a peer we do not trust, or that came
        through a trusted proxy without naming its client. Through trusted proxies the
        client is the rightmost X-Forwarded-For entry that is not itself a trusted proxy."""
        peer = scope.get("client")
        address = _address(peer[0]) if peer else None
        if address is None:
            return None
        headers = Headers(scope=scope)
        forwarded = headers.getlist("x-forwarded-for")
        if not self.trusts(address):
            return None if forwarded or "forwarded" in headers else address
        hops = [hop for value in forwarded for hop in value.split(",")]
        if not hops:
            return None  # a proxy we trust, which did not say for whom
        for hop in reversed(hops):
            hop_address = _address(hop)
            if hop_address is None:
                return None
            if not self.trusts(hop_address):
                return hop_address
        return _address(hops[0])
