"""`hybridflow plan`: the best mappings of a run's dataflow on a cluster (docs/planner.md).

    hybridflow plan --config run.yaml                                  # this machine, as the trainer runs it
    hybridflow plan --config run.yaml --nodes 16 --devices-per-node 8 --device a100-80gb \\
        --model llama-70b --runtime paper --top 5 --json plan.json     # a simulated cluster
    hybridflow plan --calibrate                                        # fit this machine's factors
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hybridflow.cli.run_config import add_config_arguments, load


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="auto-mapping: best placement and parallel sizes of a run (cost simulator)")
    add_config_arguments(p)
    p.add_argument("--nodes", type=int, default=1, help="nodes of the cluster (default 1)")
    p.add_argument("--devices-per-node", type=int, default=None,
                   help="devices per node (default: the run's resources.world_size)")
    p.add_argument("--device", default=None, help="cpu, a100-80gb or h100 (default: this machine's)")
    p.add_argument("--model", default=None, help="replace every role's model with a named shape: "
                   "llama-7b, llama-13b, llama-34b, llama-70b")
    p.add_argument("--runtime", choices=("trainer", "paper"), default="trainer",
                   help="trainer: what hybridflow's trainer runs (colocated/split critics, no pipeline; the "
                   "program's concurrently blocks overlap across pools when the config's trainer.concurrent_phases "
                   "is true, else phases one after another); paper: every placement, pipeline parallel, pools "
                   "overlapping stage by stage")
    p.add_argument("--top", type=int, default=5, help="mappings to show (default 5)")
    p.add_argument("--json", default=None, help="also write the result to this JSON file")
    p.add_argument("--calibrate", action="store_true", help="profile this machine and store the fitted factors")
    p.set_defaults(handler=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    if args.calibrate:
        from hybridflow.trainer.jobs.profiles import calibrate

        path, report = calibrate()
        print(report)
        print(f"stored: {path}")
        return 0
    loaded = load(args)
    if loaded is None:
        return 2
    cfg = loaded[1]
    from hybridflow.planner import LLAMA, Capabilities, Cluster, problem_from_config, search
    from hybridflow.planner.apply import local_device

    if args.model is not None and args.model not in LLAMA:
        print(f"hybridflow plan: --model {args.model!r} is not a known shape; use one of {sorted(LLAMA)}",
              file=sys.stderr)
        return 2
    per_node = args.devices_per_node or cfg.resources.resolved_world_size()
    try:
        cluster = Cluster.of(args.nodes, per_node, args.device or local_device(cfg.resources.use_gpu))
    except ValueError as err:
        print(f"hybridflow plan: {err}", file=sys.stderr)
        return 2
    caps = Capabilities.for_run(cfg) if args.runtime == "trainer" else Capabilities()
    problem = problem_from_config(cfg, cluster, caps, LLAMA.get(args.model) if args.model else None)
    result = search(problem, args.top)
    print(render(result, problem))
    if not result.mappings and args.model is None and cfg.model.uses_builtin:
        print(tiny_model_hint(cfg, args.nodes * per_node, args))
    if args.json:
        Path(args.json).write_text(json.dumps(as_json(result, problem), indent=2))
    return 0 if result.mappings else 1


def tiny_model_hint(cfg, devices: int, args: argparse.Namespace) -> str:
    """Why nothing fits: the roles are the built-in tiny model, and how to plan a real one."""
    b = cfg.model.builtin
    device = f" --device {args.device}" if args.device else ""
    return (f"The roles are the built-in tiny model ({b.num_hidden_layers} layers, hidden {b.hidden_size}, "
            f"{b.num_attention_heads} heads) with {cfg.data.train_batch_size} prompts x {cfg.rollout.n} samples per "
            f"step: too small a model to split over {devices} devices (tensor parallelism stops at its heads, data "
            "parallelism at the batch). Plan a real model's shape with --model (llama-7b, llama-13b, llama-34b, "
            "llama-70b) and a workload of its size, e.g. the paper's PPO:\n"
            f"  hybridflow plan --config examples/plan_paper_ppo.yaml --nodes {args.nodes} --devices-per-node "
            f"{args.devices_per_node or devices // args.nodes}{device} --model llama-70b")


def as_json(result, problem) -> dict:
    c = problem.cluster
    return {"cluster": {"nodes": c.nodes, "devices_per_node": c.devices_per_node, "device": c.device.__dict__,
                        "efficiency": c.efficiency.to_dict()},
            "roles": list(problem.roles), "phases": [p.__dict__ for p in problem.phases],
            "overlap": problem.caps.overlap, "overlapped_blocks": list(problem.overlapped_blocks),
            "search_s": result.seconds, "placements": result.placements,
            "evaluated": result.evaluated, "mappings": [m.to_dict() for m in result.mappings],
            "rejected": result.rejected}


def render(result, problem) -> str:
    c = problem.cluster
    lines = [f"{c.nodes} x {c.devices_per_node} {c.device.name} ({c.efficiency.source}); roles "
             f"{', '.join(problem.roles)}; {result.placements} placements, {result.evaluated} mappings simulated "
             f"in {result.seconds:.2f} s"]
    for i, m in enumerate(result.mappings, 1):
        pools = "  ".join(f"[{'+'.join(p.roles)}: {p.devices} dev, peak {b / 2**30:.2f} GiB]"
                          for p, b in zip(m.pools, m.peak_bytes))
        lines.append(f"{i}. {m.placement():28} step {m.step_s:8.3f} s  {m.tokens_per_s:10.0f} tok/s  {pools}")
        lines.append("     " + ", ".join(f"{r} {p.label()}" for r, p in m.parallel.items()))
        lines.append("     " + ", ".join(f"{k} {v:.3f}" for k, v in m.phase_s.items()))
    if not result.mappings:
        lines.append("no mapping fits")
    if result.rejected:
        total = sum(result.rejected.values())
        lines.append(f"rejected ({total}, by reason; first 8):")
        for reason, n in sorted(result.rejected.items(), key=lambda x: -x[1])[:8]:
            lines.append(f"  {n:5d}x {reason}")
    return "\n".join(lines)
