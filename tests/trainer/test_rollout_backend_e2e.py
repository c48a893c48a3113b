"""`rollout.name=hf` end to end: a GRPO step on a tiny model with transformers `generate`
as the rollout backend, next to the same step with the native engine (Ray, 2 ranks, CPU).

The two runs share every seed. Greedy evaluation (before training) must score the same,
since greedy decoding is backend-independent; the sampled training step must not be
identical, since the backends draw from different random streams: equal `actor/entropy`
would mean the native engine generated both times and `rollout.name` was never read.
"""

from __future__ import annotations

import math

import pytest

from hybridflow import RLTrainer
from hybridflow.config import load_config
from hybridflow.config.schema import RunConfig
from hybridflow.trainer.run.run_dir import read_metrics
from trainer_helpers import assert_finite, rl_records


@pytest.fixture(scope="module")
def runs(ray_local, module_tiny_config) -> dict:
    """{backend: (run_dir, eval record at step 0, rl record of step 1)}."""
    out = {}
    for backend in ("native", "hf"):
        cfg = module_tiny_config(f"rollout.name={backend}")
        with RLTrainer(cfg) as trainer:
            result = trainer.train(steps=1)
        records = read_metrics(result.run_dir / "metrics.jsonl")
        first_eval = next(r for r in records if r["phase"] == "eval" and r["step"] == 0)
        out[backend] = (result.run_dir, first_eval, rl_records(result.run_dir)[0])
    return out


def test_hf_backend_trains_a_step(runs):
    run_dir, _, step = runs["hf"]
    assert step["step"] == 1
    assert_finite(step)
    assert step["response_length/mean"] > 0 and step["timing_s/gen"] > 0
    assert load_config(RunConfig, run_dir / "config.yaml").rollout.name == "hf"


def test_backends_agree_greedy_and_differ_sampled(runs):
    _, native_eval, native_step = runs["native"]
    _, hf_eval, hf_step = runs["hf"]
    val_keys = sorted(k for k in native_eval if k.startswith("val/"))
    assert val_keys and val_keys == sorted(k for k in hf_eval if k.startswith("val/"))
    for key in val_keys:
        assert math.isclose(native_eval[key], hf_eval[key], rel_tol=1e-6, abs_tol=1e-9), key
    assert native_step["actor/entropy"] != hf_step["actor/entropy"]
