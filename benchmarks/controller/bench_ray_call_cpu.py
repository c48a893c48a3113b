"""CPU seconds of one Ray actor call on this machine: the caller, the actor and Ray's daemons,
for an empty call and for ~40 kB of arguments (returned as they came) in several forms.

    .venv/bin/python benchmarks/controller/bench_ray_call_cpu.py               # 1000 calls per form, 3 rounds
    .venv/bin/python benchmarks/controller/bench_ray_call_cpu.py --calls 300 --out /tmp/calls.json

Why: an environment run on Ray pays each call of its iteration (collection, update, once a
separate get_weights) on both sides of the process boundary; the weights and batches of
its small networks are tens of kB, as numpy arrays. Forms: "empty"; "10 numpy x 4 kB" and
"1 numpy x 40 kB" (pickle protocol 5 moves numpy out of band); "10 bytes x 4 kB" (in band).
Per form the median over rounds of milliseconds of CPU per call (user + system, whole
processes, all threads) and of wall time. Writes benchmarks/controller/results/ray_call_cpu.json
with the machine description.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

from benchmarks.controller.bench_controller import machine  # noqa: E402
from benchmarks.envs.vs_sb3_runs import tree_cpu  # noqa: E402

FORMS: dict[str, Any] = {
    "empty": None,
    "10 numpy x 4 kB": [np.zeros(1000, dtype=np.float32) for _ in range(10)],
    "1 numpy x 40 kB": [np.zeros(10_000, dtype=np.float32)],
    "10 bytes x 4 kB": [np.zeros(1000, dtype=np.float32).tobytes() for _ in range(10)],
}


@ray.remote(num_cpus=0)
class Echo:
    def echo(self, value: Any) -> Any:
        return value

    def pid(self) -> int:
        return os.getpid()


def measure(actor: Any, actor_pid: int, value: Any, calls: int) -> dict[str, float]:
    """Milliseconds per call: CPU of the caller, the actor, the rest (Ray's daemons), and wall."""
    before = tree_cpu()
    start = time.perf_counter()
    for _ in range(calls):
        ray.get(actor.echo.remote(value))
    wall = time.perf_counter() - start
    after = tree_cpu()
    me = os.getpid()
    spent = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    row = {"caller": spent.get(me, 0.0), "actor": spent.get(actor_pid, 0.0),
           "ray": sum(v for pid, v in spent.items() if pid not in (me, actor_pid)), "wall": wall}
    row = {k: 1000 * v / calls for k, v in row.items()}
    row["cpu"] = row["caller"] + row["actor"] + row["ray"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "ray_call_cpu.json"))
    args = parser.parse_args()
    from hybridflow.controller import init_ray

    init_ray()
    actor = Echo.remote()
    actor_pid = ray.get(actor.pid.remote())
    rows: dict[str, list[dict[str, float]]] = {form: [] for form in FORMS}
    for round_ in range(args.rounds):  # forms interleaved, so load changes hit them alike
        for form, value in FORMS.items():
            rows[form].append(measure(actor, actor_pid, value, args.calls))
            print(round_, form, {k: round(v, 3) for k, v in rows[form][-1].items()}, flush=True)
    summary = {form: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]} for form, rs in rows.items()}
    print(f"{'form':18} {'CPU ms/call':>11} {'caller':>7} {'actor':>7} {'ray':>6} {'wall ms':>8}")
    for form, s in summary.items():
        print(f"{form:18} {s['cpu']:>11.3f} {s['caller']:>7.3f} {s['actor']:>7.3f} {s['ray']:>6.3f} {s['wall']:>8.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamp({"machine": machine(), "calls": args.calls, "rounds": args.rounds,
                               "summary_ms_per_call": summary, "rounds_ms_per_call": rows,
                               "key_figures": {f"{form} cpu ms/call": s["cpu"] for form, s in summary.items()}}),
                         indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
