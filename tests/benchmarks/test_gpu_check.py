"""benchmarks/gpu/gpu_check.py runs here as `--device cpu --tiny`, so the GPU check cannot rot
between the sessions that have a GPU: every case must run and give sane numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "gpu_check.py"


def test_gpu_check_runs_on_cpu_tiny(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(out.read_text())
    cases = record["cases"]
    assert record["all_ok"] and all(case["ok"] for case in cases.values())
    # the same sections as on a GPU, less the offload case (GPU only)
    assert {name.split("/")[0] for name in cases} == {"train", "rollout", "logprob_parity", "packed"}
    assert {"train/tiny/plain", "train/tiny/checkpointing", "rollout/tiny/batch4", "rollout/tiny/batch8"} <= set(cases)
    for name in ("train/tiny/plain", "train/tiny/checkpointing"):
        assert cases[name]["step_s"] > 0 and 0 < cases[name]["mfu"] < 1
    for name in ("rollout/tiny/batch4", "rollout/tiny/batch8"):
        assert cases[name]["ours_tok_s"] > 0 and cases[name]["hf_tok_s"] > 0
    # bf16 on both sides of the same CPU kernels: the engines agree closely
    assert cases["logprob_parity/tiny"]["max_abs_diff"] < 0.05
    assert cases["packed/tiny"]["max_abs_diff"] < 0.05
    assert record["machine"]["torch"] and record["bf16_matmul_peak_tflop_s"] > 0
