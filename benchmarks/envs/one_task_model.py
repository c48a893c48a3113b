"""The size and path figures of issue 36 (one task model), for a source tree, side by side.

    .venv/bin/python benchmarks/envs/one_task_model.py --label after                      # this tree
    .venv/bin/python benchmarks/envs/one_task_model.py --label before --tree /tmp/old     # e.g. git archive 6c4bac7
    .venv/bin/python benchmarks/envs/one_task_model.py --label after --sb3 results/vs_sb3_x.json --suite fast=15.8,slow=26.6
    .venv/bin/python benchmarks/envs/one_task_model.py --table                            # print the saved labels

Measured per tree (saved under the label in results/one_task_model.json, with the machine):
- files from `hybridflow train` to the PPO loss: one real run per path (a language-model PPO
  step; environment PPO in the controller's process and with a Ray learner), every Python
  process traced (loss_trace/sitecustomize.py): the hybridflow files on the stack when the
  loss function starts, joined with the controller's stack at the worker-group call that
  reached it (a loss in a worker process); each file counted once;
- lines of hybridflow/trainer + hybridflow/config (all lines of the .py files);
- `duplicates` pairs over the tree (the first number of its summary line);
- seconds to a config error (`hybridflow train bad.key=1`), torch-free, and after importing the
  trainer's programs (what rows beside their programs would cost the config layer).
`--sb3 FILE` adds the CPU seconds per 1000 environment steps of a benchmarks/envs/bench_vs_sb3.py
--steps JSON (SB3 and each hybridflow row, with the ratio); `--suite` the CI suite minutes
as given (where they were measured goes in --suite-note).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the root, for benchmarks.*

from benchmarks.common.provenance import command_line, stamp  # noqa: E402
from benchmarks.controller.bench_controller import machine  # noqa: E402

RESULTS = HERE / "results" / "one_task_model.json"
TRACER = HERE / "loss_trace"
# One run per path: (name, example config, overrides for a short run).
PATHS = {
    "lm_ppo": ("examples/ppo_arithmetic.yaml", [
        "trainer.total_steps=1", "trainer.test_freq=0", "trainer.val_before_train=false",
        "trainer.save_final_model=false", "sft.steps=0", "resources.world_size=1", "trainer.loggers=[jsonl]"]),
    "env_ppo_in_process": ("examples/ppo_cartpole.yaml", [
        "trainer.total_env_steps=256", "distributed.num_workers=0", "trainer.target_return=null",
        "trainer.loggers=[jsonl]"]),
    "env_ppo_ray": ("examples/ppo_cartpole.yaml", [
        "trainer.total_env_steps=256", "distributed.num_workers=1", "trainer.target_return=null",
        "trainer.loggers=[jsonl]"]),
}


def loss_path(tree: Path, name: str) -> dict[str, Any]:
    """The hybridflow files from `hybridflow train` to the PPO loss of one traced run."""
    config, overrides = PATHS[name]
    with tempfile.TemporaryDirectory(prefix="hf-loss-path-") as tmp:
        trace = Path(tmp) / "trace.jsonl"
        env = {**os.environ, "PYTHONPATH": f"{TRACER}{os.pathsep}{tree}", "HF_TRACE_LOSS": str(trace)}
        cmd = [sys.executable, "-m", "hybridflow.cli", "train", "--config", str(tree / config), *overrides,
               f"trainer.output_dir={tmp}/runs"]
        for _ in range(3):  # a Ray start can time out on a loaded machine
            trace.unlink(missing_ok=True)
            done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode == 0:
                break
        if done.returncode != 0:
            raise RuntimeError(f"{name}: {' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        records = [json.loads(line) for line in trace.read_text().splitlines()]
    loss = next(r for r in records if r["kind"] == "loss")
    stack = loss["stack"]
    if not any(frame[0].startswith("cli/") for frame in stack):  # in a worker: join the controller's call
        method = next(frame[1] for frame in stack if not frame[0].startswith("controller/"))
        call = next(r for r in records if r["kind"] == "call" and r["method"] == method)
        stack = call["stack"] + stack
    files = list(dict.fromkeys(frame[0] for frame in stack))
    return {"files": len(files), "file_list": files, "loss_function": loss["function"],
            "hops": [f"{f}:{fn}" for f, fn, _ in stack]}


def config_error_seconds(tree: Path, rounds: int = 5) -> dict[str, float]:
    """Median wall seconds of `hybridflow train bad.key=1` (a config error: torch-free), and of the
    same after importing the trainer's programs (what the error would cost if the config layer
    had to import the built-in rows from beside their programs: torch, Ray, transformers)."""
    probe = ("import sys; from hybridflow.cli import main; {pre}"
             "import contextlib, io; f = io.StringIO(); r = contextlib.redirect_stderr(f); r.__enter__(); "
             "sys.exit(main(['train', 'bad.key=1']))")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    times: dict[str, list[float]] = {"torch_free": [], "after_programs_import": []}
    for _ in range(rounds):  # interleaved: load hits both alike
        for name, pre in (("torch_free", ""), ("after_programs_import", "import hybridflow.trainer.programs.algorithms; ")):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", probe.format(pre=pre)], env=env, capture_output=True, timeout=600)
            times[name].append(time.perf_counter() - start)
    return {name: round(statistics.median(values), 2) for name, values in times.items()}


def trainer_config_lines(tree: Path) -> dict[str, int]:
    counts = {}
    for package in ("trainer", "config"):
        files = sorted((tree / "hybridflow" / package).rglob("*.py"))
        counts[package] = sum(len(f.read_text().splitlines()) for f in files)
    counts["total"] = counts["trainer"] + counts["config"]
    return counts


def duplicate_pairs(tree: Path) -> int:
    out = subprocess.run(["duplicates", "--repo", str(tree), "--seconds", "300", "--most", "1"],
                         capture_output=True, text=True, check=True).stdout
    first = out.splitlines()[0]
    return 0 if first.startswith("no duplicates") else int(re.match(r"(\d+) pairs", first).group(1))


def sb3_figures(path: Path) -> dict[str, Any]:
    """CPU seconds per 1000 environment steps of each system in a bench_vs_sb3.py --steps JSON."""
    data = json.loads(path.read_text())
    out = {"source": str(path), "machine": data["machine"]}
    for task, systems in data["per_1k_steps"].items():
        sb3 = systems["sb3"]["cpu_s"]
        out[task] = {system: {"cpu_s_per_1k_steps": row["cpu_s"], "vs_sb3": round(row["cpu_s"] / sb3, 3)}
                     for system, row in systems.items()}
    return out


def key_figures(results: dict[str, Any], labels: list[str]) -> dict[str, str]:
    """Files to the loss (LM, env in-process), lines and duplicate pairs, label by label."""
    def files(r: dict[str, Any], path: str) -> Any:
        return r.get("loss_path", {}).get(path, {}).get("files")
    figures = {"files to the loss, LM PPO": [files(results[k], "lm_ppo") for k in labels],
               "files to the loss, env PPO": [files(results[k], "env_ppo_in_process") for k in labels],
               "lines trainer/ + config/": [results[k].get("lines", {}).get("total") for k in labels],
               "duplicate pairs": [results[k].get("duplicates") for k in labels]}
    return {f"{name} ({' / '.join(labels)})": " / ".join(str(v) for v in values) for name, values in figures.items()}


def table(results: dict[str, Any]) -> str:
    labels = [k for k, v in results.items() if isinstance(v, dict) and "tree" in v]
    rows = [("files hybridflow train -> loss (LM PPO)", lambda r: r.get("loss_path", {}).get("lm_ppo", {}).get("files")),
            ("files ... (env PPO in-process)", lambda r: r.get("loss_path", {}).get("env_ppo_in_process", {}).get("files")),
            ("files ... (env PPO, Ray learner)", lambda r: r.get("loss_path", {}).get("env_ppo_ray", {}).get("files")),
            ("lines trainer/ + config/", lambda r: r.get("lines", {}).get("total")),
            ("duplicates pairs", lambda r: r.get("duplicates")),
            ("config error s (torch-free / +programs)", lambda r: "{torch_free} / {after_programs_import}".format(
                **r["config_error_s"]) if "config_error_s" in r else None),
            ("suite minutes (fast, slow)", lambda r: r.get("suite_minutes"))]
    for system in sorted({s for r in results.values() if isinstance(r, dict)
                          for s in r.get("sb3", {}).get("ppo_cartpole", {})}):
        rows.append((f"CPU s/1k steps {system}", lambda r, s=system: _cpu(r, s)))
    width = max(len(name) for name, _ in rows)
    lines = [f"{'':{width}}  " + "  ".join(f"{label:>22}" for label in labels)]
    for name, get in rows:
        lines.append(f"{name:{width}}  " + "  ".join(f"{str(get(results[label])):>22}" for label in labels))
    return "\n".join(lines)


def _cpu(result: dict[str, Any], system: str) -> str | None:
    row = result.get("sb3", {}).get("ppo_cartpole", {}).get(system)
    return None if row is None else f"{row['cpu_s_per_1k_steps']:.3f} ({row['vs_sb3']:.2f}x)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label")
    parser.add_argument("--tree", default=str(HERE.parents[1]))
    parser.add_argument("--paths", default=",".join(PATHS), help="which loss paths to trace")
    parser.add_argument("--sb3", default=None, help="a bench_vs_sb3.py --steps JSON to take the CPU figures from")
    parser.add_argument("--suite", default=None, help="CI suite minutes, e.g. fast=15.8,slow=26.6")
    parser.add_argument("--suite-note", default=None)
    parser.add_argument("--skip", default="", help="comma list of: paths, lines, duplicates, config_error")
    parser.add_argument("--table", action="store_true", help="only print the saved results")
    args = parser.parse_args()
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    if not args.table:
        tree, skip = Path(args.tree).resolve(), set(args.skip.split(","))
        if skip - {""}:
            entry = results.setdefault(args.label, {})  # --skip keeps the label's figures for what it skips
        else:
            entry = results[args.label] = {}  # a full measurement replaces the label
        entry.update(tree=str(tree), machine=machine())
        entry.update(command=command_line(), date=stamp({})["date"])  # each label is its own invocation
        for name in args.paths.split(",") if "paths" not in skip else []:
            entry.setdefault("loss_path", {})[name] = loss_path(tree, name)
            RESULTS.write_text(json.dumps(results, indent=1) + "\n")  # each path as soon as it is traced
        if "lines" not in skip:
            entry["lines"] = trainer_config_lines(tree)
        if "duplicates" not in skip:
            entry["duplicates"] = duplicate_pairs(tree)
        if "config_error" not in skip:
            entry["config_error_s"] = config_error_seconds(tree)
        if args.sb3:
            entry["sb3"] = sb3_figures(Path(args.sb3))
        if args.suite:
            entry["suite_minutes"] = {k: float(v) for k, v in (part.split("=") for part in args.suite.split(","))}
            entry["suite_note"] = args.suite_note
        labels = [k for k, v in results.items() if isinstance(v, dict) and "tree" in v]
        results["command"] = " ; ".join(results[k].get("command", f"({k}: not recorded)") for k in labels)
        results["date"], results["machine"] = entry["date"], entry["machine"]
        results.pop("provenance_note", None)
        results["key_figures"] = key_figures(results, labels)
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
