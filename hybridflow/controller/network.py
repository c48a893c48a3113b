"""Which network a worker's collectives and listeners use (docs/resilience.md, "Multi-node").

gloo and nccl pick their interface from the machine's hostname unless GLOO_SOCKET_IFNAME /
NCCL_SOCKET_IFNAME name one; a hostname that resolves to a loopback address (the default on
Debian-like hosts) made a two-node group fail at its first collective. `bind_collectives`
sets both variables in a worker process, before any process group starts, to the interface
that carries the worker's Ray node IP (loopback for an embedded single-node Ray). A value
the worker already has wins: from `ray start`'s environment on its node, or from the
controller (`export_interface`: resources.network_interface or the controller's own
variables, handed to every worker by `worker_env`). `rendezvous_store` hosts a TCPStore on
one address only, never on every interface as torch's own server does.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# What the controller's environment held before any run of this process set the interface.
_STARTING_ENV = {name: os.environ.get(name) for name in VARIABLES}


@dataclass(frozen=True)
class NetworkChoice:
    """The interface a worker's collectives use, and where it came from (the worker already
    had GLOO_SOCKET_IFNAME, the interface of its node IP, or "not found": no interface
    carries the IP, so the libraries fall back to the hostname)."""

    node_ip: str
    interface: str | None
    source: str

    def describe(self) -> str:
        if self.interface is None:
            return (f"network: no interface of node {self.node_ip} carries that address, so gloo picks one from the "
                    "hostname; set resources.network_interface if the ranks cannot connect")
        return f"network: node {self.node_ip} runs collectives on {self.interface} ({self.source})"


def interface_of(ip: str, table: Mapping[str, Sequence[Any]] | None = None) -> str | None:
    """The name of the interface that carries address `ip` (`table`: psutil.net_if_addrs()
    form, read from the machine when None); None when no interface has it."""
    if table is None:
        import psutil

        table = psutil.net_if_addrs()
    wanted = ipaddress.ip_address(ip)
    for name, addresses in table.items():
        for entry in addresses:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if ipaddress.ip_address(entry.address.split("%")[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def bind_collectives(node_ip: str, environ: MutableMapping[str, str] | None = None,
                     table: Mapping[str, Sequence[Any]] | None = None) -> NetworkChoice:
    """Point gloo and nccl at the interface of `node_ip` (`table`: as in `interface_of`) in
    this process's environment (`environ`), keeping a value already there; what gloo will use."""
    env = os.environ if environ is None else environ
    given = env.get(VARIABLES[0])
    found = interface_of(node_ip, table)
    if found is not None:
        for name in VARIABLES:
            env.setdefault(name, found)
    if given is not None:
        return NetworkChoice(node_ip, given, f"{VARIABLES[0]} or resources.network_interface")
    return NetworkChoice(node_ip, found, "the interface of its Ray node IP" if found is not None else "not found")


def export_interface(interface: str | None) -> None:
    """Make `interface` (resources.network_interface) this run's choice on every node: set in
    the controller's environment, from where `worker_env` hands it to each worker. None
    restores what the environment held when this process started."""
    for name in VARIABLES:
        value = interface if interface is not None else _STARTING_ENV[name]
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def worker_env() -> dict[str, str]:
    """The interface variables of the controller's environment, for a worker's runtime env."""
    return {name: os.environ[name] for name in VARIABLES if name in os.environ}


def rendezvous_store(addr: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta) -> Any:
    """A torch.distributed TCPStore that rank 0 serves on `addr` only (loopback for a run on
    one machine, the node's address in a cluster): torch's own server listens on every
    interface, and the store is unauthenticated, so anyone who can reach the port could join
    or disturb the group while it lasts. The other ranks connect to it."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(addr, port, world_size, False, timeout=timeout)
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(max(128, world_size))
    except OSError:
        sock.close()
        raise
    # The store owns the listening socket from here on (detach: Python must not close it).
    return dist.TCPStore(addr, port, world_size, True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=sock.detach())


_reported: set[str] = set()  # the network lines this process printed (`unreported`)


def unreported(infos: Sequence[Mapping[str, Any]]) -> list[str]:
    """The network lines of worker `infos` (WorkerGroup.worker_info) that this process has
    not reported yet, for nodes off loopback (an embedded run's choice is not news)."""
    lines = []
    for info in infos:
        line = info.get("network")
        if line and not ipaddress.ip_address(info["ip"]).is_loopback and line not in _reported:
            _reported.add(line)
            lines.append(line)
    return lines
