"""3D-HybridEngine transition cost: measured vs the adapted Table 2, per method and layout.

Run:  .venv/bin/python benchmarks/engines/bench_reshard.py [--worlds 2 4 8] [--repeats 5] [--pp 2]

For each world size N (gloo CPU processes), the actor is a real `ActorEngine` (FSDP2
over dp, TP over tp, bf16 compute with fp32 master weights, FSDP shards aligned with
generation TP) of a small Llama (hidden 256, 4 layers, 8 heads, 4 kv heads, MLP 768,
vocab 2048, untied). For every training tp in {1, 2}, generation t_g in {1, 2, 4} (t_g
dividing N; with tp > 1, t_g dividing tp) and method (hybrid, plain, gather_all), the
`HybridEngine` moves the weights into a bf16 native rollout engine `--repeats` times. Per
rank it records communication bytes (our all-gathers; (g-1)/g of the output bytes each),
peak parameter bytes (training shard + generation copy + gather buffers) and wall time
(between barriers, so it covers the slowest rank). Every row checks once that the
generation weights equal the slices of the full model. The table shows rank 0's bytes
(all ranks have the same by symmetry; the script checks) next to the formulas of
hybridflow/engines/reshard/formulas.py, and the median time, slowest rank. Writes
benchmarks/engines/results/reshard.json with the machine description.

`--pp 2` trains with 2 pipeline stages (p-t-d = 2 x tp x dp, N = 2 tp dp ranks; each rank
holds one stage) and generates at p_g = 1, t_g dividing a stage's tp x dp ranks. Ranks of
different stages move different bytes, so the table has one row per stage (rank
s N / 2's bytes, checked equal on every rank of the stage) beside the formula for that
stage. Writes benchmarks/engines/results/reshard_pp2.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from hybridflow.engines.local_ranks import run_ranks
import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

MODEL = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=2048)
METHODS = ("hybrid", "plain", "gather_all")
STAT_KEYS = ("comm_bytes", "train_shard_bytes", "generation_bytes", "buffer_bytes", "peak_bytes")


def layouts(world: int, gen_tps: list[int], pp: int) -> list[tuple[int, int]]:
    """(training tp, generation t_g) pairs this world size supports with pp stages."""
    out = []
    for tp in (1, 2):
        if world % (tp * pp):
            continue
        for tg in gen_tps:
            if (world // pp) % tg == 0 and (tp == 1 or tp % tg == 0):
                out.append((tp, tg))
    return out


def _generation_matches(hybrid, full: dict[str, torch.Tensor]) -> bool:
    from hybridflow.engines.rollout import shard_for_rank

    views = hybrid.rollout.model.weights.views
    r = hybrid.rollout
    return all(
        torch.equal(views[n], shard_for_rank(t, n, r.tp_rank, r.tp_size).to(views[n].dtype)) for n, t in full.items()
    )


def rank_main(rank: int, world: int, model_dir: str, gen_tps: list[int], repeats: int, pp: int) -> list[dict]:
    """Everything one rank measures for world size `world` with `pp` pipeline stages."""
    import transformers

    from hybridflow.engines.models import load_hf_config
    from hybridflow.engines.reshard import HybridEngine, ModelSizes, aligned_shard_dim
    from hybridflow.engines.rollout import RolloutConfig
    from hybridflow.engines.train import ActorEngine, MicroBatchConfig, TrainEngineConfig

    hf_config = load_hf_config(model_dir)
    # The full model as the engine loaded it (fp32 master weights), every stage's parameters.
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, trust_remote_code=False)
    full = {n: p.detach() for n, p in model.named_parameters()}
    rows = []
    for tp in sorted({tp for tp, _ in layouts(world, gen_tps, pp)}):
        config = TrainEngineConfig(model_path=model_dir, dtype="bf16", tp_size=tp, pp_size=pp,
                                   micro_batch=MicroBatchConfig(mini_batch_size=world, micro_batch_size_per_device=1))
        actor = ActorEngine(config, fsdp_shard_dim=aligned_shard_dim)
        stage = asdict(ModelSizes.from_shapes((n, tuple(full[n].shape)) for n, _ in actor.named_sharded_parameters()))
        for tp_, tg in layouts(world, gen_tps, pp):
            if tp_ != tp:
                continue
            for method in METHODS:
                hybrid = HybridEngine.build(actor.named_sharded_parameters, hf_config,
                                            RolloutConfig(dtype=torch.bfloat16), gen_tp=tg, method=method,
                                            backend="native")
                walls, stats = [], None
                for i in range(repeats + 1):  # the first transition warms up and is not timed
                    dist.barrier()
                    start = time.perf_counter()
                    stats = hybrid.to_generation()
                    dist.barrier()
                    wall = time.perf_counter() - start
                    if i == 0:
                        correct = _generation_matches(hybrid, full)
                    else:
                        walls.append(wall)
                    hybrid.to_training()
                rows.append({"train_tp": tp, "gen_tp": tg, "method": method, "correct": correct,
                             "stage": actor.pp_rank, "stage_sizes": stage,
                             "wall_s": walls, **{k: getattr(stats, k) for k in STAT_KEYS},
                             "comm_calls": stats.comm_calls})
        del actor
    return rows


# --------------------------------------------------------------------------- processes

def run_world(world: int, *args) -> list[list[dict]]:
    return run_ranks(rank_main, world, *args, timeout=1800,
                     preload=("torch", "transformers", "hybridflow.engines.train", "hybridflow.engines.reshard"))


# --------------------------------------------------------------------------- report

def model_sizes(model_dir: Path):
    import transformers

    from hybridflow.engines.reshard import ModelSizes

    with torch.device("meta"):
        config = transformers.AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
        model = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return ModelSizes.from_model(model)


def summarize(world: int, pp: int, per_rank: list[list[dict]], sizes) -> list[dict]:
    """One row per (layout, method, pipeline stage): the stage's first rank's bytes (every
    rank of the stage must agree) beside the formula for that stage."""
    from hybridflow.engines.reshard import ModelSizes, predicted_costs

    rows = []
    for i in range(len(per_rank[0])):
        everyone = [r[i] for r in per_rank]
        # wall time of a transition = the slowest rank's; median over repeats
        walls = [max(o["wall_s"][k] for o in everyone) for k in range(len(everyone[0]["wall_s"]))]
        for s in range(pp):
            others = [o for o in everyone if o["stage"] == s]
            row = others[0]
            if any(o[k] != row[k] for o in others for k in STAT_KEYS):
                raise AssertionError(f"ranks disagree on bytes for {row['method']} tp={row['train_tp']} "
                                     f"t_g={row['gen_tp']} stage {s}")
            costs = predicted_costs(sizes, row["method"], world_size=world, train_tp=row["train_tp"],
                                    gen_tp=row["gen_tp"], gen_bytes=2, train_bytes=4, pp_size=pp,
                                    stage=ModelSizes(**row["stage_sizes"]))
            predicted = {"comm_bytes": costs.comm_bytes, "train_shard_bytes": costs.train_shard_bytes,
                         "generation_bytes": costs.generation_bytes, "buffer_bytes": costs.buffer_bytes,
                         "peak_bytes": costs.peak_bytes}
            rows.append({
                "world": world, "pp": pp, "stage": s, "dp": world // (pp * row["train_tp"]),
                "train_tp": row["train_tp"], "gen_tp": row["gen_tp"], "method": row["method"],
                "correct": all(o["correct"] for o in everyone),
                "measured": {k: row[k] for k in STAT_KEYS}, "formula": predicted,
                "matches_formula": all(row[k] == predicted[k] for k in STAT_KEYS),
                "comm_calls": row["comm_calls"], "wall_ms_median": 1e3 * statistics.median(walls),
                "wall_ms_all": [1e3 * w for w in walls],
            })
    return rows


def print_table(rows: list[dict]) -> None:
    mib = 1 / 2**20
    print(f"{'N':>2} {'pp':>2} {'s':>1} {'dp':>2} {'tp':>2} {'t_g':>3} {'method':10} {'comm MiB':>9} {'formula':>8} "
          f"{'peak MiB':>9} {'formula':>8} {'buffers':>8} {'ms':>8} {'x hybrid':>8} ok")
    for r in rows:
        hyb = next(h for h in rows if (h["world"], h["train_tp"], h["gen_tp"], h["stage"], h["method"]) ==
                   (r["world"], r["train_tp"], r["gen_tp"], r["stage"], "hybrid"))
        m, f = r["measured"], r["formula"]
        ok = "yes" if r["matches_formula"] and r["correct"] else "NO"
        print(f"{r['world']:>2} {r['pp']:>2} {r['stage']:>1} {r['dp']:>2} {r['train_tp']:>2} {r['gen_tp']:>3} {r['method']:10} "
              f"{m['comm_bytes'] * mib:9.3f} {f['comm_bytes'] * mib:8.3f} {m['peak_bytes'] * mib:9.3f} "
              f"{f['peak_bytes'] * mib:8.3f} {m['buffer_bytes'] * mib:8.3f} {r['wall_ms_median']:8.1f} "
              f"{r['wall_ms_median'] / hyb['wall_ms_median']:8.2f} {ok}")


def machine() -> dict:
    cpu = ""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        cpu = next((ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("model name")), "")
    mem = ""
    if Path("/proc/meminfo").is_file():
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "memory": mem,
            "python": platform.python_version(), "torch": torch.__version__, "backend": "gloo (CPU processes)",
            "threads_per_rank": 1, "load_average": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--gen-tps", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages of the training layout (1 or 2)")
    parser.add_argument("--out", default=None, help="default results/reshard.json, or reshard_pp<P>.json")
    args = parser.parse_args()
    name = "reshard.json" if args.pp == 1 else f"reshard_pp{args.pp}.json"
    args.out = args.out or str(Path(__file__).parent / "results" / name)
    from hybridflow.engines.models import save_tiny_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model(Path(tmp) / "llama", "llama", seed=0, **MODEL)
        sizes = model_sizes(model_dir)
        for world in args.worlds:
            start = time.perf_counter()
            rows += summarize(world, args.pp, run_world(world, str(model_dir), args.gen_tps, args.repeats, args.pp),
                              sizes)
            print(f"world {world}: {time.perf_counter() - start:.0f} s", flush=True)
    print_table(rows)
    result = {
        "benchmark": "reshard_transition",
        "model": {"family": "llama", **MODEL, "tie_word_embeddings": False,
                  "split_params": sizes.split_numel, "replicated_params": sizes.replicated_numel},
        "dtypes": {"training": "fp32 master (bf16 compute)", "generation_and_transfer": "bf16"},
        "conventions": {
            "comm_bytes": "per rank, sum over our all-gathers of (g-1)/g x output bytes (bytes received)",
            "peak_bytes": "training shard + generation copy + transient gather buffers alive on the rank",
            "wall_ms": "barrier to barrier (slowest rank), median of repeats; first transition untimed",
        },
        "repeats": args.repeats,
        "pp": args.pp,
        "rows": rows,
        "machine": machine(),
        "key_figures": {**{f"world {r['world']} tp1 t_g2 {r['method']} ms": round(r["wall_ms_median"], 1) for r in rows
                           if (r["world"], r["train_tp"], r["gen_tp"], r["stage"]) == (min(args.worlds), 1, 2, 0)},
                        "all match formula": all(r["matches_formula"] and r["correct"] for r in rows)},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamp(result), indent=2))
    print(f"wrote {out}")
    if not all(r["matches_formula"] and r["correct"] for r in rows):
        raise SystemExit("some rows do not match their formula or the full model; see the table")


if __name__ == "__main__":
    main()
