"""Collectives bind the interface of the worker's Ray node IP (never the hostname's address),
a user's GLOO_SOCKET_IFNAME or resources.network_interface overrides it, and a worker process
listens on its node's address only (controller/network.py). The same on a real two-node
cluster: tests/cluster/test_cluster_runs.py."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections import namedtuple

import pytest

from hybridflow.controller import Dispatch, ResourcePool, Worker, WorkerGroup, network, register

Addr = namedtuple("Addr", "family address")  # the two fields of psutil.net_if_addrs() entries read here
TABLE = {
    "lo": [Addr(socket.AF_INET, "127.0.0.1"), Addr(socket.AF_INET6, "::1")],
    "eth0": [Addr(socket.AF_PACKET, "52:54:00:12:34:56"), Addr(socket.AF_INET, "10.77.0.2"),
             Addr(socket.AF_INET6, "fe80::5054:ff:fe12:3456%eth0")],
    "ib0": [Addr(socket.AF_INET, "192.168.7.2")],
}


def test_the_interface_is_the_one_that_carries_the_address():
    assert network.interface_of("10.77.0.2", TABLE) == "eth0"
    assert network.interface_of("192.168.7.2", TABLE) == "ib0"
    assert network.interface_of("fe80::5054:ff:fe12:3456", TABLE) == "eth0"
    assert network.interface_of("10.77.0.9", TABLE) is None
    assert network.interface_of("127.0.0.1") == "lo"  # this machine's own table


def test_a_worker_binds_its_node_interface_unless_one_is_given():
    env: dict[str, str] = {}
    choice = network.bind_collectives("10.77.0.2", env, TABLE)
    assert env == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"} and choice.interface == "eth0"
    env = {"GLOO_SOCKET_IFNAME": "ib0"}  # set by the user (ray start's environment, or the controller)
    choice = network.bind_collectives("10.77.0.2", env, TABLE)
    assert env == {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "eth0"} and choice.interface == "ib0"
    assert "GLOO_SOCKET_IFNAME or resources.network_interface" in choice.describe()
    env = {}
    choice = network.bind_collectives("10.9.9.9", env, TABLE)
    assert env == {} and choice.interface is None and "resources.network_interface" in choice.describe()


def plain_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address, an IPv4-mapped IPv6 one (::ffff:127.0.0.1, a dual-stack socket) as IPv4."""
    ip = ipaddress.ip_address(text)
    return getattr(ip, "ipv4_mapped", None) or ip


class Reporter(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def report(self, collective: bool) -> dict:
        import psutil
        import torch
        import torch.distributed as dist

        if collective:
            self.init_process_group()
            value = torch.ones(1)
            dist.all_reduce(value)
        listening = sorted({str(plain_ip(c.laddr.ip)) for c in psutil.Process().net_connections(kind="inet")
                            if c.status == psutil.CONN_LISTEN})
        return {"env": {name: os.environ.get(name) for name in network.VARIABLES}, "listening": listening}


@pytest.mark.timeout(300)
def test_an_embedded_run_keeps_collectives_and_listeners_on_loopback(ray_local):
    pool = ResourcePool([2])
    group = WorkerGroup(pool, Reporter)
    try:
        reports = group.report(True)
        assert [info["interface"] for info in group.worker_info] == ["lo", "lo"]
        for report in reports:
            assert report["env"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
            assert report["listening"] == ["127.0.0.1"]  # gloo, the store, Ray's own server: never 0.0.0.0
    finally:
        group.shutdown()
        pool.release()


@pytest.mark.timeout(300)
def test_the_runs_interface_setting_reaches_every_worker(ray_local):
    network.export_interface("hf-test0")  # what resources.network_interface=hf-test0 does at the run's start
    pool = ResourcePool([1])
    try:
        group = WorkerGroup(pool, Reporter)
        try:
            (report,) = group.report(False)  # no collective: the interface does not exist here
            assert report["env"] == {"GLOO_SOCKET_IFNAME": "hf-test0", "NCCL_SOCKET_IFNAME": "hf-test0"}
            assert group.worker_info[0]["interface"] == "hf-test0"
        finally:
            group.shutdown()
    finally:
        network.export_interface(None)
        pool.release()
    assert network.worker_env() == {k: os.environ[k] for k in network.VARIABLES if k in os.environ}
