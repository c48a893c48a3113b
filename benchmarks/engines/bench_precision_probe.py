"""`dtype: auto`'s probe on this machine: fp32 vs bf16 matmul GFLOP/s at the layer sizes of
the models hybridflow runs, on 1 and 2 threads, as `engines/precision.probe_matmul` times
them (longer here: `--seconds` per dtype and shape, `--repeats` alternating passes).

    PYTHONPATH=. .venv/bin/python benchmarks/engines/bench_precision_probe.py [--seconds 0.5] [--repeats 3]

Prints a table (median of the repeats, and their spread) and writes
benchmarks/engines/results/precision_probe_<host>.json with the machine description and the load.
The run itself caches nothing: a run's own probe (0.1 s per dtype) is what picks its dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import time
from pathlib import Path

import torch

from hybridflow.engines.precision import ProbeShape, cpu_has_fast_bf16, probe_matmul
import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

SHAPES = {"built-in tiny": ProbeShape(64, 256), "SmolLM2-135M": ProbeShape(576, 1536),
          "default (1024/4096)": ProbeShape(1024, 4096), "~1B Llama (2048/8192)": ProbeShape(2048, 8192)}


def machine() -> dict:
    model = "unknown"
    try:
        model = next(x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                     if x.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "cores": os.cpu_count(), "fast_bf16_flag": cpu_has_fast_bf16(),
            "platform": platform.platform(), "torch": torch.__version__,
            "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for name, shape in SHAPES.items():
        for threads in (1, 2):
            runs = [probe_matmul(shape, threads, args.seconds) for _ in range(args.repeats)]
            fp32, bf16 = ([getattr(r, k) for r in runs] for k in ("fp32_gflops", "bf16_gflops"))
            rows.append({"shape": name, "hidden": shape.hidden, "intermediate": shape.intermediate,
                         "threads": threads, "fp32_gflops": statistics.median(fp32), "bf16_gflops": statistics.median(bf16),
                         "fp32_all": fp32, "bf16_all": bf16, "load": [r.load for r in runs]})
    print(f"{'shape':>22} {'thr':>3} {'fp32 GFLOP/s':>12} {'bf16 GFLOP/s':>12} {'faster':>6}  load")
    for r in rows:
        faster = "bf16" if r["bf16_gflops"] > r["fp32_gflops"] else "fp32"
        print(f"{r['shape']:>22} {r['threads']:>3} {r['fp32_gflops']:>12.1f} {r['bf16_gflops']:>12.1f} {faster:>6}  "
              f"{min(r['load']):.1f}-{max(r['load']):.1f}")
    out = Path(__file__).parent / "results" / f"precision_probe_{socket.gethostname()}.json"
    out.parent.mkdir(exist_ok=True)
    key = {f"{r['shape']} t{r['threads']} bf16/fp32 GFLOP/s": f"{r['bf16_gflops']:.1f}/{r['fp32_gflops']:.1f}"
           for r in rows}
    out.write_text(json.dumps(stamp({"machine": machine(), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "seconds": args.seconds, "repeats": args.repeats, "rows": rows,
                               "key_figures": key}), indent=1))
    print(f"written {out}")


if __name__ == "__main__":
    main()
