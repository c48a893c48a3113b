"""The training prompts' loader of a run: seeded shuffles, or easy prompts first
(data.curriculum, hybridflow/data/curriculum.py) by a column of the rows or by the
policy's own pass rate, measured once before the first RL step.

    loader = train_loader(cfg, data, difficulty(cfg, data, run_dir, measure))
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hybridflow.config import ConfigError
from hybridflow.config.schema import RunConfig
from hybridflow.config.sections.trainer import ValidationSection
from hybridflow.data import ResumableLoader
from hybridflow.data.curriculum import CurriculumLoader
from hybridflow.data.records import rows_from
from hybridflow.data.rl_dataset import RLPromptDataset
from hybridflow.protocol import DataProto

PASS_RATES_FILE = "curriculum_pass_rates.json"
# Scores the sampled responses to a batch of prompts: one bool per response, a prompt's n in a row.
Measure = Callable[[DataProto, ValidationSection], list[bool]]


def train_loader(cfg: RunConfig, data: RLPromptDataset, difficulty: np.ndarray | None) -> ResumableLoader:
    """Batches of data.train_batch_size prompts: paced easy to hard with a `difficulty` per prompt."""
    d = cfg.data
    if difficulty is None:
        return ResumableLoader(data, d.train_batch_size, shuffle=d.shuffle, seed=cfg.seed, collate_fn=data.collate)
    return CurriculumLoader(data, d.train_batch_size, difficulty, seed=cfg.seed, start_fraction=d.curriculum.start_fraction,
                            ramp_batches=d.curriculum.ramp_steps, shuffle=d.shuffle, collate_fn=data.collate)


def difficulty(cfg: RunConfig, data: RLPromptDataset, run_dir: Path, measure: Measure,
               say: Callable[[str], None]) -> np.ndarray | None:
    """One difficulty per training prompt (lower is easier) as data.curriculum.by says; None when off."""
    by = cfg.data.curriculum.by
    if by is None:
        return None
    if by == "column":
        return column_difficulty(cfg, data)
    return pass_rate_difficulty(cfg, data, run_dir, measure, say)


def column_difficulty(cfg: RunConfig, data: RLPromptDataset) -> np.ndarray:
    """Each kept training row's data.curriculum.column (top level, else in extra_info)."""
    column, key = cfg.data.curriculum.column, "data.curriculum.column"
    if not cfg.data.train_files:
        raise ConfigError("reads a column of data.train_files, and the built-in task has none: set data.train_files "
                          "or data.curriculum.by=pass_rate", key)
    rows = rows_from(cfg.data.train_files, None, cfg.data.prompt.max_samples)
    values = []
    for record in data.records:  # record.index: the row's place before overlong prompts were dropped
        row = rows[record.index]
        value = row.get(column, (row.get("extra_info") or {}).get(column))
        try:
            values.append(float(value))
        except (TypeError, ValueError):
            raise ConfigError(f"training row {record.index} has {column}={value!r}, not a number (lower is easier); "
                              "give every row one, or name another column", key) from None
    return np.asarray(values)


def pass_rate_difficulty(cfg: RunConfig, data: RLPromptDataset, run_dir: Path, measure: Measure,
                         say: Callable[[str], None]) -> np.ndarray:
    """1 - the measured pass rate of a seeded choice of pass_rate_prompts training prompts
    (2 for the others: after them), measured once and kept in <run>/PASS_RATES_FILE."""
    c, path = cfg.data.curriculum, run_dir / PASS_RATES_FILE
    if path.is_file():  # a resumed run: the order it started with
        saved = json.loads(path.read_text())
        rates = dict(zip(saved["rows"], saved["pass_rates"]))
    else:
        chosen = np.sort(np.random.default_rng(cfg.seed).permutation(len(data))[:c.pass_rate_prompts])
        r = cfg.rollout
        sampling = ValidationSection(do_sample=True, n=c.pass_rate_samples, temperature=r.temperature, top_p=r.top_p,
                                     top_k=r.top_k, seed=cfg.seed)
        start = time.perf_counter()
        correct = np.asarray(measure(data.collate([data[int(i)] for i in chosen]), sampling), dtype=np.float64)
        per_prompt = correct.reshape(len(chosen), c.pass_rate_samples).mean(1)
        seconds = time.perf_counter() - start
        rows = [data.records[int(i)].index for i in chosen]
        path.write_text(json.dumps({"rows": rows, "pass_rates": per_prompt.tolist(), "samples": c.pass_rate_samples,
                                    "seconds": round(seconds, 1)}) + "\n")
        say(f"curriculum: pass rate of {len(chosen)} training prompts x {c.pass_rate_samples} samples, measured in "
            f"{seconds:.0f} s: mean {per_prompt.mean():.3f}, {int((per_prompt > 0).sum())} prompts with a right "
            f"answer; the easiest first ({path})")
        rates = dict(zip(rows, per_prompt.tolist()))
    return np.asarray([1.0 - rates[record.index] if record.index in rates else 2.0 for record in data.records])
