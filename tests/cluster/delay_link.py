"""A delayed point-to-point link between two network namespaces, for the cluster tests:
this kernel has no `tc netem`, so a tun device `hfd` in each namespace and this process
between them, holding every packet for DELAY_MS before writing it out on the other side.

    python delay_link.py NS_A NS_B DELAY_MS      # prints "ready" once both devices exist

The devices vanish when this process ends (netns.py kills it by PID). The queue is bounded
(MAX_QUEUED packets; more are dropped, as a full router queue would); the rate is limited
by a tc tbf qdisc on each device (netns.py), not here.
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import os
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
CLONE_NEWNET = 0x40000000
MAX_QUEUED = 20000
DEVICE = "hfd"


def open_tun_in(namespace: str) -> int:
    """A tun device named DEVICE created inside `namespace` (it lives where TUNSETIFF ran)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ns_fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(ns_fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {namespace}")
    finally:
        os.close(ns_fd)
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", DEVICE.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def forward(a: int, b: int, delay_s: float) -> None:
    other = {a: b, b: a}
    queue: collections.deque[tuple[float, int, bytes]] = collections.deque()
    while True:
        wait = max(0.0, queue[0][0] - time.monotonic()) if queue else None
        ready, _, _ = select.select([a, b], [], [], wait)
        now = time.monotonic()
        for fd in ready:
            packet = os.read(fd, 65536)
            if len(queue) < MAX_QUEUED:
                queue.append((now + delay_s, other[fd], packet))
        while queue and queue[0][0] <= now:
            _, out, packet = queue.popleft()
            try:
                os.write(out, packet)
            except OSError:  # the device is down for a moment: the packet is lost, as on a wire
                pass


def main() -> None:
    ns_a, ns_b, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    a, b = open_tun_in(ns_a), open_tun_in(ns_b)
    print("ready", flush=True)
    forward(a, b, delay_ms / 1000.0)


if __name__ == "__main__":
    main()
