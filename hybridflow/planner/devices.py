"""Devices the planner costs phases on, and the efficiency factors that turn a roofline
into a predicted time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridflow.cache import cache_path


@dataclass(frozen=True)
class DeviceSpec:
    """One device type (module docstring); bandwidths in bytes/s, memory in bytes."""

    name: str
    peak_flops: float
    mem_bw: float
    memory_bytes: float
    intra_bw: float
    inter_bw: float
    source: str
    # Of its own FLOP rate / memory bandwidth, what a device keeps while the other devices
    # of its node work too (GPUs: 1; cores that share vector units or memory channels: less).
    shared_flops: float = 1.0
    shared_bw: float = 1.0

    @property
    def comm_overlaps_compute(self) -> bool:
        """Whether collectives run beside the compute: a GPU's on their own engines (NCCL),
        so FSDP's prefetched all-gathers hide under the layers; a CPU's gloo collectives
        take the cores the compute runs on, so they add to it (measured here: the demo
        actor's update on 2 ranks costs its compute plus every FSDP call)."""
        return self.name != "cpu"


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of the roofline per phase kind, and fixed overheads in seconds.

    train / forward / prefill: fraction of peak FLOP/s; decode_bw: fraction of memory
    bandwidth while decoding; comm: fraction of link bandwidth. Latency of one collective
    call, what a message too small to be bandwidth-bound costs (cost.py counts the calls):
    collective_s back to back with no compute between (reshard gathers, grad-norm and
    bookkeeping all-reduces); sync_collective_s inside a model pass (generation tensor
    parallel, FSDP's gathers, pipeline sends), which also waits for the slowest rank's
    compute since the last one; dtensor_collective_s a DTensor tensor-parallel collective in
    training, with its redistribution and autograd work. share_scale: correction of the
    device's measured shared_flops / shared_bw that calibration fits (what the ranks of one
    parallel group, computing in lockstep on a node, see of the sharing, capped at a full
    share; a rank of another pool beside them keeps the measured share: cost.shared).
    call_s: per worker-group call (dispatch, collect); micro_batch_s: per micro-batch a rank
    runs; decode_step_s: per decode step of a generation wave; controller_per_seq_s:
    rule-based scoring per sequence; per_step_s: the controller's own work per step
    (advantages, batch bookkeeping, metrics).
    """

    train: float = 0.45
    forward: float = 0.5
    prefill: float = 0.5
    decode_bw: float = 0.6
    comm: float = 0.7
    collective_s: float = 1e-5
    sync_collective_s: float = 2e-5
    dtensor_collective_s: float = 3e-5
    share_scale: float = 1.0
    call_s: float = 5e-3
    micro_batch_s: float = 2e-3
    decode_step_s: float = 2e-2
    controller_per_seq_s: float = 1e-4
    per_step_s: float = 0.0
    source: str = "defaults (module docstring of hybridflow/planner/devices.py)"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_GB = 1e9
DEVICES: dict[str, DeviceSpec] = {
    "a100-80gb": DeviceSpec("a100-80gb", 312e12, 2.039e12, 80 * _GB, 300 * _GB, 25 * _GB,
                            "NVIDIA A100 80GB SXM data sheet; inter-node: HybridFlow paper testbed as recalled"),
    "h100": DeviceSpec("h100", 989e12, 3.35e12, 80 * _GB, 450 * _GB, 50 * _GB,
                       "NVIDIA H100 SXM5 data sheet; inter-node ConnectX-7 400 Gb/s"),
}


def _rates(threads: int, seconds: float) -> tuple[float, float]:
    """Median per-thread fp32 matmul FLOP/s (512^3) and copy bytes/s (32 MiB, read + write)
    of `threads` Python threads working at once (torch releases the GIL in both)."""
    import threading

    import torch

    def run(kind: str, out: list[float], i: int) -> None:
        torch.set_num_threads(1)  # per thread: a new thread would otherwise use every core
        if kind == "matmul":
            a, b = torch.randn(512, 512), torch.randn(512, 512)
            work, nbytes = (lambda: torch.mm(a, b)), 2 * 512**3
        else:
            src = torch.empty(8 * 2**20)
            dst = torch.empty_like(src)
            work, nbytes = (lambda: dst.copy_(src)), 2 * src.numel() * 4
        work()  # warm-up: page faults, kernel choice
        iters, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            work()
            iters += 1
        out[i] = nbytes * iters / (time.perf_counter() - start)

    rates = []
    for kind in ("matmul", "copy"):
        out = [0.0] * threads
        workers = [threading.Thread(target=run, args=(kind, out, i)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        rates.append(sorted(out)[threads // 2])
    return rates[0], rates[1]


def measure_cpu(seconds: float = 0.3, rounds: int = 3) -> DeviceSpec:
    """This machine as a device: one core's fp32 matmul rate and copy bandwidth, RAM per
    core, and what a core keeps of both while every core works at once (`shared_flops`,
    `shared_bw`: the ranks of a colocated pool compute together). Solo and all-cores runs
    alternate `rounds` times; the medians are kept, so a passing burst of other work moves
    them less."""
    import statistics

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a rank runs one thread (controller/host.py)
    cores = os.cpu_count() or 1
    try:
        solo, together = [], []
        for _ in range(rounds):
            solo.append(_rates(1, seconds))
            together.append(_rates(cores, seconds) if cores > 1 else solo[-1])
    finally:
        torch.set_num_threads(threads)
    flops, bw = (statistics.median(r[k] for r in solo) for k in (0, 1))
    shared_flops, shared_bw = (min(1.0, statistics.median(r[k] for r in together) / alone)
                               for k, alone in ((0, flops), (1, bw)))
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / cores
    # gloo over loopback: a memory copy through the kernel, about a quarter of copy bandwidth.
    return DeviceSpec("cpu", flops, bw, memory, bw / 4, bw / 4,
                      f"measured on this machine (1 thread, fp32 512^3 matmul, 32 MiB copy; alone and on all "
                      f"{cores} cores at once), load {os.getloadavg()[0]:.1f}", shared_flops, shared_bw)


def calibration_path(device: str) -> Path:
    """Where `hybridflow plan --calibrate` stores fitted factors: $HYBRIDFLOW_CACHE or
    ~/.cache/hybridflow, then planner/<device>.json."""
    return cache_path("planner", f"{device}.json")


def load_device(name: str) -> tuple[DeviceSpec, Efficiency]:
    """The device `name` (cpu, a100-80gb, h100) and its efficiency: the calibrated factors
    (and, for cpu, the measured device) when calibration_path(name) exists, else defaults."""
    path = calibration_path(name)
    stored = json.loads(path.read_text()) if path.is_file() else None
    if stored and not _current(stored):
        warnings.warn(f"{path} was fitted by an older cost model (it lacks factors the model now has); "
                      "it is ignored: run `hybridflow plan --calibrate` again", stacklevel=2)
        stored = None
    if name == "cpu":
        device = DeviceSpec(**stored["device"]) if stored else measure_cpu()
    elif name in DEVICES:
        device = DEVICES[name]
    else:
        raise ValueError(f"unknown device {name!r}; known: cpu, {', '.join(DEVICES)}")
    if stored:
        return device, Efficiency(**stored["efficiency"])
    return device, Efficiency() if name != "cpu" else CPU_DEFAULT


def _current(stored: dict[str, Any]) -> bool:
    """Whether a calibration file has every field of today's DeviceSpec and Efficiency
    (factors fitted without a term absorbed what it costs: they cannot be mixed with it)."""
    return ({f.name for f in dataclasses.fields(DeviceSpec)} <= set(stored["device"])
            and {f.name for f in dataclasses.fields(Efficiency)} <= set(stored["efficiency"]))


def save_calibration(device: DeviceSpec, efficiency: Efficiency, extra: dict[str, Any]) -> Path:
    """Write the fitted factors (atomically: a failed write leaves the old file)."""
    path = calibration_path(device.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"device": dataclasses.asdict(device), "efficiency": efficiency.to_dict(), **extra},
                              indent=2))
    tmp.replace(path)
    return path


# CPU before calibration: the factors fitted on two quiet rounds of 2026-11-24 12:40 on the
# 2-vCPU development machine (docs/planner.md; decode_bw and micro_batch_s are not fitted there).
CPU_DEFAULT = Efficiency(train=0.40, forward=0.44, prefill=0.71, decode_bw=0.3, comm=0.5, share_scale=0.78,
                         collective_s=7e-4, sync_collective_s=1.45e-3, dtensor_collective_s=2.14e-3, call_s=4.8e-3,
                         micro_batch_s=2e-3, decode_step_s=6e-4, controller_per_seq_s=5e-5, per_step_s=0.0,
                         source="fitted on 7 profiles of a 2-vCPU machine (benchmarks/planner/profiles/planner_measured_"
                                "124{0,2}_quiet.json); run `hybridflow plan --calibrate` for this one")
