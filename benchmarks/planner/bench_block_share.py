"""The planner's concurrent block on this machine, from stored calibration rounds (no runs):
what a rank keeps of its core beside the other pool's, what the block costs beyond its
slowest phase, and the leave-one-out step predictions of the cost model that is imported.

    PYTHONPATH=. python benchmarks/planner/bench_block_share.py FILE [FILE ...] --label after
    PYTHONPATH=/path/to/old/checkout python benchmarks/planner/bench_block_share.py FILE ... --label before

FILE: a calibration file (what `hybridflow plan --calibrate` stores in
~/.cache/hybridflow/planner/cpu.json, copied under benchmarks/planner/profiles/) with the profiles
"ppo split 1|1" (blocks off) and "ppo split 1|1 concurrent" (blocks on). Per file:

- kept: each update's time inside its worker (update_<role>_in_worker) alone (blocks off)
  divided by its time beside the other pool's update (blocks on): 1 means the neighbour
  took nothing of its core. Against it the device benchmark's share (shared_flops) and the
  share the imported model gives such a rank, fitted on all profiles of the file;
- block: the update block's wall time (the step less the phases outside the block),
  against its slowest phase (timing_s: the phase's call included) and its slowest
  in-worker part;
- leave-one-out: each profile's step predicted by factors fitted on the file's other
  profiles (hybridflow/planner/calibrate.py), with the model on PYTHONPATH: run it with the
  model before a change and after, on the same files, to compare on identical data.

Writes benchmarks/planner/results/planner_block_share_<label>.json with the machine description.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.controller.bench_controller import machine  # noqa: E402

from hybridflow.planner.calibrate import cases_of, fit, leave_one_out, predict  # noqa: E402
from hybridflow.planner.devices import DeviceSpec  # noqa: E402
from hybridflow.planner.simulate import role_profile  # noqa: E402

SERIAL, CONCURRENT = "ppo split 1|1", "ppo split 1|1 concurrent"
OUTSIDE = ("gen", "reward", "adv", "values")  # the step's phases outside the update block here


def kept(measured: dict) -> dict[str, float]:
    """Per update: its in-worker time alone over its time beside the other pool's update."""
    alone, beside = measured[SERIAL]["times"], measured[CONCURRENT]["times"]
    return {role: alone[f"update_{role}_in_worker"] / beside[f"update_{role}_in_worker"]
            for role in ("actor", "critic")}


def block(times: dict[str, float]) -> dict[str, float]:
    """The update block's wall time and what bounds it from below (module docstring)."""
    return {"wall_s": times["step"] - sum(times.get(k, 0.0) for k in OUTSIDE),
            "slowest_phase_s": max(times["update_actor"], times["update_critic"]),
            "slowest_in_worker_s": max(times["update_actor_in_worker"], times["update_critic_in_worker"])}


def with_eff(problem, eff):
    return dataclasses.replace(problem, cluster=dataclasses.replace(problem.cluster, efficiency=eff))


def one_file(path: Path) -> dict:
    stored = json.loads(path.read_text())
    measured, device = stored["measured"], DeviceSpec(**stored["device"])
    with tempfile.TemporaryDirectory() as tmp:
        cases = cases_of(measured, device, Path(tmp))
    eff = fit(list(cases.values()))
    problem, mapping, _ = cases[CONCURRENT]
    fitted = predict(problem, mapping, eff)
    # The share the model gives a 1-rank pool's update beside the other pool's: its compute
    # alone over its compute in the block (whatever rule the imported model has for it).
    alone, beside = (role_profile(with_eff(cases[name][0], eff), "actor", mapping.parallel["actor"])[0]
                     for name in (SERIAL, CONCURRENT))
    model_share = alone["update_actor"].compute_s / beside["update_actor"].compute_s
    loo = leave_one_out(cases, device)
    rows = [{"profile": n, **r, "error": r["predicted_s"] / r["measured_s"] - 1,
             "load_avg_1": measured[n].get("load_avg_1")} for n, r in loo.items()]
    return {"file": str(path), "kept": kept(measured), "device_shared_flops": device.shared_flops,
            "fitted_share_scale": eff.share_scale, "model_share_beside": model_share,
            "block_measured": block(measured[CONCURRENT]["times"]),
            "concurrent_fitted_on_all": {"step_s": fitted.step_s, "block_s": fitted.stage_s[-1],
                                          **{k: fitted.within_s[k] for k in ("update_actor_in_worker",
                                                                             "update_critic_in_worker")}},
            "leave_one_out": rows, "fitted_on_all": eff.to_dict()}


def report(r: dict) -> str:
    b, f = r["block_measured"], r["concurrent_fitted_on_all"]
    lines = [r["file"],
             f"  kept beside the other pool's update: actor {r['kept']['actor']:.2f}, critic {r['kept']['critic']:.2f}"
             f"; device share {r['device_shared_flops']:.2f}; model's share {r['model_share_beside']:.2f} "
             f"(share_scale {r['fitted_share_scale']:.2f})",
             f"  update block: wall {b['wall_s']:.4f} s, slowest phase {b['slowest_phase_s']:.4f}, slowest in-worker "
             f"{b['slowest_in_worker_s']:.4f}; model fitted on all: block {f['block_s']:.4f}, step {f['step_s']:.4f}",
             f"  {'profile':30} {'measured s':>10} {'predicted s':>11} {'error':>7} {'load':>5}  (leave-one-out)"]
    for row in r["leave_one_out"]:
        load = "-" if row["load_avg_1"] is None else f"{row['load_avg_1']:.1f}"
        lines.append(f"  {row['profile']:30} {row['measured_s']:10.3f} {row['predicted_s']:11.3f} "
                     f"{row['error']:+7.1%} {load:>5}")
    within = sum(abs(row["error"]) <= 0.25 for row in r["leave_one_out"])
    lines.append(f"  within 25 %: {within} of {len(r['leave_one_out'])}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--label", required=True, help="names the output: planner_block_share_<label>.json")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    out = {"machine": machine(), "label": args.label, "model": sys.modules["hybridflow"].__file__, "files": []}
    for path in args.files:
        result = one_file(path)
        print(report(result))
        out["files"].append(result)
    out["machine_after"] = machine()
    out["key_figures"] = {f"{Path(r['file']).stem} within 25 %":
                          f"{sum(abs(x['error']) <= 0.25 for x in r['leave_one_out'])}/{len(r['leave_one_out'])}"
                          for r in out["files"]}
    path = args.out_dir / f"planner_block_share_{args.label}.json"
    path.write_text(json.dumps(stamp(out), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
