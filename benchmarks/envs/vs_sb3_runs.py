"""One training run for bench_vs_sb3.py, in its own process: hybridflow or Stable-Baselines3.

    .venv/bin/python benchmarks/envs/vs_sb3_runs.py --system sb3 --task ppo_cartpole --seed 0 --out run.json
    .venv/bin/python benchmarks/envs/vs_sb3_runs.py --system hybridflow --workers 2 --task sac_pendulum --seed 1 --out r.json

Both systems get the hyper-parameters of TASKS (the rl-baselines3-zoo entries: PPO
CartPole-v1, SAC Pendulum-v1), one torch thread in the training process, and the same stop
rule: the mean return of the last `window` finished training episodes reaches `threshold`,
or `max_steps` environment steps. Written JSON: steps and seconds to the threshold, steps/s,
setup seconds (building the model / starting the workers, not counted in the training
time; up to the first step, as SB3's: hybridflow's drawing of its plots and stopping of
its workers after the loop are its `teardown_s`), CPU seconds of the training (this process and all its descendants: Ray's runner
and learner processes included; up to the end of the training loop, not the plots
hybridflow draws after it; on a loaded machine wall time is distorted, CPU time much
less) and the curve (environment steps, rolling mean) for the plots.

hybridflow --workers 0 runs in-process; N >= 1 = N Ray env runners, sampling `--sampling`
(sync, or async with policy lag <= 1; default: sync for one runner, async for more), the
environment copies split between them (PPO: 8 in total as for SB3; SAC: one per runner,
gradient_steps -1 keeps one update per environment step). `--steps N` runs exactly N
environment steps without the threshold stop (profiling at a fixed budget).

Where the time goes (hybridflow): `phases_s`, the controller's wall seconds per phase of the
iterations (collect, adv, store, update, sync; trainer/programs/env_phases.py), and `cpu_by_role`, CPU
seconds of the training split by process: controller (this process), runners and learner
(the Ray workers' pids), ray (Ray's daemons). `autogroups` lists the scheduler autogroups
(Linux sched_autogroup, one per session) of those processes: all in one means the Ray
workers got no CPU share of their own against other sessions' load.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from typing import Any

import psutil

TASKS: dict[str, dict[str, Any]] = {
    "ppo_cartpole": {"env": "CartPole-v1", "threshold": 475.0, "window": 20, "max_steps": 150_000, "n_envs": 8,
                     "n_steps": 32, "batch_size": 256, "n_epochs": 20, "lr": 1e-3, "gamma": 0.98, "gae_lambda": 0.8,
                     "clip": 0.2, "ent_coef": 0.0, "vf_coef_sb3": 0.5, "max_grad_norm": 0.5, "net": [64, 64]},
    "sac_pendulum": {"env": "Pendulum-v1", "threshold": -200.0, "window": 20, "max_steps": 20_000, "lr": 1e-3,
                     "buffer_size": 1_000_000, "learning_starts": 100, "batch_size": 256, "tau": 0.005,
                     "gamma": 0.99, "net": [256, 256]},
}
# The same SAC with 64x64 networks: ~5x less CPU per update, for a machine too loaded to
# run the zoo's 256x256 three seeds over per system (both systems get it alike).
TASKS["sac_pendulum_64"] = {**TASKS["sac_pendulum"], "net": [64, 64]}


def tree_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of this process and every descendant, by pid."""
    out = {}
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
        except psutil.Error:  # exited meanwhile
            pass
    return out


def autogroup(pid: int) -> str | None:
    """The scheduler autogroup of a process (Linux with sched_autogroup), else None."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return f.read().split()[0]
    except OSError:
        return None


def cpu_by_role(before: dict[int, float], roles: dict[int, str], after: dict[int, float] | None = None) -> dict[str, float]:
    """CPU seconds from `before` to `after` (default: now) per role: pids in `roles`, this
    process 'controller', the rest 'ray'."""
    out: dict[str, float] = {}
    for pid, cpu in (after or tree_cpu()).items():
        role = "controller" if pid == psutil.Process().pid else roles.get(pid, "ray")
        out[role] = out.get(role, 0.0) + cpu - before.get(pid, 0.0)
    return {k: round(v, 3) for k, v in sorted(out.items())}


def run_sb3(task: str, seed: int, steps: int | None) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    t = TASKS[task]
    start = time.perf_counter()
    if t["env"] == "CartPole-v1":
        env = make_vec_env(t["env"], n_envs=t["n_envs"], seed=seed)
        model = PPO("MlpPolicy", env, n_steps=t["n_steps"], batch_size=t["batch_size"], n_epochs=t["n_epochs"],
                    learning_rate=lambda remaining: t["lr"] * remaining, gamma=t["gamma"], gae_lambda=t["gae_lambda"],
                    clip_range=t["clip"], ent_coef=t["ent_coef"], vf_coef=t["vf_coef_sb3"],
                    max_grad_norm=t["max_grad_norm"], policy_kwargs={"net_arch": t["net"], "activation_fn": torch.nn.Tanh},
                    seed=seed, device="cpu")
    else:
        env = make_vec_env(t["env"], n_envs=1, seed=seed)
        model = SAC("MlpPolicy", env, learning_rate=t["lr"], buffer_size=t["buffer_size"],
                    learning_starts=t["learning_starts"], batch_size=t["batch_size"], tau=t["tau"], gamma=t["gamma"],
                    policy_kwargs={"net_arch": t["net"]}, seed=seed, device="cpu")
    setup = time.perf_counter() - start
    window: deque[float] = deque(maxlen=t["window"])
    curve: list[tuple[int, float]] = []
    reached: dict[str, float] = {}

    class StopAtThreshold(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # the Monitor wrapper's record of a finished episode
                    window.append(float(info["episode"]["r"]))
                    curve.append((self.num_timesteps, sum(window) / len(window)))
            if steps is None and len(window) == window.maxlen and sum(window) / len(window) >= t["threshold"]:
                reached.update(steps=self.num_timesteps, seconds=time.perf_counter() - began)
                return False
            return True

    cpu_before = tree_cpu()
    began = time.perf_counter()
    model.learn(total_timesteps=steps or t["max_steps"], callback=StopAtThreshold())
    wall = time.perf_counter() - began
    split = cpu_by_role(cpu_before, {})
    cpu = sum(split.values())
    steps = int(model.num_timesteps)
    return {"setup_s": setup, "wall_s": wall, "cpu_s": cpu, "env_steps": steps, "steps_per_s": steps / wall,
            "reached_at_steps": reached.get("steps"), "time_to_target_s": reached.get("seconds"), "curve": curve,
            "cpu_by_role": split}


def run_hybridflow(task: str, seed: int, workers: int, sampling: str, steps: int | None,
                   out_dir: str) -> dict[str, Any]:
    from hybridflow import RLTrainer
    from hybridflow.trainer.run.run_dir import read_metrics

    t = TASKS[task]
    distributed: dict[str, Any] = {"num_workers": workers, "sampling": sampling}
    common = {"env": t["env"], "seed": seed, "distributed": distributed,
              "trainer": {"total_env_steps": steps or t["max_steps"],
                          "target_return": None if steps else t["threshold"],
                          "return_window": t["window"], "console": "none", "output_dir": out_dir, "log_freq": 256,
                          "loggers": ["jsonl"]}}
    if t["env"] == "CartPole-v1":
        config = {**common, "algorithm": "ppo", "env.num_envs": t["n_envs"] // max(workers, 1),
                  "policy": {"hidden_size": t["net"], "activation": "tanh"},
                  "ppo": {"rollout_steps": t["n_steps"], "minibatch_size": t["batch_size"], "epochs": t["n_epochs"],
                          "lr": t["lr"], "lr_schedule": "linear", "gamma": t["gamma"], "gae_lambda": t["gae_lambda"],
                          "clip_ratio": t["clip"], "ent_coef": t["ent_coef"], "vf_coef": 2 * t["vf_coef_sb3"],
                          "max_grad_norm": t["max_grad_norm"]}}
    else:
        config = {**common, "algorithm": "sac", "env.num_envs": 1,
                  "policy": {"hidden_size": t["net"], "activation": "relu"},
                  "sac": {"lr": t["lr"], "buffer_size": t["buffer_size"], "learning_starts": t["learning_starts"],
                          "batch_size": t["batch_size"], "tau": t["tau"], "gamma": t["gamma"],
                          "gradient_steps": -1 if workers > 1 else 1}}
    # train() draws the run's plots after its loop; SB3 draws none, so the CPU count stops
    # where the loop ends (when train() calls plot_env_run).
    from hybridflow.trainer.observe import plots as env_plots

    loop_end: dict[str, dict[int, float]] = {}
    draw = env_plots.plot_env_run

    def mark_then_plot(run_dir: Any) -> Any:
        loop_end["cpu"] = tree_cpu()
        return draw(run_dir)

    env_plots.plot_env_run = mark_then_plot
    start = time.perf_counter()
    with RLTrainer(config) as trainer:
        trainer._start()  # workers up before the clock starts (train() does this itself otherwise)
        setup = time.perf_counter() - start
        roles = {} if workers == 0 else {
            **{info["pid"]: "runners" for info in trainer.roles.runners.worker_info},
            **{info["pid"]: "learner" for info in trainer.roles.learner.worker_info}}
        groups = sorted({g for g in (autogroup(pid) for pid in [psutil.Process().pid, *roles]) if g})
        cpu_before = tree_cpu()
        result = trainer.train()
        split = cpu_by_role(cpu_before, roles, loop_end["cpu"])  # before close(): the workers are still there
        cpu = sum(split.values())
    total = time.perf_counter() - start  # set-up, training, plots and shutting the workers and Ray down
    records = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    curve = [(int(r["env/steps"]), r["episode/return_mean_window"]) for r in records
             if r.get("episode/return_mean_window") is not None]
    phases = {key.split("/", 1)[1]: round(sum(r.get(key, 0.0) for r in records), 3)
              for key in sorted({k for r in records for k in r if k.startswith("timing_s/")})}
    return {"sampling": sampling, "iterations": result.iterations, "phases_s": phases, "cpu_by_role": split,
            "autogroups": groups, "setup_s": setup, "teardown_s": total - setup - result.wall_s,
            "wall_s": result.wall_s, "cpu_s": cpu,
            "env_steps": result.env_steps,
            "steps_per_s": result.env_steps / result.wall_s, "reached_at_steps": result.reached_target_at,
            "time_to_target_s": result.wall_s if result.reached_target_at is not None else None, "curve": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["hybridflow", "sb3"], required=True)
    parser.add_argument("--task", choices=sorted(TASKS), required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="hybridflow env runners (0: in-process)")
    parser.add_argument("--sampling", choices=["sync", "async"], default=None,
                        help="hybridflow with Ray runners (default: sync for 1 runner, async for more)")
    parser.add_argument("--steps", type=int, default=None, help="exactly this many environment steps, no threshold stop")
    parser.add_argument("--run-dir", default="/tmp/vs_sb3_runs")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # both systems: one thread in the training process
    if args.system == "sb3":
        result = run_sb3(args.task, args.seed, args.steps)
    else:
        sampling = args.sampling or ("async" if args.workers > 1 else "sync")
        result = run_hybridflow(args.task, args.seed, args.workers, sampling, args.steps, args.run_dir)
    result.update(system=args.system, task=args.task, seed=args.seed,
                  workers=args.workers if args.system == "hybridflow" else None)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
