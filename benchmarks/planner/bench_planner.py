"""The planner's proof (docs/planner.md): paper-scale choices, search time, and predicted
against measured step times on this machine.

    PYTHONPATH=. python benchmarks/planner/bench_planner.py                 # paper scale + search time
    PYTHONPATH=. python benchmarks/planner/bench_planner.py --concurrent-blocks   # only the table below
    PYTHONPATH=. python benchmarks/planner/bench_planner.py --concurrent-check 2  # runs: split 1|1, blocks off / on
    PYTHONPATH=. python benchmarks/planner/bench_planner.py --measured FILE [FILE ...]
        # + predicted vs measured (leave-one-out) and the ranking check. FILE: measurements of
        # calibrate.PROFILES with the device they ran on, e.g. ~/.cache/hybridflow/planner/cpu.json
        # after `hybridflow plan --calibrate`; several files (rounds of the same profiles): the
        # geometric mean of each time over the rounds, the mean of the devices' measurements

Paper scale (simulated, every input below): PPO with actor, critic, reference and reward
model of one Llama size (7B, 13B, 34B, 70B) on 16..128 A100-80GB (8 per node), 1024
prompts of 1024 tokens, 1024-token responses, one sample each, mini-batch 256 (4 updates
per step), update micro-batch 2 and scoring micro-batch 8 per device, bf16 with fp32
Adam state, gradient checkpointing on, at most 64 sequences decoded at once per generation
replica (the KV cache of 256 would not fit 13B at t_g 8). For each setup: the planner's best mapping in the
paper's runtime (every placement, pipeline parallel, pools overlapping), and the best
colocated / split (actor+reference | critic+reward model) / standalone mappings for the
comparison with the paper's findings. Writes JSON with the machine description.

--concurrent-blocks: the same PPO workload without the reward model (actor, reference,
critic) in the runtime of this trainer (Capabilities.for_run), the best colocated and the
best split (actor+reference | critic) mapping with trainer.concurrent_phases false and true
(the programs' concurrently blocks overlapping the split pools; docs/planner.md);
writes benchmarks/planner/results/planner_concurrent_blocks.json.

--concurrent-check ROUNDS: real runs here (Ray, 2 ranks): the calibration profiles "ppo
split 1|1" and "ppo split 1|1 concurrent", interleaved ROUNDS times, each against the
prediction of the shipped CPU factors (CPU_DEFAULT, not a fit) on the device measured
before and after; writes benchmarks/planner/results/planner_concurrent_check.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402
from benchmarks.controller.bench_controller import machine  # noqa: E402

from hybridflow.config.schema import load_run_config  # noqa: E402
from hybridflow.engines.models import save_tiny_reward_model  # noqa: E402
from hybridflow.planner import LLAMA, Capabilities, Cluster, problem_from_config, search  # noqa: E402
from hybridflow.planner.problem import Problem  # noqa: E402

PAPER_OVERRIDES = [
    "algorithm.name=ppo", "actor.loss.use_kl_loss=true", "data.train_batch_size=1024", "rollout.n=1",
    "data.prompt.max_prompt_length=1024", "rollout.response_length=1024", "model.builtin.max_position_embeddings=4096",
    "actor.micro_batch.mini_batch_size=256", "critic.micro_batch.mini_batch_size=256",
    "actor.micro_batch.micro_batch_size_per_device=2", "critic.micro_batch.micro_batch_size_per_device=2",
    "actor.micro_batch.forward_micro_batch_size_per_device=8", "critic.micro_batch.forward_micro_batch_size_per_device=8",
    "reward_model.micro_batch.forward_micro_batch_size_per_device=8",
    "actor.gradient_checkpointing=true", "critic.gradient_checkpointing=true", "rollout.max_num_seqs=64",
]
NAMED = {"colocated": [["actor", "reference", "critic", "reward_model"]],
         "split": [["actor", "reference"], ["critic", "reward_model"]],
         "standalone": [["actor"], ["reference"], ["critic"], ["reward_model"]]}


def paper_problem(model: str, devices: int, rm_dir: Path) -> Problem:
    cfg = load_run_config(None, [*PAPER_OVERRIDES, f"reward_model.path={rm_dir}"])
    return problem_from_config(cfg, Cluster.of(devices // 8, 8, "a100-80gb"), Capabilities(), LLAMA[model])


def best_of(problem: Problem, blocks: list[list[str]]) -> dict | None:
    """The best mapping with exactly this placement."""
    result = search(problem, top=1, only=[tuple(b) for b in blocks])
    return result.mappings[0].to_dict() if result.mappings else None


def paper_scale(rm_dir: Path) -> list[dict]:
    rows = []
    for model in ("llama-7b", "llama-13b", "llama-34b", "llama-70b"):
        for devices in (16, 32, 64, 96, 128):
            problem = paper_problem(model, devices, rm_dir)
            result = search(problem, top=1)
            row = {"model": model, "devices": devices, "search_s": result.seconds, "evaluated": result.evaluated,
                   "best": result.mappings[0].to_dict() if result.mappings else None,
                   "rejected": sum(result.rejected.values())}
            for name, blocks in NAMED.items():
                row[name] = best_of(problem, blocks)
            rows.append(row)
            b = row["best"]
            named = "  ".join(f"{n} {row[n]['tokens_per_s']:8.0f}" if row[n] else f"{n} {'-':>8}" for n in NAMED)
            print(f"{model:10} {devices:4d}  best: {b['placement'] if b else 'none':40} "
                  f"{b['tokens_per_s'] if b else 0:8.0f} tok/s  | {named}  ({result.seconds:.2f} s)", flush=True)
    return rows


def concurrent_blocks() -> list[dict]:
    """Best colocated / split step of the paper's PPO (no reward model) as this trainer runs
    it, with and without the concurrent blocks (module docstring)."""
    placements = {"colocated": [["actor", "reference", "critic"]], "split": [["actor", "reference"], ["critic"]]}
    rows = []
    for model in ("llama-7b", "llama-13b", "llama-34b"):
        for devices in (16, 32, 64, 128):
            row: dict = {"model": model, "devices": devices}
            for setting in ("false", "true"):
                cfg = load_run_config(None, [*PAPER_OVERRIDES, f"trainer.concurrent_phases={setting}"])
                problem = problem_from_config(cfg, Cluster.of(devices // 8, 8, "a100-80gb"), Capabilities.for_run(cfg),
                                              LLAMA[model])
                for name, blocks in placements.items():
                    row[f"{name} concurrent_phases={setting}"] = best_of(problem, blocks)
            rows.append(row)
            steps = "  ".join(f"{k} {v['step_s']:8.1f} s" if v else f"{k} {'-':>8}" for k, v in row.items()
                              if isinstance(v, dict) or v is None)
            print(f"{model:10} {devices:4d}  {steps}", flush=True)
    return rows


def concurrent_check(rounds: int) -> dict:
    """Measured against predicted step and phase times of split 1 | 1 with the blocks off and
    on (module docstring)."""
    from hybridflow.planner.calibrate import PROFILES, cases_of, predict, profile_config
    from hybridflow.planner.devices import CPU_DEFAULT, measure_cpu
    from hybridflow.trainer.jobs.profiles import mean_device, measure
    from hybridflow.controller import RayHold

    names = ["ppo split 1|1", "ppo split 1|1 concurrent"]
    work = Path(tempfile.mkdtemp(prefix="bench-planner-concurrent-"))
    RayHold(None, 2)  # one Ray for every run (stopped when the process ends)
    devices, runs = [measure_cpu()], []
    for round_ in range(rounds):
        for name in names:
            runs.append({"round": round_, "profile": name, **measure(profile_config(PROFILES[name], work))})
        devices.append(measure_cpu())
    device = mean_device(*devices)
    phases = ("gen", "values", "update_critic", "update_actor", "step")
    for run in runs:
        problem, mapping, _ = cases_of({run["profile"]: run}, device, work)[run["profile"]]
        m = predict(problem, mapping, CPU_DEFAULT)
        run["predicted"] = {**m.phase_s, "step": m.step_s}
        pairs = [(k, run["predicted"].get(k, math.nan), run["times"].get(k, math.nan)) for k in phases]
        cells = "  ".join(f"{k} {p:.3f}/{t:.3f}" for k, p, t in pairs)
        print(f"round {run['round']} {run['profile']:26} predicted/measured s: {cells}  (load {run['load_avg_1']:.1f})")
    for name in names:
        ratio = math.exp(statistics.fmean(math.log(r["predicted"]["step"] / r["times"]["step"])
                                          for r in runs if r["profile"] == name))
        print(f"{name:26} step predicted / measured, geometric mean over the rounds: {ratio:.3f}")
    return {"device": device.__dict__, "factors": CPU_DEFAULT.to_dict(), "runs": runs}


def geometric_mean_rounds(rounds: list[dict]) -> dict:
    """One measurement per profile from several rounds: the geometric mean of each time
    (a ratio error stays a ratio error), the mean lengths, the highest load."""
    out = {}
    common = [n for n in rounds[0] if all(n in r for r in rounds)]
    if len(common) < max(len(r) for r in rounds):
        print(f"profiles in every round: {len(common)} (the others are left out)")
    for name in common:
        ms = [r[name] for r in rounds]
        keys = set.intersection(*(set(m["times"]) for m in ms))
        times = {k: math.exp(statistics.fmean(math.log(max(m["times"][k], 1e-9)) for m in ms)) for k in keys}
        out[name] = {"times": times, "load_avg_1": max(m["load_avg_1"] for m in ms),
                     "steps": sum(m["steps"] for m in ms), "rounds": [m.get("run_dir") for m in ms]}
        if all("lengths" in m for m in ms):
            out[name]["lengths"] = {k: statistics.fmean(m["lengths"][k] for m in ms) for k in ms[0]["lengths"]}
    return out


def predicted_vs_measured(paths: list[Path]) -> dict:
    from hybridflow.planner.calibrate import cases_of, fit, leave_one_out, loo_report
    from hybridflow.planner.devices import DeviceSpec, measure_cpu
    from hybridflow.trainer.jobs.profiles import mean_device

    files = [json.loads(p.read_text()) for p in paths]
    measured = geometric_mean_rounds([f.get("measured", f) for f in files])  # a calibration file: under "measured"
    devices = [DeviceSpec(**f["device"]) for f in files if "device" in f]
    device = mean_device(*devices) if devices else measure_cpu()
    print(f"device: {device.peak_flops / 1e9:.0f} GFLOP/s, {device.mem_bw / 1e9:.0f} GB/s, shared_flops "
          f"{device.shared_flops:.2f}, shared_bw {device.shared_bw:.2f} ({len(devices)} stored measurements)")
    cases = cases_of(measured, device, Path(tempfile.mkdtemp()))
    loo = leave_one_out(cases, device)
    report, within, same = loo_report(loo, {n: m["load_avg_1"] for n, m in measured.items()})
    print(report)
    rows = [{"profile": n, **r, "error": r["predicted_s"] / r["measured_s"] - 1,
             "load_avg_1": measured[n]["load_avg_1"]} for n, r in loo.items()]
    eff = fit(list(cases.values()))
    phases = phase_table(cases, eff)
    return {"files": [str(p) for p in paths], "device": dataclasses.asdict(device), "rows": rows,
            "fitted_on_all": eff.to_dict(), "phases_fitted_on_all": phases, "within_25pct": within,
            "same_ranking": same}


def phase_table(cases: dict, eff) -> dict[str, dict[str, list[float]]]:
    """Predicted / measured seconds per phase (and the parts the workers time) of every
    profile under the factors fitted on all of them; printed as one line per profile."""
    from hybridflow.planner.calibrate import predict

    print("phase by phase, factors fitted on all profiles (predicted / measured s):")
    out = {}
    for name, (problem, mapping, times) in cases.items():
        m = predict(problem, mapping, eff)
        predicted = {**m.phase_s, **m.within_s, "step": m.step_s}
        out[name] = {k: [p, times[k]] for k, p in predicted.items() if k in times}
        print(f"  {name:30} " + "  ".join(f"{k} {p:.3f}/{t:.3f}" for k, (p, t) in out[name].items()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, nargs="+", default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/planner/results/planner.json"))
    parser.add_argument("--concurrent-blocks", action="store_true")
    parser.add_argument("--concurrent-check", type=int, default=0, metavar="ROUNDS")
    args = parser.parse_args()
    out = {"machine": machine()}
    if args.concurrent_check:
        out["concurrent_check"] = concurrent_check(args.concurrent_check)
        out["machine_after"] = machine()
        path = args.out.with_name("planner_concurrent_check.json")
        path.write_text(json.dumps(stamp(out), indent=1))
        print(f"wrote {path}")
        return
    if args.concurrent_blocks:
        out["concurrent_blocks"] = concurrent_blocks()
        path = args.out.with_name("planner_concurrent_blocks.json")
        path.write_text(json.dumps(stamp(out), indent=1))
        print(f"wrote {path}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        rm_dir = save_tiny_reward_model(Path(tmp) / "rm")
        start = time.perf_counter()
        problem = paper_problem("llama-70b", 128, rm_dir)
        result = search(problem, top=5)
        out["search_4_roles_128_devices"] = {"seconds": result.seconds, "placements": result.placements,
                                             "evaluated": result.evaluated, "roles": list(problem.roles),
                                             "with_setup_s": time.perf_counter() - start}
        print(f"search, 4 roles on 128 A100 (llama-70b): {result.seconds:.2f} s, {result.placements} placements, "
              f"{result.evaluated} mappings combined (load {machine()['load_avg_1_5_15']})")
        out["paper_scale"] = paper_scale(rm_dir)
    if args.measured:
        out["predicted_vs_measured"] = predicted_vs_measured(args.measured)
    out["machine_after"] = machine()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamp(out), indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
