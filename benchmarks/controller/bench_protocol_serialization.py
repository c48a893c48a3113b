"""Time a DataProto round trip through Ray's object store: torch pickling vs. numpy form.

Run from the repository root:

    .venv/bin/python benchmarks/controller/bench_protocol_serialization.py            # 1024 x 1024, 20 repeats
    .venv/bin/python benchmarks/controller/bench_protocol_serialization.py --repeats 5 --rows 256

The batch holds input_ids (int64), attention_mask (int64) and old_log_probs (fp32), each
rows x cols (24 MiB at 1024 x 1024). Variants, timed side by side (round-robin, so load
from other processes hits them alike):

- ``torch-pickle``: the same three tensors in a plain dict; Ray pickles torch tensors by
  value (torch's storage serializer, copied into the pickle stream).
- ``dataproto``: our DataProto; tensors travel as numpy arrays out-of-band and are copied
  once on receipt because Ray hands back read-only shared memory (see
  hybridflow/protocol/serialization.py).
- ``numpy-floor``: the bare numpy arrays, returned read-only and zero-copy: the lower
  bound, i.e. what the copy on receipt costs on top of Ray itself.

Prints a table (median milliseconds) and writes JSON with the machine description to
benchmarks/controller/results/protocol_serialization.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from hybridflow.protocol import DataProto
import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "protocol_serialization.json"


def make_tensors(rows: int, cols: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "input_ids": torch.randint(0, 150_000, (rows, cols), generator=gen),
        "attention_mask": torch.ones(rows, cols, dtype=torch.int64),
        "old_log_probs": -torch.rand(rows, cols, generator=gen) * 5,
    }


def payloads(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The object each variant hands to ray.put."""
    return {
        "torch-pickle": {"batch": dict(tensors), "meta_info": {"temperature": 1.0}},
        "dataproto": DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0}),
        "numpy-floor": {key: value.numpy() for key, value in tensors.items()},
    }


def tensors_of(variant: str, received: Any) -> dict[str, torch.Tensor]:
    """Received object -> tensors, to check each variant returns the exact data."""
    if variant == "torch-pickle":
        return received["batch"]
    if variant == "dataproto":
        return received.batch
    return {key: torch.from_numpy(value.copy()) for key, value in received.items()}


def time_round_trip(obj: Any) -> tuple[float, float, Any]:
    """Seconds for ray.put and for ray.get of ``obj``, and the received object."""
    start = time.perf_counter()
    ref = ray.put(obj)
    put_done = time.perf_counter()
    received = ray.get(ref)
    get_done = time.perf_counter()
    del ref  # free the object store copy before the next repeat
    return put_done - start, get_done - put_done, received


def check_exact(variant: str, received: Any, reference: dict[str, torch.Tensor]) -> None:
    got = tensors_of(variant, received)
    for key, tensor in reference.items():
        if got[key].dtype != tensor.dtype or not torch.equal(got[key], tensor):
            raise AssertionError(f"{variant}: {key} did not survive the round trip")


def run(rows: int, cols: int, repeats: int) -> dict[str, dict[str, Any]]:
    tensors = make_tensors(rows, cols)
    objects = payloads(tensors)
    samples: dict[str, dict[str, list[float]]] = {name: {"put": [], "get": []} for name in objects}
    for name, obj in objects.items():  # warm-up, and the correctness check, untimed
        check_exact(name, time_round_trip(obj)[2], tensors)
    for _ in range(repeats):
        for name, obj in objects.items():
            put_s, get_s, received = time_round_trip(obj)
            del received
            samples[name]["put"].append(put_s)
            samples[name]["get"].append(get_s)
    return {name: summarize(parts) for name, parts in samples.items()}


def summarize(parts: dict[str, list[float]]) -> dict[str, Any]:
    total = [p + g for p, g in zip(parts["put"], parts["get"])]
    return {
        "put_ms_median": 1e3 * statistics.median(parts["put"]),
        "get_ms_median": 1e3 * statistics.median(parts["get"]),
        "round_trip_ms_median": 1e3 * statistics.median(total),
        "round_trip_ms_min": 1e3 * min(total),
        "round_trip_ms_all": [round(1e3 * t, 3) for t in total],
    }


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), None) if Path("/proc/cpuinfo").is_file() else None,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "ray": ray.__version__,
        "numpy": np.__version__,
    }


def print_table(results: dict[str, dict[str, Any]], megabytes: float) -> None:
    base = results["torch-pickle"]["round_trip_ms_median"]
    print(f"\nDataProto round trip, ray.put + ray.get, {megabytes:.0f} MiB, median ms")
    print(f"{'variant':<14}{'put':>10}{'get':>10}{'round trip':>12}{'min':>10}{'speedup':>10}")
    for name, r in results.items():
        print(f"{name:<14}{r['put_ms_median']:>10.2f}{r['get_ms_median']:>10.2f}"
              f"{r['round_trip_ms_median']:>12.2f}{r['round_trip_ms_min']:>10.2f}"
              f"{base / r['round_trip_ms_median']:>9.1f}x")


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(stamp(payload), indent=2) + "\n")
    os.replace(tmp, path)  # readers never see half a file


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        results = run(args.rows, args.cols, args.repeats)
    finally:
        ray.shutdown()
    megabytes = args.rows * args.cols * (8 + 8 + 4) / 2**20
    print_table(results, megabytes)
    write_json(args.out, {
        "benchmark": "protocol_serialization",
        "machine": machine(),
        "params": {"rows": args.rows, "cols": args.cols, "repeats": args.repeats, "payload_mib": megabytes},
        "results": results,
        "speedup_vs_torch_pickle": {name: results["torch-pickle"]["round_trip_ms_median"] / r["round_trip_ms_median"]
                                    for name, r in results.items()},
        "key_figures": {f"{name} speedup vs torch pickle": round(results["torch-pickle"]["round_trip_ms_median"]
                                                                 / r["round_trip_ms_median"], 2)
                        for name, r in results.items()},
    })
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
