"""Devices the planner costs phases on, and the efficiency factors that turn a roofline
into a predicted time.

`DeviceSpec` is what a data sheet says (peak FLOP/s in the compute dtype, memory
bandwidth and size, link bandwidths); `Efficiency` is what runs achieve of it, per phase
kind, plus fixed overheads a roofline cannot see (a worker-group call, a micro-batch, a
decode step). Shipped defaults:

- a100-80gb: NVIDIA A100 SXM4 80GB data sheet: 312 TFLOP/s dense bf16, 2.039 TB/s HBM2e,
  80 GB, NVLink 3 600 GB/s bidirectional (300 GB/s per direction); inter-node 200 Gb/s per
  node pair as we recall the HybridFlow paper's testbed (unsure; 25 GB/s here).
- h100: NVIDIA H100 SXM5 data sheet: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 80 GB,
  NVLink 4 900 GB/s bidirectional (450 per direction); inter-node 400 Gb/s (ConnectX-7, 50 GB/s).
- cpu: this machine, measured (`measure_cpu`): one core per rank (the workers run one
  thread each), fp32 matmul rate and copy bandwidth; memory = RAM / cores.

GPU efficiencies are not fitted here (no GPU): training 0.45 and scoring 0.5 of peak
(Megatron-LM and verl report 40-55 % MFU for dense 7-70B training), decode at 0.6 of HBM
bandwidth, NCCL at 0.7 of link bandwidth; overheads 5 ms per call, 2 ms per micro-batch,
20 ms per decode step (a Python-driven decode loop). `hybridflow plan --calibrate` fits the
CPU factors from short runs on this machine and stores them (calibration_path()).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of the roofline per phase kind, and fixed overheads in seconds.

    train / forward / prefill: fraction of peak FLOP/s; decode_bw: fraction of memory
    bandwidth while decoding; comm: fraction of link bandwidth; call_s: per worker-group
    call (dispatch, collect); micro_batch_s: per micro-batch a rank runs; decode_step_s: per
    decode step of a generation wave; controller_per_seq_s: rule-based scoring per sequence.
    """

    train: float = 0.45
    forward: float = 0.5
    prefill: float = 0.5
    decode_bw: float = 0.6
    comm: float = 0.7
    call_s: float = 5e-3
    micro_batch_s: float = 2e-3
    decode_step_s: float = 2e-2
    controller_per_seq_s: float = 1e-4
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


def measure_cpu(seconds: float = 0.3) -> DeviceSpec:
    """This machine as a device: one core's fp32 matmul rate and copy bandwidth, RAM per core."""
    import torch

    from hybridflow.engines.train.flops import measure_matmul_flops

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a rank runs one thread (controller/host.py)
    try:
        flops = measure_matmul_flops(torch.float32, size=512, seconds=seconds)
        src = torch.empty(8 * 2**20, dtype=torch.float32)
        dst = torch.empty_like(src)
        dst.copy_(src)
        iters, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            dst.copy_(src)
            iters += 1
        bw = 2 * src.numel() * 4 * iters / (time.perf_counter() - start)  # read + write
    finally:
        torch.set_num_threads(threads)
    cores = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / cores
    # gloo over loopback: a memory copy through the kernel, about a quarter of copy bandwidth.
    return DeviceSpec("cpu", flops, bw, memory, bw / 4, bw / 4,
                      f"measured on this machine (1 thread, fp32 512^3 matmul, 32 MiB copy), load {os.getloadavg()[0]:.1f}")


def calibration_path(device: str) -> Path:
    """Where `hybridflow plan --calibrate` stores fitted factors: $HYBRIDFLOW_CACHE or
    ~/.cache/hybridflow, then planner/<device>.json."""
    root = Path(os.environ.get("HYBRIDFLOW_CACHE", Path.home() / ".cache" / "hybridflow"))
    return root / "planner" / f"{device}.json"


def load_device(name: str) -> tuple[DeviceSpec, Efficiency]:
    """The device `name` (cpu, a100-80gb, h100) and its efficiency: the calibrated factors
    (and, for cpu, the measured device) when calibration_path(name) exists, else defaults."""
    path = calibration_path(name)
    stored = json.loads(path.read_text()) if path.is_file() else None
    if name == "cpu":
        device = DeviceSpec(**stored["device"]) if stored else measure_cpu()
    elif name in DEVICES:
        device = DEVICES[name]
    else:
        raise ValueError(f"unknown device {name!r}; known: cpu, {', '.join(DEVICES)}")
    if stored:
        return device, Efficiency(**stored["efficiency"])
    return device, Efficiency() if name != "cpu" else CPU_DEFAULT


def save_calibration(device: DeviceSpec, efficiency: Efficiency, extra: dict[str, Any]) -> Path:
    """Write the fitted factors (atomically: a failed write leaves the old file)."""
    path = calibration_path(device.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"device": dataclasses.asdict(device), "efficiency": efficiency.to_dict(), **extra},
                              indent=2))
    tmp.replace(path)
    return path


# CPU before calibration: tiny models are dominated by per-call Python and Ray costs.
CPU_DEFAULT = Efficiency(train=0.3, forward=0.3, prefill=0.3, decode_bw=0.3, comm=0.5, call_s=0.05,
                         micro_batch_s=0.01, decode_step_s=0.01, controller_per_seq_s=1e-3,
                         source="uncalibrated CPU guesses; run `hybridflow plan --calibrate`")
