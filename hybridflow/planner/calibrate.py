"""Fit this machine's efficiency factors from short real runs (`hybridflow plan --calibrate`)."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from hybridflow.config.schema import RunConfig, load_run_config
from hybridflow.planner.cost import Parallel
from hybridflow.planner.devices import CPU_DEFAULT, DeviceSpec, Efficiency, save_calibration
from hybridflow.planner.problem import Capabilities, Cluster, Problem, problem_from_config
from hybridflow.planner.simulate import Mapping, Pool, simulate

# The run every profile shares: the built-in demo task, 12 steps (the first is warm-up; the
# median of 11 is robust to a few slow steps), nothing but training.
# Calls one after another (trainer.concurrent_phases=false) unless a profile says otherwise:
# the simulator's rule for this trainer then has no pools overlap (Capabilities.for_run).
BASE = ["trainer.console=none", "trainer.total_steps=12", "trainer.test_freq=0", "trainer.save_final_model=false",
        "trainer.val_before_train=false", "sft.steps=0", "trainer.loggers=[jsonl]", "reward.manager.num_workers=1",
        "trainer.concurrent_phases=false"]
# Mappings of PPO / GRPO on 2 ranks: colocated vs split, dp vs tp, t_g 1 vs 2; and GRPO on 1 rank.
PROFILES: dict[str, list[str]] = {
    "ppo colocated dp2 t_g1": ["algorithm.name=ppo"],
    "ppo colocated dp2 t_g2": ["algorithm.name=ppo", "rollout.tensor_model_parallel_size=2"],
    "ppo colocated actor tp2 t_g2": ["algorithm.name=ppo", "actor.tp_size=2", "rollout.tensor_model_parallel_size=2"],
    "ppo split 1|1": ["algorithm.name=ppo", "resources.placement=split", "resources.critic_ranks=1"],
    # The same mapping with the programs' concurrently blocks on: the actor's and the critic's
    # update (and log-probs / values) at once, the one profile of the blocks model
    # (Capabilities.blocks; simulate.py).
    "ppo split 1|1 concurrent": ["algorithm.name=ppo", "resources.placement=split", "resources.critic_ranks=1",
                                 "trainer.concurrent_phases=true"],
    "grpo colocated dp2 t_g1": ["algorithm.name=grpo"],
    "grpo colocated tp2 t_g2": ["algorithm.name=grpo", "actor.tp_size=2", "rollout.tensor_model_parallel_size=2"],
    # One rank of one thread: every phase alone on a core, no collectives. Besides the
    # split profile the only one that shows single-rank compute, so that leaving either
    # out still leaves the fit a measurement of it (GRPO, not PPO: PPO on one rank costs
    # what split 1|1 costs, a tie the ranking check would settle by noise).
    "grpo 1 rank": ["algorithm.name=grpo", "resources.world_size=1", "resources.threads_per_rank=1"],
}
_FLOOR = 1e-7  # seconds or fraction: a factor the fit drove to 0 can still grow back
_FIT = ("train", "forward", "prefill", "share_scale", "collective_s", "sync_collective_s", "dtensor_collective_s",
        "call_s", "decode_step_s", "controller_per_seq_s", "per_step_s")


def profile_config(overrides: list[str], output_dir: Path, world_size: int = 2) -> RunConfig:
    return load_run_config(None, [f"trainer.output_dir={output_dir}", f"resources.world_size={world_size}",
                                  *BASE, *overrides])


def mapping_of(cfg: RunConfig) -> Mapping:
    """The mapping a (non-auto) run config runs: the inverse of apply.mapping_config."""
    world = cfg.resources.resolved_world_size()
    critics = cfg.algorithm.spec.critics
    roles = ["actor", *(["reference"] if cfg.use_reference else []), *critics]
    roles += [k for k in ("reward_model", "cost_model") if getattr(cfg, k).path is not None]
    split = cfg.resources.placement == "split"
    actor_n = world - cfg.resources.critic_ranks if split else world
    critic_n = cfg.resources.critic_ranks if split else world

    def par(section, n: int, gen_tp: int = 0) -> Parallel:
        return Parallel(n // section.tp_size, section.tp_size, 1, gen_tp)

    pars = {"actor": par(cfg.actor, actor_n, cfg.rollout.tensor_model_parallel_size)}
    pars.update({r: par(cfg.actor, actor_n) for r in roles if r == "reference"})
    pars.update({r: par(cfg.critic, critic_n) for r in critics})
    pars.update({r: par(getattr(cfg, r), actor_n) for r in ("reward_model", "cost_model") if r in roles})
    if split:
        pools = (Pool(tuple(r for r in roles if r not in critics), actor_n), Pool(tuple(critics), critic_n))
    else:
        pools = (Pool(tuple(roles), world),)
    return Mapping(pools, pars)


def _with_eff(problem: Problem, eff: Efficiency) -> Problem:
    return dataclasses.replace(problem, cluster=dataclasses.replace(problem.cluster, efficiency=eff))


def predict(problem: Problem, mapping: Mapping, eff: Efficiency) -> Mapping:
    return simulate(_with_eff(problem, eff), Mapping(mapping.pools, dict(mapping.parallel)))


def _loss(cases: list[tuple[Problem, Mapping, dict[str, float]]], eff: Efficiency) -> float:
    total = 0.0
    for problem, mapping, times in cases:
        m = predict(problem, mapping, eff)
        predicted = {**m.phase_s, **m.within_s, "step": m.step_s}
        pairs = [(p, times[k]) for k, p in predicted.items() if k in times]
        total += sum(math.log(max(p, 1e-9) / max(t, 1e-9)) ** 2 for p, t in pairs)
    # The measured share (devices.measure_cpu) counts as one more measurement: a fitted
    # correction away from it costs what one phase that far off costs.
    return total + math.log(eff.share_scale) ** 2


# Where the fit starts: round guesses, not CPU_DEFAULT (fitted on the shipped measurements,
# so a leave-one-out fit started there would know the profile it leaves out).
FIT_START = Efficiency(train=0.3, forward=0.3, prefill=0.3, decode_bw=0.3, comm=0.5, collective_s=1e-3,
                       sync_collective_s=1e-3, dtensor_collective_s=1e-3, call_s=0.05, micro_batch_s=2e-3,
                       decode_step_s=0.01, controller_per_seq_s=1e-3, per_step_s=0.1, source="fit start")


def fit(cases: list[tuple[Problem, Mapping, dict[str, float]]], start: Efficiency = FIT_START,
        rounds: int = 40) -> Efficiency:
    """Coordinate descent in log space over the _FIT factors (module docstring): coarse
    steps until none helps, then finer ones (a factor known to a few per cent)."""
    eff, best = start, _loss(cases, start)
    for factors in ((4.0, 2.0, 1.25, 0.8, 0.5, 0.25), (1.1, 1 / 1.1), (1.03, 1 / 1.03)):
        for _ in range(rounds):
            improved = False
            for name in _FIT:
                for factor in factors:
                    value = max(getattr(eff, name), _FLOOR) * factor  # from the floor an overhead can come back
                    if name in ("train", "forward", "prefill", "decode_bw") and value > 1.0:
                        continue  # a fraction of the roofline
                    trial = dataclasses.replace(eff, **{name: value})
                    loss = _loss(cases, trial)
                    if loss < best - 1e-12:
                        eff, best, improved = trial, loss, True
            if not improved:
                break
    return eff


def cases_of(measured: dict[str, dict[str, Any]], device: DeviceSpec, output_dir: Path) -> dict[str, tuple]:
    """(problem, mapping, measured times) per profile. The problem's prompt and response
    lengths are the measured batches' padded lengths where the measurement has them
    (trainer/jobs/profiles.py): the demo's prompts are far shorter than max_prompt_length, and
    the engines compute on the batch's longest prompt, not on the cap."""
    out = {}
    for name, m in measured.items():
        cfg = profile_config(PROFILES[name], output_dir)
        cluster = Cluster(1, cfg.resources.resolved_world_size(), device, CPU_DEFAULT)
        problem = problem_from_config(cfg, cluster, Capabilities.for_run(cfg))
        if "lengths" in m:
            work = dataclasses.replace(problem.workload, prompt_len=round(m["lengths"]["prompt"]),
                                       response_len=round(m["lengths"]["response"]))
            problem = dataclasses.replace(problem, workload=work)
        out[name] = (problem, mapping_of(cfg), m["times"])
    return out


def leave_one_out(cases: dict[str, tuple], device: DeviceSpec) -> dict[str, dict[str, float]]:
    """Each profile's step time predicted by factors fitted on the other profiles."""
    rows = {}
    for name, (problem, mapping, times) in cases.items():
        eff = fit([c for n, c in cases.items() if n != name])
        rows[name] = {"measured_s": times["step"], "predicted_s": predict(problem, mapping, eff).step_s}
    return rows


def loo_report(loo: dict[str, dict[str, float]], loads: dict[str, float]) -> tuple[str, int, bool]:
    """The leave-one-out table (measured, predicted, error, 1-minute load per profile), the
    number within 25 % and whether the predicted ranking equals the measured one."""
    lines = [f"{'mapping':32} {'measured s':>10} {'predicted s':>11} {'error':>7} {'load':>5}   (leave-one-out)"]
    for name, row in loo.items():
        err = row["predicted_s"] / row["measured_s"] - 1
        lines.append(f"{name:32} {row['measured_s']:10.3f} {row['predicted_s']:11.3f} {err:+7.1%} {loads[name]:5.1f}")
    within = sum(abs(r["predicted_s"] / r["measured_s"] - 1) <= 0.25 for r in loo.values())
    by_measured = sorted(loo, key=lambda n: loo[n]["measured_s"])
    by_predicted = sorted(loo, key=lambda n: loo[n]["predicted_s"])
    same = by_measured == by_predicted
    lines.append(f"within 25 %: {within} of {len(loo)}; same ranking: {same}")
    if not same:
        lines += [f"  measured order:  {' < '.join(by_measured)}", f"  predicted order: {' < '.join(by_predicted)}"]
    return "\n".join(lines), within, same


def fit_and_store(measured: dict[str, dict[str, Any]], device: DeviceSpec, output_dir: Path) -> tuple[Path, str]:
    """Fit the factors on every profile of `measured`, store them with the device and the
    measurements; the report is the leave-one-out comparison."""
    cases = cases_of(measured, device, output_dir)
    eff = dataclasses.replace(fit(list(cases.values())), source=f"fitted by hybridflow plan --calibrate on "
                              f"{len(cases)} profiles (load {os.getloadavg()[0]:.1f})")
    loo = leave_one_out(cases, device)
    path = save_calibration(device, eff, {"measured": measured, "leave_one_out": loo})
    report, _, _ = loo_report(loo, {n: m["load_avg_1"] for n, m in measured.items()})
    factors = ", ".join(f"{k} {v:.3g}" for k, v in eff.to_dict().items() if k != "source")
    return path, f"{report}\nfitted on all {len(cases)}: {factors}\ndevice: {device.source}"
