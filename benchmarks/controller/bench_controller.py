"""Controller overhead and DataProto dispatch+collect throughput on a 4-rank worker group.

Run from the repository root:

    .venv/bin/python benchmarks/controller/bench_controller.py                 # 300 empty calls, 15 round trips
    .venv/bin/python benchmarks/controller/bench_controller.py --calls 100 --round-trips 5

Measures, on an embedded local Ray:

- ``empty call``: ``wg.noop()`` (ONE_TO_ALL, no arguments, returns None) on 4 workers:
  split, 4 actor calls, wait, collect. Timed side by side (alternating) with ``raw ray``,
  the same 4 actor calls made with plain ``ray.get([actor.execute.remote(...)])``, so the
  ratio is what the controller adds on top of Ray.
- ``round trip``: ``wg.echo(batch)`` (DP_COMPUTE_PROTO) with a DataProto of 1024 samples x
  1024 tokens: input_ids, attention_mask, position_ids, response_mask (int64) and
  old_log_probs, ref_log_probs, rollout_log_probs, advantages, returns (fp32), 52 MiB. The
  batch is cut into 4 parts, each worker gets its part and returns it, and the controller
  concatenates them: 104 MiB cross the object store. ``submit`` is the time until the
  non-blocking call returns its future; ``collect`` the rest.

Targets (issue section 6): empty call <= 5 ms median; 100 MB round trip <= 0.5 s.
Prints a table and writes JSON with the machine description to
benchmarks/controller/results/controller.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from hybridflow.controller import Dispatch, ResourcePool, Worker, WorkerGroup, init_ray, register
from hybridflow.protocol import DataProto
import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "controller.json"
INT64_KEYS = ("input_ids", "attention_mask", "position_ids", "response_mask")
FP32_KEYS = ("old_log_probs", "ref_log_probs", "rollout_log_probs", "advantages", "returns")
TARGET_EMPTY_MS = 5.0
TARGET_ROUND_TRIP_S = 0.5


class BenchWorker(Worker):
    @register(dispatch=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None

    @register(dispatch=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def echo(self, batch: DataProto) -> DataProto:
        return batch


def make_batch(rows: int, cols: int) -> DataProto:
    gen = torch.Generator().manual_seed(0)
    tensors = {key: torch.randint(0, 150_000, (rows, cols), generator=gen) for key in INT64_KEYS}
    tensors.update({key: -torch.rand(rows, cols, generator=gen) * 5 for key in FP32_KEYS})
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def nbytes(batch: DataProto) -> int:
    return sum(t.numel() * t.element_size() for t in batch.batch.values())


def summary_ms(samples_s: list[float]) -> dict[str, float]:
    ms = np.asarray(samples_s) * 1e3
    return {"median_ms": round(float(np.median(ms)), 3), "p90_ms": round(float(np.percentile(ms, 90)), 3),
            "mean_ms": round(float(ms.mean()), 3), "min_ms": round(float(ms.min()), 3), "n": int(ms.size)}


def time_empty_calls(group: WorkerGroup, calls: int) -> dict[str, dict[str, float]]:
    """Controller call and raw Ray call, alternating so machine load hits both alike."""
    actors = group.workers
    controller, raw = [], []
    for _ in range(calls):
        start = time.perf_counter()
        group.noop()
        controller.append(time.perf_counter() - start)
        start = time.perf_counter()
        ray.get([actor.execute.remote(group.role, "noop") for actor in actors])
        raw.append(time.perf_counter() - start)
    return {"controller": summary_ms(controller), "raw_ray": summary_ms(raw)}


def time_round_trips(group: WorkerGroup, batch: DataProto, repeats: int) -> dict[str, Any]:
    totals, submits, collects = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        future = group.echo(batch)
        submitted = time.perf_counter()
        out = future.get()
        done = time.perf_counter()
        totals.append(done - start)
        submits.append(submitted - start)
        collects.append(done - submitted)
    if not all(torch.equal(out.batch[k], batch.batch[k]) for k in batch.batch):
        raise AssertionError("round trip changed the data")
    median_s = statistics.median(totals)
    moved = 2 * nbytes(batch)
    return {"total": summary_ms(totals), "submit": summary_ms(submits), "collect": summary_ms(collects),
            "bytes_one_way": nbytes(batch), "bytes_round_trip": moved,
            "throughput_mib_s": round(moved / 2**20 / median_s, 1)}


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory_gib = None
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "memory_gib": memory_gib,
            "python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__,
            "numpy": np.__version__, "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def print_table(result: dict[str, Any]) -> None:
    empty, trip = result["empty_call"], result["round_trip"]
    ratio = empty["controller"]["median_ms"] / empty["raw_ray"]["median_ms"]
    rows = [
        ("empty call, controller (4 workers)", empty["controller"], f"<= {TARGET_EMPTY_MS} ms median"),
        ("empty call, raw ray (same actors)", empty["raw_ray"], f"controller/raw = {ratio:.2f}x"),
        (f"round trip {trip['bytes_round_trip'] / 2**20:.0f} MiB, total", trip["total"],
         f"<= {TARGET_ROUND_TRIP_S * 1e3:.0f} ms median; {trip['throughput_mib_s']} MiB/s"),
        ("  submit (split + send)", trip["submit"], ""),
        ("  collect (wait + fetch + concat)", trip["collect"], ""),
    ]
    print(f"{'measurement':40} {'median ms':>10} {'p90 ms':>10} {'n':>5}  note")
    for name, stats, note in rows:
        print(f"{name:40} {stats['median_ms']:>10.3f} {stats['p90_ms']:>10.3f} {stats['n']:>5}  {note}")
    print(f"machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, "
          f"load {result['machine']['load_avg_1_5_15']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="empty calls (each variant)")
    parser.add_argument("--round-trips", type=int, default=15, help="DataProto round trips")
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    init_ray(num_cpus=max(args.workers, 4))
    pool = ResourcePool([args.workers])
    group = WorkerGroup(pool, BenchWorker)
    try:
        for _ in range(20):  # warm up: worker imports, first-call paths, object store
            group.noop()
        batch = make_batch(args.rows, args.cols)
        group.echo(batch).get()
        result = {
            "workers": args.workers,
            "batch": {"rows": args.rows, "cols": args.cols, "int64_keys": list(INT64_KEYS),
                      "fp32_keys": list(FP32_KEYS)},
            "empty_call": time_empty_calls(group, args.calls),
            "round_trip": time_round_trips(group, batch, args.round_trips),
            "targets": {"empty_call_median_ms": TARGET_EMPTY_MS, "round_trip_median_s": TARGET_ROUND_TRIP_S},
            "machine": machine(),
        }
    finally:
        group.shutdown()
        pool.release()
        ray.shutdown()
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamp(result), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
