"""3D-HybridEngine transition cost: measured vs the adapted Table 2, per method and layout.

Run:  .venv/bin/python benchmarks/bench_reshard.py [--worlds 2 4 8] [--repeats 5]

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
benchmarks/results/reshard.json with the machine description.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from hybridflow.engines.train.distributed import full_tensor
import torch.distributed as dist

from hybridflow.engines.local_ranks import run_ranks

MODEL = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=2048)
METHODS = ("hybrid", "plain", "gather_all")
STAT_KEYS = ("comm_bytes", "train_shard_bytes", "generation_bytes", "buffer_bytes", "peak_bytes")


def layouts(world: int, gen_tps: list[int]) -> list[tuple[int, int]]:
    """(training tp, generation t_g) pairs this world size supports."""
    out = []
    for tp in (1, 2):
        if world % tp:
            continue
        for tg in gen_tps:
            if world % tg == 0 and (tp == 1 or tp % tg == 0):
                out.append((tp, tg))
    return out


def _generation_matches(hybrid, full: dict[str, torch.Tensor]) -> bool:
    from hybridflow.engines.rollout import shard_for_rank

    views = hybrid.rollout.model.weights.views
    r = hybrid.rollout
    return all(
        torch.equal(views[n], shard_for_rank(t, n, r.tp_rank, r.tp_size).to(views[n].dtype)) for n, t in full.items()
    )


def rank_main(rank: int, world: int, model_dir: str, gen_tps: list[int], repeats: int) -> list[dict]:
    """Everything one rank measures for world size `world`."""
    from hybridflow.engines.models import load_hf_config
    from hybridflow.engines.reshard import HybridEngine, aligned_shard_dim
    from hybridflow.engines.rollout import RolloutConfig
    from hybridflow.engines.train import ActorEngine, MicroBatchConfig, TrainEngineConfig

    hf_config = load_hf_config(model_dir)
    rows = []
    for tp in sorted({tp for tp, _ in layouts(world, gen_tps)}):
        config = TrainEngineConfig(model_path=model_dir, dtype="bf16", tp_size=tp,
                                   micro_batch=MicroBatchConfig(mini_batch_size=world, micro_batch_size_per_device=1))
        actor = ActorEngine(config, fsdp_shard_dim=aligned_shard_dim)
        full = {n: full_tensor(p) for n, p in actor.named_sharded_parameters()}
        for tp_, tg in layouts(world, gen_tps):
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
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(model_dir))
    return ModelSizes.from_model(model)


def summarize(world: int, per_rank: list[list[dict]], sizes) -> list[dict]:
    from hybridflow.engines.reshard import predicted_costs

    rows = []
    for i, row in enumerate(per_rank[0]):
        others = [r[i] for r in per_rank]
        if any(o[k] != row[k] for o in others for k in STAT_KEYS):
            raise AssertionError(f"ranks disagree on bytes for {row['method']} tp={row['train_tp']} t_g={row['gen_tp']}")
        costs = predicted_costs(sizes, row["method"], world_size=world, train_tp=row["train_tp"], gen_tp=row["gen_tp"],
                                gen_bytes=2, train_bytes=4)
        predicted = {"comm_bytes": costs.comm_bytes, "train_shard_bytes": costs.train_shard_bytes,
                     "generation_bytes": costs.generation_bytes, "buffer_bytes": costs.buffer_bytes,
                     "peak_bytes": costs.peak_bytes}
        # wall time of a transition = the slowest rank's; median over repeats
        walls = [max(r[i]["wall_s"][k] for r in per_rank) for k in range(len(row["wall_s"]))]
        rows.append({
            "world": world, "dp": world // row["train_tp"], "train_tp": row["train_tp"], "gen_tp": row["gen_tp"],
            "method": row["method"], "correct": all(o["correct"] for o in others),
            "measured": {k: row[k] for k in STAT_KEYS}, "formula": predicted,
            "matches_formula": all(row[k] == predicted[k] for k in STAT_KEYS),
            "comm_calls": row["comm_calls"], "wall_ms_median": 1e3 * statistics.median(walls),
            "wall_ms_all": [1e3 * w for w in walls],
        })
    return rows


def print_table(rows: list[dict]) -> None:
    mib = 1 / 2**20
    print(f"{'N':>2} {'dp':>2} {'tp':>2} {'t_g':>3} {'method':10} {'comm MiB':>9} {'formula':>8} "
          f"{'peak MiB':>9} {'formula':>8} {'buffers':>8} {'ms':>8} {'x hybrid':>8} ok")
    for r in rows:
        hyb = next(h for h in rows if (h["world"], h["train_tp"], h["gen_tp"], h["method"]) ==
                   (r["world"], r["train_tp"], r["gen_tp"], "hybrid"))
        m, f = r["measured"], r["formula"]
        ok = "yes" if r["matches_formula"] and r["correct"] else "NO"
        print(f"{r['world']:>2} {r['dp']:>2} {r['train_tp']:>2} {r['gen_tp']:>3} {r['method']:10} "
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
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "reshard.json"))
    args = parser.parse_args()
    from hybridflow.engines.models import save_tiny_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model(Path(tmp) / "llama", "llama", seed=0, **MODEL)
        sizes = model_sizes(model_dir)
        for world in args.worlds:
            start = time.perf_counter()
            rows += summarize(world, run_world(world, str(model_dir), args.gen_tps, args.repeats), sizes)
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
        "rows": rows,
        "machine": machine(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    if not all(r["matches_formula"] and r["correct"] for r in rows):
        raise SystemExit("some rows do not match their formula or the full model; see the table")


if __name__ == "__main__":
    main()
