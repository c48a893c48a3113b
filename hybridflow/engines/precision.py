"""Compute dtype selection: "bf16" and "fp32" as named, "auto" chosen by measurement."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hybridflow.cache import cache_path

if TYPE_CHECKING:  # imported where used: the config check reads DTYPE_NAMES before torch is imported
    import torch

DtypeName = Literal["auto", "bf16", "fp32"]
DTYPE_NAMES: tuple[str, ...] = ("auto", "bf16", "fp32")
_FAST_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
PROBE_ROWS = 256  # tokens per matmul: a micro-batch's worth; fewer for wide layers (PROBE_FLOP)
PROBE_FLOP = 5.0e8  # at most this many flops per probe matmul, so a wide model's probe stays short
PROBE_SECONDS = 0.1  # timed per dtype (after one warm-up call), split over alternating rounds
# Below this 1-minute load average per core the machine counts as quiet: a probe taken at or
# above it (other processes competing for the cores skew the two rates) is taken again on a quiet start.
QUIET_LOAD_PER_CORE = 0.5


def cpu_has_fast_bf16() -> bool:
    """True when /proc/cpuinfo lists a native bf16 dot-product instruction (rollout/gemm.py's
    hint for bf16 weights; the dtype itself is chosen by measurement)."""
    return any(flag in _cpu_flags() for flag in _FAST_BF16_CPU_FLAGS)


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux
        return frozenset()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


@dataclass(frozen=True)
class ProbeShape:
    """The layer sizes the probe times: the model's hidden and MLP intermediate sizes."""

    hidden: int = 1024
    intermediate: int = 4096

    def matmuls(self) -> list[tuple[int, int, int]]:
        """(rows, inner, cols) of the probe's matmuls: x @ W for a square projection and the MLP's."""
        widest = self.hidden * max(self.hidden, self.intermediate)
        rows = max(16, min(PROBE_ROWS, int(PROBE_FLOP / (2 * widest))))
        return [(rows, self.hidden, self.hidden), (rows, self.hidden, self.intermediate)]

    @property
    def key(self) -> str:
        return f"h{self.hidden}-i{self.intermediate}"


@dataclass(frozen=True)
class MatmulRates:
    """What the probe measured: GFLOP/s of the shape's matmuls in fp32 and in bf16."""

    fp32_gflops: float
    bf16_gflops: float
    threads: int
    load: float  # 1-minute load average when measured (the machine is shared)
    measured_at: str

    @property
    def faster(self) -> str:
        """"bf16" when it was measured faster, else "fp32" (a tie keeps full precision)."""
        return "bf16" if self.bf16_gflops > self.fp32_gflops else "fp32"


def probe_matmul(shape: ProbeShape, threads: int, seconds: float = PROBE_SECONDS) -> MatmulRates:
    """Time `shape`'s matmuls in fp32 and bf16 on `threads` threads, alternating rounds so a
    burst of other load hits both; the median round of each dtype gives its rate."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        def operand(rows: int, cols: int, dtype) -> torch.Tensor:
            # uniform_ in place: cheap to fill (randn of a wide layer costs as much as the timing)
            return torch.empty(rows, cols, dtype=dtype).uniform_(-1, 1)

        operands = {dtype: [(operand(m, k, dtype), operand(k, n, dtype)) for m, k, n in shape.matmuls()]
                    for dtype in (torch.float32, torch.bfloat16)}
        flop = sum(2 * m * k * n for m, k, n in shape.matmuls())

        def one_round(dtype) -> float:
            start = time.perf_counter()
            for a, b in operands[dtype]:
                torch.mm(a, b)
            return time.perf_counter() - start

        rounds: dict = {dtype: [] for dtype in operands}
        for dtype in operands:
            one_round(dtype)  # warm-up: first-call costs are not the rate
        start = time.perf_counter()
        # `seconds` of rounds per dtype, at least 2 each; on a machine so loaded that rounds
        # crawl, stop after 8 * seconds of wall time (what was timed still gives a median)
        while (min(len(r) for r in rounds.values()) < 2 or min(sum(r) for r in rounds.values()) < seconds) and (
                time.perf_counter() - start < 8 * seconds or min(len(r) for r in rounds.values()) < 1):
            for dtype in operands:
                rounds[dtype].append(one_round(dtype))
    finally:
        torch.set_num_threads(before)
    fp32, bf16 = (flop / statistics.median(rounds[d]) / 1e9 for d in (torch.float32, torch.bfloat16))
    return MatmulRates(round(fp32, 1), round(bf16, 1), threads, round(os.getloadavg()[0], 2),
                       time.strftime("%Y-%m-%dT%H:%M:%S"))


Measure = Callable[[ProbeShape, int], MatmulRates]
_MEMO: dict[tuple[str, str], MatmulRates] = {}


def current_load() -> float:
    """This machine's 1-minute load average."""
    return os.getloadavg()[0]


def is_quiet(load: float) -> bool:
    """Whether a 1-minute load average leaves the cores free enough to time the probe."""
    return load < QUIET_LOAD_PER_CORE * (os.cpu_count() or 1)


def machine_id() -> str:
    """This machine's cache name: CPU model, flags and core count (a home folder shared by
    machines of other kinds keeps their figures apart)."""
    model = next((x.partition(":")[2].strip() for x in _cpuinfo_lines() if x.startswith("model name")),
                 platform.processor() or "unknown")
    digest = hashlib.sha1(f"{model}|{sorted(_cpu_flags())}|{os.cpu_count()}".encode()).hexdigest()[:12]
    return f"cpu-{digest}"


def _cpuinfo_lines() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def probe_cache_file() -> Path:
    return cache_path("precision", f"{machine_id()}.json")


def measured_rates(shape: ProbeShape, threads: int, measure: Measure = probe_matmul,
                   load_now: Callable[[], float] = current_load) -> MatmulRates:
    """The cached figures of (shape, threads) on this machine, measured (and stored) once,
    and again when they were measured under load and the machine is quiet now."""
    path = probe_cache_file()
    key = f"{shape.key}-t{threads}"
    memo = _MEMO.get((str(path), key))
    if memo is not None:
        return memo
    stored = _read(path)
    rates = MatmulRates(**stored[key]) if key in stored else None
    if rates is None or (not is_quiet(rates.load) and is_quiet(load_now())):
        rates = measure(shape, threads)
        _write(path, {**_read(path), key: asdict(rates)})  # re-read: another process may have added keys
    _MEMO[(str(path), key)] = rates
    return rates


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # absent, or cut short by a crash: measure again
        return {}


def _write(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        tmp.replace(path)  # atomic: a reader sees the old or the new file
    except OSError:
        pass  # a read-only home: the choice is still made, just measured again next time


@dataclass(frozen=True)
class AutoChoice:
    """What "auto" became and why (printed once at the start of a run)."""

    dtype: str  # "bf16" | "fp32"
    reason: str
    rates: MatmulRates | None = None


def auto_dtype(device_type: str, shape: ProbeShape | None = None, threads: int | None = None,
               measure: Measure = probe_matmul, load_now: Callable[[], float] = current_load) -> AutoChoice:
    """"auto" on `device_type`: bf16 on GPUs; on CPUs the faster of the two at `shape` (the
    model's layer sizes; ProbeShape() when unknown) on `threads` (this process's count when None)."""
    if device_type != "cpu":
        return AutoChoice("bf16", f"auto: bf16 on {device_type}")
    import torch

    shape = shape or ProbeShape()
    threads = threads or torch.get_num_threads()
    rates = measured_rates(shape, threads, measure, load_now)
    loaded = "" if is_quiet(rates.load) else (f" on {os.cpu_count()} cores: under load, measured again at the first "
                                              "start on a quiet machine")
    reason = (f"auto: {rates.faster}, measured on this CPU at hidden {shape.hidden} / intermediate "
              f"{shape.intermediate} on {threads} thread(s): fp32 {rates.fp32_gflops:.0f} GFLOP/s, bf16 "
              f"{rates.bf16_gflops:.0f} GFLOP/s (load {rates.load:.1f}{loaded}, {rates.measured_at}; "
              f"{probe_cache_file()})")
    return AutoChoice(rates.faster, reason, rates)


def resolve_dtype_name(name: str, device_type: str, shape: ProbeShape | None = None,
                       threads: int | None = None) -> str:
    """"bf16" or "fp32" for config value `name` ("auto" measured as `auto_dtype` says)."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {name!r}")
    return auto_dtype(device_type, shape, threads).dtype if name == "auto" else name


def resolve_dtype(name: str, device_type: str, shape: ProbeShape | None = None,
                  threads: int | None = None) -> torch.dtype:
    """The compute dtype for config value `name` on a `device_type` ("cpu" or "cuda")."""
    import torch

    resolved = resolve_dtype_name(name, device_type, shape, threads)
    return torch.bfloat16 if resolved == "bf16" else torch.float32
