"""The WeightBridge in one process: two threads as sender and receiver over gloo.

Versions travel with each sync; the backend is nccl between GPU pools and gloo on CPU,
and members that disagree are refused before any group is built. (nccl itself cannot run
on a CPU-only machine: only its selection is tested here.)"""

from __future__ import annotations

import threading

import pytest
import torch

from hybridflow.engines.reshard.cross_pool import WeightBridge, bridge_backend, free_port, manifest_of


def _in_threads(*targets):
    results, errors = [None] * len(targets), []

    def run(i, fn):
        try:
            results[i] = fn()
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results, errors


def test_backend_is_nccl_on_gpus_and_gloo_on_cpu():
    assert bridge_backend(cuda_available=True) == "nccl"
    assert bridge_backend(cuda_available=False) == "gloo"


def test_members_on_different_devices_are_refused():
    port = free_port("127.0.0.1")
    _, errors = _in_threads(lambda: WeightBridge("127.0.0.1", port, 0, 2, [], backend="gloo", timeout_s=30),
                            lambda: WeightBridge("127.0.0.1", port, 1, 2, [], backend="nccl", timeout_s=30))
    assert len(errors) == 2 and all("disagree on the backend" in str(e) for e in errors)


def test_syncs_carry_their_version_and_the_exact_tensors():
    named = [("a", torch.randn(3, 4)), ("b", torch.randn(5)), ("c", torch.arange(6, dtype=torch.int64))]
    manifest = manifest_of(named)
    port = free_port("127.0.0.1")
    bridges, errors = _in_threads(lambda: WeightBridge("127.0.0.1", port, 0, 2, manifest, bucket_bytes=48),
                                  lambda: WeightBridge("127.0.0.1", port, 1, 2, manifest, bucket_bytes=48))
    assert not errors and bridges[0].backend == "gloo"
    got: list = []
    (sent, received), errors = _in_threads(lambda: bridges[0].send(iter(named), version=7),
                                           lambda: bridges[1].receive(got.extend))
    assert not errors
    assert sent.version == received.version == 7 and sent.bytes == received.bytes == 12 * 4 + 5 * 4 + 6 * 8
    assert sent.buckets == 3  # a float bucket cannot hold a 48-byte and a 20-byte tensor; int64 gets its own
    assert [n for n, _ in got] == ["a", "b", "c"]
    for (_, want), (_, have) in zip(named, got):
        assert torch.equal(want, have)


def test_bad_backend_name():
    with pytest.raises(ValueError, match="nccl' or 'gloo"):
        WeightBridge("127.0.0.1", free_port("127.0.0.1"), 0, 2, [], backend="mpi", timeout_s=5)


def test_the_sender_hosts_the_store_on_the_bridge_address_only():
    from tests.processes import listening_addresses

    port = free_port("127.0.0.1")
    bridges, errors = _in_threads(lambda: WeightBridge("127.0.0.1", port, 0, 2, [], timeout_s=30),
                                  lambda: WeightBridge("127.0.0.1", port, 1, 2, [], timeout_s=30))
    assert not errors
    assert listening_addresses(port) == ["127.0.0.1"]  # torch's own store server would listen on 0.0.0.0 / ::
