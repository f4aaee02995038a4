"""Pod and node addresses from one 127.P.0.0/16 block per cluster.

Linux routes all of 127.0.0.0/8 to the loopback interface, so a simulated pod can listen on its
own address without any network setup. Each cluster draws its own second octet so that two
dev-clusters on one machine rarely hand out the same address; node addresses take 127.P.0.x and
pods the rest. Addresses are handed out round-robin, so a freed address is not reused at once
(a client may still be talking to the old pod).
"""

from __future__ import annotations

import ipaddress
import random


def random_prefix() -> str:
    return f"127.{random.randint(16, 254)}"


class IpPool:
    def __init__(self, prefix: str) -> None:
        network = ipaddress.IPv4Network(f"{prefix}.0.0/16")
        if not network.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")):
            raise ValueError(f"pod addresses must be loopback, not {network}")
        self._network = network
        self._cursor = 256  # the first 256 addresses are for nodes
        self._used: dict[str, str] = {}  # address → owner

    @property
    def prefix(self) -> str:
        return str(self._network.network_address).rsplit(".", 2)[0]

    def node_ip(self, index: int) -> str:
        return str(self._network.network_address + 1 + index)

    def allocate(self, owner: str) -> str:
        size = self._network.num_addresses
        for _ in range(size):
            candidate = self._network.network_address + self._cursor
            self._cursor = self._cursor + 1 if self._cursor + 1 < size else 256
            address = str(candidate)
            last = int(candidate) & 0xFF
            if last not in (0, 255) and address not in self._used:
                self._used[address] = owner
                return address
        raise RuntimeError(f"no free pod address left in {self._network}")

    def reserve(self, owner: str, address: str) -> None:
        """Adopt an address a pod already has (the simulator restarted)."""
        self._used[address] = owner

    def release(self, address: str) -> None:
        self._used.pop(address, None)

    def owner(self, address: str) -> str | None:
        return self._used.get(address)
