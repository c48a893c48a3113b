"""hybridflow vs TRL's GRPOTrainer, side by side on the same GRPO workload (issue 17).

Run (tiny: ~25 s per run, 9 runs; SmolLM2: 5-10 min per run on 2 cores):

    .venv/bin/pip install -e '.[bench]'        # trl, pinned; never a runtime dependency
    .venv/bin/python benchmarks/rl/bench_vs_trl.py --workloads tiny --repeats 3 --steps 8
    .venv/bin/python benchmarks/rl/bench_vs_trl.py --workloads tiny,smollm2_32,smollm2_128 \
        --repeats 3 --repeats-for smollm2_32=1,smollm2_128=1

Workloads (both systems get the same model directory, tokenizer, prompts in the same
order, reward function, samples per prompt, lengths, temperature 1, learning rate, AdamW
with constant schedule, grad clip 1.0, no weight decay, no KL and no reference model,
one optimizer step per RL step on the whole batch, PPO clip 0.2, token-mean loss; TRL
with gradient checkpointing off, as hybridflow runs):

| workload | model | prompts | samples per step | new tokens <= |
| --- | --- | --- | --- | --- |
| tiny | the built-in task's model family and char tokenizer: Qwen2, 1.0M parameters (hybridflow.data.tokenizer) | built-in arithmetic task | 8 x 8 = 64 | 8 |
| smollm2_32 | SmolLM2-135M-Instruct (hybridflow.engines.pretrained, cached conversion) | GSM8K train (../shared/data) | 4 x 4 = 16 | 32 |
| smollm2_128 | as above | as above | 4 x 4 = 16 | 128 |
| qwen05_64 | Qwen2.5-0.5B's config, random weights, SmolLM2's tokenizer | as above | 8 x 4 = 32 | 64 |

qwen05_64's TRL run splits its batch into 4 gradient accumulation steps (Workload.trl_grad_accumulation:
its whole-batch backward does not fit 24 GiB); still one optimizer step on the whole batch.

Reward: `vs_trl_runs.compute_score` (exact answer / last number of the response), which
hybridflow loads as reward.custom_fn_path and TRL calls as its reward function.

Method. Every run is its own subprocess (vs_trl_runs.py): TRL's trainer with a callback,
or hybridflow's RLTrainer from a run config, as a user would start them. Runs are
interleaved (TRL, ours per layout, TRL, ours, ...) for `--repeats` rounds. Threads in
total are equal: TRL gets `--threads` torch threads; hybridflow runs each layout RxT
(R ranks of T threads, R*T = --threads: resources.world_size=R,
resources.threads_per_rank=T; 1xT is what a run picks by itself on a T-core machine). Ray runs its workers at niceness 15 unless --ray-worker-niceness says otherwise
(it matters only when other jobs share the cores; the niceness seen is recorded). The allocator is the same for all (glibc malloc
with the mmap / trim thresholds hybridflow's workers set, hybridflow/controller/malloc.py,
given to every process of both systems; or jemalloc through LD_PRELOAD with --allocator jemalloc). While a run lasts, a sampler
in this process sums RSS and PSS over the run's whole process tree (for hybridflow: the
controller, Ray's processes and actors, the reward workers) and measures the CPU time
other processes took (foreign CPU, in cores) and the load average. Step time is the
wall-clock interval between consecutive optimizer-step ends (everything the loop does),
median over steps 2..N; each system's own step timer is reported beside it. Tokens/s use
TRL's count: prompt tokens + completion tokens (through EOS) of all samples of a step.
Phases: gen (hybridflow: reshard + generation call; TRL: tokenize + generate + decode),
reward, old_log_prob (TRL: none at one PPO epoch), update (forward + backward +
optimizer), other = step - these. Each phase's fraction of the matmul ceiling (a square
fp32/bf16 matmul on --threads threads, measured before and after every run) is
FLOPs / phase seconds / ceiling, with FLOPs = 2 N tokens + 4 L d s^2 per forward and
3x that for the update (hybridflow/engines/train/flops.py). Prints a table and writes
benchmarks/rl/results/vs_trl.json with the machine description.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*
from benchmarks.common.provenance import stamp  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "vs_trl_runs.py"
GSM8K_TRAIN = HERE.parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"


@dataclass(frozen=True)
class Workload:
    name: str
    model: str  # "tiny", "smollm2" or "qwen05" (Qwen2.5-0.5B's shape, random weights)
    prompts: str  # "arithmetic" or "gsm8k"
    prompts_per_step: int
    n: int
    max_new_tokens: int
    max_prompt_length: int
    lr: float
    # hybridflow's micro-batching (TRL runs the whole batch in one forward/backward).
    micro_batch_per_rank: int
    forward_micro_batch_per_rank: int
    pack_sequences: bool
    # TRL's whole-batch backward keeps every layer's activations of every sample; where that
    # does not fit this machine's memory, TRL splits the batch into this many gradient
    # accumulation steps (still one optimizer step on the whole batch, its "dapo" loss
    # normalised over the whole batch's tokens: the same update).
    trl_grad_accumulation: int = 1


WORKLOADS = {
    "tiny": Workload("tiny", "tiny", "arithmetic", 8, 8, 8, 32, 1e-4, 64, 64, False),
    "smollm2_32": Workload("smollm2_32", "smollm2", "gsm8k", 4, 4, 32, 160, 1e-6, 4, 8, True),
    "smollm2_128": Workload("smollm2_128", "smollm2", "gsm8k", 4, 4, 128, 160, 1e-6, 4, 8, True),
    # issue 28, goal 3: half a billion parameters, 8 prompts x 4 samples, 64 new tokens
    # TRL at one accumulation step: 32 x ~230 tokens of 24 layers' activations and the
    # 151936-wide logits need ~30 GB (estimated), over this machine's 24 GiB.
    "qwen05_64": Workload("qwen05_64", "qwen05", "gsm8k", 8, 4, 64, 160, 1e-6, 4, 8, True, trl_grad_accumulation=4),
}

# Qwen2.5-0.5B's config.json (huggingface.co/Qwen/Qwen2.5-0.5B): 494M parameters, tied
# embeddings. Speed and memory need its shape, not its weights: random weights (seed 0), and
# SmolLM2's tokenizer (no Qwen tokenizer is on this machine). Ids past the tokenizer's 49152
# decode to nothing in both systems, so every sample runs the full 64 tokens.
QWEN05_CONFIG = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
                     use_sliding_window=False)


# ----------------------------------------------------------------------------- inputs


def model_dir(workload: Workload, work: Path) -> Path:
    """The HF model directory both systems load."""
    if workload.model == "tiny":
        from hybridflow.data.tokenizer import make_builtin_model_dir

        path = work / "tiny_qwen2"
        if not (path / "config.json").is_file():
            make_builtin_model_dir(path, family="qwen2", seed=0)
        return path
    from hybridflow.engines.pretrained import pretrained_model_dir

    smollm2 = pretrained_model_dir("smollm2-135m-instruct")
    if workload.model == "qwen05":
        return qwen05_model_dir(work / "qwen05_random", smollm2)
    return smollm2


def qwen05_model_dir(path: Path, tokenizer_dir: Path) -> Path:
    """A Qwen2.5-0.5B-shaped model with random weights (fp32, seed 0) and `tokenizer_dir`'s
    tokenizer, written once into `path`."""
    if (path / "config.json").is_file():
        return path
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False)
    config = Qwen2Config(**QWEN05_CONFIG, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def prompt_rows(workload: Workload, tokenizer: Any, count: int) -> list[dict]:
    """`count` verl-format prompt rows that fit max_prompt_length after the chat template."""
    if workload.prompts == "arithmetic":
        from hybridflow.data.arithmetic import ArithmeticConfig, rl_records

        candidates = rl_records(ArithmeticConfig(), "train", count)
    else:
        from hybridflow.data.preprocess import gsm8k_record

        with open(GSM8K_TRAIN) as f:
            raw = [json.loads(line) for _, line in zip(range(4 * count), f)]
        candidates = [gsm8k_record(r["question"], r["answer"], "train", i) for i, r in enumerate(raw)]
    rows = []
    for row in candidates:
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= workload.max_prompt_length:
            rows.append(row)
        if len(rows) == count:
            return rows
    raise RuntimeError(f"only {len(rows)} of {count} prompts fit max_prompt_length={workload.max_prompt_length}")


def flop_facts(path: Path) -> tuple[int, int, int]:
    """(matmul parameters N, layers L, hidden d) of the model, from its config (meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hybridflow.engines.train.flops import matmul_parameter_count

    config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return matmul_parameter_count(model), config.num_hidden_layers, config.hidden_size


def find_jemalloc() -> str | None:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if "libjemalloc.so" in line and "=>" in line:
            return line.split("=>")[1].strip()
    return None


# ----------------------------------------------------------------------------- sampling


def _busy_cpu_seconds() -> float:
    """CPU seconds all processes of the machine have used since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class TreeSampler:
    """Peak RSS / PSS summed over a process tree, and the tree's CPU time, every `interval` s."""

    def __init__(self, root_pid: int, interval: float = 0.3) -> None:
        self.root = psutil.Process(root_pid)
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_processes = 0
        self.niceness: set[int] = set()
        self.cpu_by_pid: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        rss = pss = 0
        for p in procs:
            try:
                with p.oneshot():
                    info = p.memory_full_info()
                    cpu = p.cpu_times()
                    self.niceness.add(p.nice())
            except psutil.Error:
                continue
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
            self.cpu_by_pid[p.pid] = max(self.cpu_by_pid.get(p.pid, 0.0), cpu.user + cpu.system)
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_processes = max(self.peak_processes, len(procs))


def measure_ceiling(dtype_name: str) -> float:
    from hybridflow.engines.train.flops import measure_matmul_flops

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    return measure_matmul_flops(dtype, size=1024, seconds=0.5)


def run_once(spec: dict, env: dict[str, str], log: Path) -> dict:
    """One subprocess run with its tree sampled; the runner's result plus what was measured outside."""
    spec_path = Path(spec["work_dir"]) / "spec.json"
    out_path = Path(spec["work_dir"]) / "result.json"
    spec_path.write_text(json.dumps(spec))
    ceiling_before = measure_ceiling(spec["dtype"])
    load_before = os.getloadavg()
    busy0, self0, wall0 = _busy_cpu_seconds(), time.process_time(), time.time()
    with open(log, "w") as log_file:
        proc = subprocess.Popen([sys.executable, str(RUNNER), str(spec_path), str(out_path)], env=env,
                                stdout=log_file, stderr=subprocess.STDOUT, cwd=spec["work_dir"])
        sampler = TreeSampler(proc.pid)
        sampler.start()
        rc = proc.wait()
        sampler.stop()
    wall = time.time() - wall0
    busy = _busy_cpu_seconds() - busy0
    own = sum(sampler.cpu_by_pid.values()) + (time.process_time() - self0)
    load_after = os.getloadavg()
    if rc != 0:
        tail = log.read_text()[-4000:]
        raise RuntimeError(f"{spec['system']} run failed (exit {rc}); log {log}:\n{tail}")
    result = json.loads(out_path.read_text())
    ceiling_after = measure_ceiling(spec["dtype"])
    result.update(
        wall_s=wall, spawn_time=wall0, peak_rss_mb=sampler.peak_rss / 2**20, peak_pss_mb=sampler.peak_pss / 2**20,
        peak_processes=sampler.peak_processes, niceness_seen=sorted(sampler.niceness),
        load_avg_before=[round(x, 2) for x in load_before],
        load_avg_after=[round(x, 2) for x in load_after],
        foreign_cpu_cores=max(0.0, (busy - own) / wall), own_cpu_cores=own / wall,
        ceiling_gflops=(ceiling_before + ceiling_after) / 2 / 1e9,
    )
    return result


# ----------------------------------------------------------------------------- summary


def summarize(result: dict, facts: tuple[int, int, int]) -> dict:
    """Median step time (intervals between step ends, steps 2..N), tokens/s, phase medians, MFUs."""
    recs = sorted(result["records"], key=lambda r: r["step"])
    if len(recs) < 3:
        raise RuntimeError(f"need >= 3 steps for a median over steps 2..N, got {len(recs)}")
    later = recs[1:]
    intervals = [b["end_time"] - a["end_time"] for a, b in zip(recs, recs[1:])]
    step_s = statistics.median(intervals)
    tokens = [r["prompt_tokens"] + r["completion_tokens"] for r in later]
    phases = {k: statistics.median(r["phases"][k] for r in later) for k in later[0]["phases"]}
    # other = what the loop spends outside the four phases, per step (then the median).
    core = ("gen", "reward", "old_log_prob", "update")
    phases["other"] = statistics.median(
        dt - sum(r["phases"].get(k, 0.0) for k in core) for dt, r in zip(intervals, later))
    n_params, layers, hidden = facts
    samples = later[0]["samples"]
    seq = statistics.median(tokens) / samples
    forward = 2.0 * n_params * seq * samples + 4.0 * layers * hidden * seq * seq * samples
    ceiling = result["ceiling_gflops"] * 1e9
    has_old = phases.get("old_log_prob", 0.0) > 0
    step_flops = forward * (1 + int(has_old) + 3)

    def frac(flops: float, seconds: float) -> float | None:
        return flops / seconds / ceiling if seconds > 0 else None

    return {
        "median_step_s": step_s,
        "median_own_step_s": statistics.median(r["own_step_s"] for r in later),
        "step_intervals_s": intervals,
        "tokens_per_step_median": statistics.median(tokens),
        "prompt_tokens_per_sample": statistics.median(r["prompt_tokens"] for r in later) / samples,
        "completion_tokens_per_sample": statistics.median(r["completion_tokens"] for r in later) / samples,
        "tokens_per_s": statistics.median(tokens) / step_s,
        "phases_median_s": phases,
        "ceiling_fraction": {
            "gen": frac(forward, phases["gen"]), "old_log_prob": frac(forward, phases.get("old_log_prob", 0.0)),
            "update": frac(3 * forward, phases["update"]), "step": frac(step_flops, step_s),
        },
        "time_to_first_step_end_s": recs[0]["end_time"] - result["spawn_time"],
    }


def layout_threads(layout: str) -> tuple[int, int]:
    ranks, threads = (int(x) for x in layout.lower().split("x"))
    return ranks, threads


COLUMNS = ("workload", "system", "layout", "dtype", "rep", "step s", "own s", "tok/s", "gen", "reward", "old_lp",
           "update", "other", "gen %c", "upd %c", "step %c", "RSS MB", "PSS MB", "load 1m", "foreign", "ours/TRL")


def table_cells(r: dict) -> list[str]:
    """One run as table cells: seconds are medians over steps 2..N; %c = fraction of the matmul ceiling."""
    s, p = r["summary"], r["summary"]["phases_median_s"]
    frac = {k: f"{100 * v:.1f}%" if v is not None else "-" for k, v in s["ceiling_fraction"].items()}
    return [
        r["workload"], r["system"], r["layout"], r["dtype"], str(r["repeat"]), f"{s['median_step_s']:.3f}",
        f"{s['median_own_step_s']:.3f}", f"{s['tokens_per_s']:.1f}", *(f"{p.get(k, 0.0):.3f}" for k in
        ("gen", "reward", "old_log_prob", "update", "other")), frac["gen"], frac["update"], frac["step"],
        f"{r['peak_rss_mb']:.0f}", f"{r['peak_pss_mb']:.0f}",
        f"{r['load_avg_before'][0]:.1f}-{r['load_avg_after'][0]:.1f}", f"{r['foreign_cpu_cores']:.2f}",
        f"{r['ratio_vs_trl']:.2f}" if r.get("ratio_vs_trl") is not None else "-",
    ]


def print_table(rows: list[dict]) -> None:
    cells = [table_cells(r) for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(COLUMNS)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |")


# Issue 28's goals: (our step time, our peak PSS) at most these fractions of TRL's; None:
# memory has no goal.
GOALS = {"tiny": (0.6, None), "smollm2_32": (0.45, 1.0), "smollm2_128": (0.45, 1.0), "qwen05_64": (0.5, 0.5)}


def aggregate(rows: list[dict]) -> list[dict]:
    """One line per (workload, dtype, system, layout): medians over repeats, and the goal check."""
    keys = sorted({(r["workload"], r["dtype"], r["system"], r["layout"]) for r in rows},
                  key=lambda k: (k[0], k[1], k[2] != "trl", k[3]))
    out = []
    for key in keys:
        group = [r for r in rows if (r["workload"], r["dtype"], r["system"], r["layout"]) == key]
        ratios = [r["ratio_vs_trl"] for r in group if r.get("ratio_vs_trl") is not None]
        phases = group[0]["summary"]["phases_median_s"]
        line = {
            "workload": key[0], "dtype": key[1], "system": key[2], "layout": key[3], "repeats": len(group),
            "median_step_s": statistics.median(r["summary"]["median_step_s"] for r in group),
            "tokens_per_s": statistics.median(r["summary"]["tokens_per_s"] for r in group),
            "phases_median_s": {k: statistics.median(r["summary"]["phases_median_s"][k] for r in group)
                                for k in phases},
            "peak_rss_mb": max(r["peak_rss_mb"] for r in group),
            "peak_pss_mb": max(r["peak_pss_mb"] for r in group),
            "ratio_vs_trl": statistics.median(ratios) if ratios else None,
        }
        out.append(line)
    for line in out:
        trl = next((t for t in out if t["system"] == "trl" and t["workload"] == line["workload"]
                    and t["dtype"] == line["dtype"]), None)
        if line["system"] == "trl" or trl is None:
            continue
        goal, memory_goal = GOALS[line["workload"]]
        line["ratio_of_medians"] = line["median_step_s"] / trl["median_step_s"]
        line["memory_ratio"] = line["peak_pss_mb"] / trl["peak_pss_mb"]
        line["goal_ratio"], line["memory_goal_ratio"] = goal, memory_goal
        line["goal_met"] = line["ratio_vs_trl"] <= goal and (
            memory_goal is None or line["memory_ratio"] <= memory_goal)
    return out


def print_summary(summary: list[dict]) -> None:
    print("\nmedians over repeats (ours/TRL = median of per-repeat step-time ratios; goals from issue 28):")
    for s in summary:
        text = (f"  {s['workload']:11} {s['dtype']:5} {s['system']:10} {s['layout']:6} step {s['median_step_s']:.3f} s"
                f"  tok/s {s['tokens_per_s']:.1f}  peak RSS {s['peak_rss_mb']:.0f} MB  PSS {s['peak_pss_mb']:.0f} MB")
        if "goal_ratio" in s:
            memory = s.get("memory_goal_ratio")  # absent in JSONs saved before issue 28's goals
            text += (f"  ours/TRL {s['ratio_vs_trl']:.2f} (goal <= {s['goal_ratio']:.2f}"
                     f"{'' if memory is None else f', PSS <= {memory:.2f}x TRL'}: "
                     f"{'met' if s['goal_met'] else 'not met'})")
        print(text)


# ----------------------------------------------------------------------------- machine


def _git_source(path: Path) -> dict[str, Any]:
    """Commit and number of changed files of the git tree `path` is in (None outside git)."""
    def git(*args: str) -> str | None:
        out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=False)
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain")
    return {"path": str(path), "commit": git("rev-parse", "HEAD"),
            "changed_files": None if status is None else len(status.splitlines())}


def _version_or_none(package: str) -> str | None:
    """The installed version, or None (a --skip-trl run needs no TRL)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine(allocator: str) -> dict[str, Any]:
    """The house machine description (as in the other benchmarks) plus what this one needs."""
    import ray
    import transformers

    import hybridflow
    from hybridflow.engines.precision import cpu_has_fast_bf16

    cpu, flags = platform.processor(), []
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags"))
    except (OSError, StopIteration):
        pass
    return {
        "platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "avx512f": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags,
        "native_bf16": cpu_has_fast_bf16(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "trl": _version_or_none("trl"), "ray": ray.__version__,
        "allocator": allocator, "hybridflow_source": _git_source(Path(hybridflow.__file__).resolve().parent.parent),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


# ----------------------------------------------------------------------------- main


def base_spec(w: Workload, dtype: str, model: Path, prompts: Path, steps: int, seed: int) -> dict:
    return {"workload": w.name, "model_dir": str(model), "prompts_file": str(prompts),
            "prompts_per_step": w.prompts_per_step, "n": w.n, "max_new_tokens": w.max_new_tokens,
            "max_prompt_length": w.max_prompt_length, "temperature": 1.0, "lr": w.lr, "dtype": dtype,
            "steps": steps, "seed": seed, "micro_batch_per_rank": w.micro_batch_per_rank,
            "forward_micro_batch_per_rank": w.forward_micro_batch_per_rank, "pack_sequences": w.pack_sequences,
            "trl_grad_accumulation": w.trl_grad_accumulation}


def source_trees(spec: str) -> dict[str, str]:
    """`--trees before=/path/a,after=/path/b` -> {"hybridflow@before": "/path/a", ...}: more
    hybridflow systems, each importing the package from that source tree (a worktree of an
    older commit), interleaved with the others so a change is timed before and after in one run."""
    trees = {}
    for item in filter(None, spec.split(",")):
        name, _, path = item.partition("=")
        if not path or not (Path(path) / "hybridflow" / "__init__.py").is_file():
            raise SystemExit(f"--trees {item!r}: expected NAME=PATH with PATH/hybridflow/__init__.py")
        trees[f"hybridflow@{name}"] = str(Path(path).resolve())
    return trees


def repeats_of(name: str, args: argparse.Namespace) -> int:
    overrides = dict(item.split("=") for item in args.repeats_for.split(",") if item)
    return int(overrides.get(name, args.repeats))


def run_workload(w: Workload, dtype: str, args: argparse.Namespace, work: Path, env: dict[str, str],
                 on_row: Callable[[dict], None]) -> None:
    """Interleaved runs of one workload: per repeat TRL, then hybridflow in every layout;
    `on_row` gets each run's row as soon as it is measured."""
    from transformers import AutoTokenizer

    model = model_dir(w, work)
    tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=False)
    prompts = work / f"{w.name}_prompts.jsonl"
    rows = prompt_rows(w, tokenizer, w.prompts_per_step * args.steps)
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    facts = flop_facts(model)
    trees = source_trees(args.trees)
    plan = [] if args.skip_trl else [("trl", f"1x{args.threads}")]
    plan += [(system, layout) for system in ["hybridflow", *trees] for layout in args.layouts.split(",")]
    for repeat in range(repeats_of(w.name, args)):
        for system, layout in plan:
            ranks, threads = layout_threads(layout)
            run_dir = work / f"{w.name}_{dtype}_{system}_{layout}_r{repeat}"
            run_dir.mkdir(parents=True, exist_ok=True)
            spec = {**base_spec(w, dtype, model, prompts, args.steps, args.seed),
                    "system": "trl" if system == "trl" else "hybridflow",
                    "work_dir": str(run_dir), "threads": args.threads, "ranks": ranks, "threads_per_rank": threads}
            print(f"[{time.strftime('%H:%M:%S')}] {w.name} {dtype} {system} {layout} repeat {repeat} "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
            run_env = dict(env)
            if system in trees:  # this tree's hybridflow wins over the installed one, in Ray's workers too
                run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [trees[system], env.get("PYTHONPATH")]))
            if system != "trl" and args.ray_worker_niceness is not None:
                run_env["RAY_worker_niceness"] = str(args.ray_worker_niceness)
            result = run_once(spec, run_env, run_dir / "log.txt")
            row = {"workload": w.name, "system": system, "layout": layout, "dtype": dtype, "repeat": repeat,
                   "flop_facts": list(facts), **result}
            row["summary"] = summarize(row, facts)
            on_row(row)


def add_ratios(rows: list[dict]) -> None:
    """ratio_vs_trl of every hybridflow row: its median step time over that of the TRL run
    of the same workload, dtype and repeat (the run right before it)."""
    trl = {(r["workload"], r["dtype"], r["repeat"]): r["summary"]["median_step_s"] for r in rows
           if r["system"] == "trl"}
    for r in rows:
        key = (r["workload"], r["dtype"], r["repeat"])
        if r["system"] != "trl" and key in trl:
            r["ratio_vs_trl"] = r["summary"]["median_step_s"] / trl[key]


def resummarize(path: Path) -> None:
    """Recompute the summaries of a saved JSON from its per-step records (no new runs)."""
    result = json.loads(path.read_text())
    for row in result["runs"]:
        row["summary"] = summarize(row, tuple(row["flop_facts"]))
    add_ratios(result["runs"])
    result["summary"] = aggregate(result["runs"])
    path.write_text(json.dumps(stamp(result), indent=2) + "\n")
    print_table(result["runs"])
    print_summary(result["summary"])
    print(f"rewrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="tiny", help=f"comma-separated, of {sorted(WORKLOADS)}")
    parser.add_argument("--dtypes", default="fp32", help="fp32 and/or bf16 (bf16 only on CPUs with native bf16)")
    parser.add_argument("--force-bf16", action="store_true", help="run bf16 even without native bf16")
    parser.add_argument("--layouts", default="1x2,2x1", help="hybridflow layouts RANKSxTHREADS, R*T = --threads")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in total for every run")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run (median over steps 2..N)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--repeats-for", default="", help="per-workload override, e.g. smollm2_32=1,smollm2_128=1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trees", default="", help="NAME=PATH,...: also run hybridflow from these source trees "
                        "(e.g. a worktree of an older commit), as systems hybridflow@NAME")
    parser.add_argument("--skip-trl", action="store_true", help="run no TRL (e.g. a before/after of hybridflow)")
    parser.add_argument("--allocator", choices=("system", "jemalloc"), default="system",
                        help="jemalloc: LD_PRELOAD it (found with ldconfig) for every run")
    parser.add_argument("--ray-worker-niceness", type=int, default=None,
                        help="set RAY_worker_niceness for hybridflow runs (Ray's default 15 starves its workers "
                             "when other jobs share the cores; unset = as a user runs it)")
    parser.add_argument("--note", default="", help="free text stored in the JSON (e.g. what else ran)")
    parser.add_argument("--work-dir", default=None, help="keep models, prompts, logs and run dirs here")
    parser.add_argument("--out", default=str(HERE / "results" / "vs_trl.json"))
    parser.add_argument("--resummarize", metavar="JSON", help="recompute tables of a saved JSON; run nothing")
    args = parser.parse_args()
    if args.resummarize:
        resummarize(Path(args.resummarize))
        return
    for layout in args.layouts.split(","):
        ranks, threads = layout_threads(layout)
        if ranks * threads != args.threads:
            raise SystemExit(f"layout {layout}: ranks x threads must equal --threads={args.threads}")
    unknown = sorted(set(args.workloads.split(",")) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; choose from {sorted(WORKLOADS)}")
    from hybridflow.engines.precision import cpu_has_fast_bf16

    dtypes = [d for d in args.dtypes.split(",") if d == "fp32" or cpu_has_fast_bf16() or args.force_bf16]
    if len(dtypes) < len(args.dtypes.split(",")):
        print("bf16 skipped: this CPU has no native bf16 (AVX512_BF16/AMX); --force-bf16 runs it anyway")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)  # each runner sets its own torch threads
    allocator = "glibc malloc"
    if args.allocator == "system":
        # hybridflow's workers set glibc's mmap / trim thresholds (controller/malloc.py); every
        # process of both systems starts with the same ones, so the allocator is the same.
        from hybridflow.controller.malloc import env_settings

        env.update(env_settings())
        allocator = f"glibc malloc ({', '.join(f'{k}={v}' for k, v in env_settings().items())})"
    if args.allocator == "jemalloc":
        lib = find_jemalloc()
        if lib is None:
            raise SystemExit("--allocator jemalloc: no libjemalloc.so found by ldconfig; install libjemalloc2")
        env["LD_PRELOAD"] = lib
        allocator = f"jemalloc ({lib}, LD_PRELOAD)"
    torch.set_num_threads(args.threads)  # the ceiling is measured on the threads the runs get
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="bench_vs_trl_"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    described = machine(allocator)

    def save(row: dict) -> None:
        """Keep the JSON current after every run, so a long invocation that stops keeps what it measured."""
        rows.append(row)
        add_ratios(rows)
        write_result(args, rows, described)

    try:
        for name in args.workloads.split(","):
            for dtype in dtypes:
                run_workload(WORKLOADS[name], dtype, args, work, env, save)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    print_summary(aggregate(rows))
    print(f"wrote {args.out}")


def write_result(args: argparse.Namespace, rows: list[dict], described: dict[str, Any]) -> None:
    result = {
        "benchmark": "vs_trl_grpo",
        "command": "python benchmarks/rl/bench_vs_trl.py " + " ".join(sys.argv[1:]),
        "method": __doc__.split("Method. ", 1)[1].strip(),
        "workloads": {name: asdict(WORKLOADS[name]) for name in args.workloads.split(",")},
        "threads_total": args.threads, "layouts": args.layouts.split(","), "steps": args.steps,
        "ray_worker_niceness": args.ray_worker_niceness,
        "repeats": {name: repeats_of(name, args) for name in args.workloads.split(",")}, "note": args.note,
        "summary": aggregate(rows), "runs": rows,
        "machine": {**described, "load_avg_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(stamp(result), indent=2) + "\n")


if __name__ == "__main__":
    main()
