"""Open connections per client address (`--max-connections-per-client`), so that one client
cannot hold the server's whole connection budget (`--max-connections`): past its own bound,
that client's next connection is refused (503) before anything is read, while others still
connect. A peer in --trusted-proxies is not bounded (it carries many clients' connections)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class PerClient:
    """Open connections by peer address, bounded at `limit` each (0: no bound). Used on the
    event loop only (the protocol's callbacks), so it needs no lock."""

    def __init__(self, limit: int, proxies: Iterable[Network] = ()) -> None:
        self.limit = limit
        self.proxies = tuple(proxies)
        self.open: dict[str, int] = {}

    def _bounded(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return not any(address in net for net in self.proxies)

    def enter(self, peername: object) -> tuple[bool, str | None]:
        """(admitted, the address counted: hand it to `leave` when the connection ends)."""
        host = peername[0] if isinstance(peername, tuple) and peername else None
        if not self.limit or not isinstance(host, str) or not self._bounded(host):
            return True, None
        if self.open.get(host, 0) >= self.limit:
            return False, None
        self.open[host] = self.open.get(host, 0) + 1
        return True, host

    def leave(self, host: str | None) -> None:
        if host is None:
            return
        left = self.open.pop(host, 1) - 1
        if left > 0:
            self.open[host] = left
