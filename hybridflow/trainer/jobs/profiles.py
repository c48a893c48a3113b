"""The real runs behind `hybridflow plan --calibrate`: each profile of
hybridflow/planner/calibrate.py (a mapping of the built-in demo on 2 ranks) runs a few steps
here; the phase times it logs are fitted into this machine's efficiency factors.

    from hybridflow.trainer.jobs.profiles import calibrate
    path, report = calibrate()     # minutes; stores ~/.cache/hybridflow/planner/cpu.json
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from hybridflow.config.schema import RunConfig
from hybridflow.planner.calibrate import PROFILES, fit_and_store, profile_config
from hybridflow.planner.devices import DeviceSpec, measure_cpu


def measure(cfg: RunConfig) -> dict[str, Any]:
    """Run `cfg` (Ray must be up, or the trainer starts it); median phase and step times
    over the steps after the first, and the batch's padded lengths (the longest prompt and
    response of a step: what the engines compute on), which the cost model is given in
    place of the config's caps (calibrate.cases_of)."""
    from hybridflow.trainer.entry import RLTrainer
    from hybridflow.trainer.run.run_dir import read_metrics

    with RLTrainer(cfg) as trainer:
        result = trainer.train()
    records = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "rl"][1:]
    keys = {k for r in records for k in r if k.startswith("timing_s/")}
    times = {k.split("/", 1)[1]: statistics.median(r[k] for r in records if k in r) for k in keys}
    lengths = {name: statistics.median(r[f"{name}_length/max"] for r in records) for name in ("prompt", "response")}
    return {"times": times, "lengths": lengths, "steps": len(records), "run_dir": str(result.run_dir),
            "load_avg_1": os.getloadavg()[0]}


def calibrate(output_dir: Path | None = None) -> tuple[Path, str]:
    """Run PROFILES here, fit, store (planner.calibrate.fit_and_store); the stored path and a report.

    The device is measured before every profile and after the last, and the measurements
    averaged: how much of a core a rank keeps while the other computes
    (DeviceSpec.shared_flops) was seen to change from one minute to the next on this
    shared virtual machine (0.5 to 1)."""
    from hybridflow.controller import RayHold

    output_dir = Path(output_dir or tempfile.mkdtemp(prefix="hybridflow-calibrate-"))
    devices = []
    ray_hold = RayHold(None, 2)  # one Ray for every profile's run
    measured = {}
    try:
        for name, overrides in PROFILES.items():
            devices.append(measure_cpu())
            measured[name] = measure(profile_config(overrides, output_dir))
    finally:
        ray_hold.close()
    devices.append(measure_cpu())
    return fit_and_store(measured, mean_device(*devices), output_dir)


def mean_device(*devices: DeviceSpec) -> DeviceSpec:
    """The mean of measurements of one device (rates and shares), their shares in the source."""
    if len(devices) == 1:
        return devices[0]
    fields = ("peak_flops", "mem_bw", "intra_bw", "inter_bw", "shared_flops", "shared_bw")
    mean = {f: statistics.fmean(getattr(d, f) for d in devices) for f in fields}
    shares = ", ".join(f"{d.shared_flops:.2f}" for d in devices)
    return dataclasses.replace(devices[0], **mean, source=f"mean of {len(devices)} measurements ({devices[0].source}); "
                               f"shared_flops of each: {shares}")
