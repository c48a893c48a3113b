"""`hybridflow rm` end to end (Ray, 2 ranks, the built-in tiny model) on a synthetic
preference set whose chosen replies end in ":)" and rejected ones in ":(": held-out
pairwise accuracy must end far above chance, also when a rank is killed mid-run (the job
restarts from its newest checkpoint: the one lifecycle of trainer/task.py), and the exported
reward model must load with transformers and score the held-out pairs as the workers did
(1e-4 abs, fp32)."""

from __future__ import annotations

import json
import random

import pytest
import torch
import transformers

from trainer_helpers import profile_in_background

from hybridflow.cli import main
from hybridflow.data import PairwiseDataConfig, PairwiseDataset, make_builtin_model_dir
from hybridflow.engines.models import load_model
from hybridflow.trainer.jobs.rm import init_reward_model_dir
from hybridflow.trainer.observe.live_status import read_timeline
from hybridflow.trainer.observe.monitor import attach
from hybridflow.trainer.run.run_dir import read_metrics

TINY = ["resources.world_size=2", "model.builtin.hidden_size=32", "model.builtin.intermediate_size=64",
        "model.builtin.num_hidden_layers=2", "model.builtin.max_position_embeddings=64", "rm.data.pairs.max_length=64",
        "rm.data.batch_size=16", "rm.engine.micro_batch.mini_batch_size=16",
        "rm.engine.micro_batch.micro_batch_size_per_device=4", "rm.engine.optim.lr=1e-3"]


def _write_pairs(path, n: int, seed: int) -> None:
    rng = random.Random(seed)

    def word() -> str:
        return "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 5)))

    with path.open("w") as handle:
        for _ in range(n):
            row = {"prompt": [{"role": "user", "content": word()}], "chosen": word() + " :)",
                   "rejected": word() + " :("}
            handle.write(json.dumps(row) + "\n")


@pytest.fixture
def pair_files(tmp_path):
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    _write_pairs(train, 160, seed=0)
    _write_pairs(val, 32, seed=1)
    return train, val


@pytest.mark.slow  # ~60 s on 2 cores: 20 steps, 3 evaluations and a restart on 2 Ray ranks
def test_rm_command_learns_the_preference_and_exports_a_hf_reward_model(ray_local, tmp_path, pair_files, capsys,
                                                                        monkeypatch):
    train, val = pair_files
    run = tmp_path / "run"
    # Rank 0 is killed in its 12th update; the job goes on from its checkpoint of step 10.
    monkeypatch.setenv("HYBRIDFLOW_FAULT", f"kill:rm.update_reward_model:0:12:{tmp_path / 'fired'}")
    argv = ["rm", *TINY, f"rm.data.train_files=[{train}]", f"rm.data.val_files=[{val}]", f"trainer.run_dir={run}",
            "rm.epochs=2", "rm.eval_freq=10", "trainer.save_freq=5", "trainer.console=plain", "seed=0",
            # fp32 so the worker's saved scores compare with HF's fp32 forward at 1e-4 (dtype auto
            # is bf16 on CPUs with AVX512_BF16, where scores round to 8 bits of mantissa)
            "rm.engine.dtype=fp32"]
    profile = profile_in_background(lambda: run, tmp_path / "profile")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "train pairs: 160 of 160 pairs kept" in out and "held-out pairwise accuracy" in out
    # `hybridflow monitor` watches the job's ranks, `plot` draws its loss and accuracies, and
    # `eval` (it samples responses of a policy) refuses it, saying where its accuracy is.
    assert set(profile()["phases"]) <= {"update_reward_model", "save_checkpoint"}
    assert sorted(w.label for w in attach(run)) == ["rm/0", "rm/1"]
    assert "update_reward_model" in {e["phase"] for e in read_timeline(run)}
    assert main(["plot", str(run), "--out", str(tmp_path / "plots")]) == 0
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["rm_accuracy.png", "rm_loss.png", "rm_margin.png"]
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    assert "is a run of task kind 'reward_model'; eval and export take language-model runs and models (its " \
           "held-out pairwise accuracy is in its metrics.jsonl" in capsys.readouterr().err

    records = read_metrics(run / "metrics.jsonl")
    evals = [r for r in records if r["phase"] == "rm_eval"]
    steps = [r for r in records if r["phase"] == "rm"]
    restarts = [r for r in records if r["phase"] == "restart"]
    assert [(r["restart/role"], r["restart/failed_step"], r["restart/resumed_step"]) for r in restarts] == [
        ("rm", 12, 10)]
    assert [r["step"] for r in evals] == [0, 10, 20] and [r["step"] for r in steps] == list(range(1, 21))
    assert all(r["val/pairs"] == 32 for r in evals)
    assert evals[-1]["val/accuracy"] >= 0.9 > evals[0]["val/accuracy"]
    assert steps[-1]["rm/loss"] < steps[0]["rm/loss"]

    model_dir = run / "reward_model"
    assert f"reward_model.path={model_dir}" in out
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    assert hf.config.num_labels == 1 and type(hf).__name__ == "LlamaForSequenceClassification"
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    ds = PairwiseDataset(val, tokenizer, PairwiseDataConfig(max_length=64))
    worker_scores = [json.loads(line) for line in (run / "held_out_scores.jsonl").read_text().splitlines()]
    assert [s["index"] for s in worker_scores] == list(range(32))
    with torch.no_grad():
        for i, saved in enumerate(worker_scores):
            for side in ("chosen", "rejected"):
                # Hugging Face's own forward: it pools at the last token that is not pad_token_id
                score = hf(input_ids=torch.tensor([ds[i][f"{side}_ids"]])).logits[0, 0].item()
                assert abs(score - saved[f"{side}_score"]) < 1e-4, (i, side)
    load_model(model_dir, "reward")  # what a PPO run's reward-model worker loads


def test_init_from_a_causal_lm_adds_a_score_head_and_keeps_a_reward_model(tmp_path):
    lm = make_builtin_model_dir(tmp_path / "lm", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                max_position_embeddings=64)
    rm_dir = init_reward_model_dir(lm, tmp_path / "rm", seed=0, trust_remote_code=False)
    assert rm_dir == tmp_path / "rm"
    rm = transformers.AutoModelForSequenceClassification.from_pretrained(rm_dir)
    causal = transformers.AutoModelForCausalLM.from_pretrained(lm)
    assert rm.config.num_labels == 1 and rm.config.pad_token_id == 0
    assert torch.equal(rm.model.embed_tokens.weight, causal.model.embed_tokens.weight)  # the backbone is kept
    assert transformers.AutoTokenizer.from_pretrained(rm_dir).chat_template is not None
    # the same seed gives the same head; an existing reward model is trained as it is
    again = transformers.AutoModelForSequenceClassification.from_pretrained(
        init_reward_model_dir(lm, tmp_path / "rm2", seed=0, trust_remote_code=False))
    assert torch.equal(rm.score.weight, again.score.weight)
    assert init_reward_model_dir(rm_dir, tmp_path / "unused", seed=1, trust_remote_code=False) == rm_dir
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize("extra, message", [
    ([], "rm.data.train_files: is empty"),
    (["rm.data.train_files=[x.jsonl]", "rm.data.batch_size=24"],
     "not a multiple of rm.engine.micro_batch.mini_batch_size"),
    (["rm.data.train_files=[x.jsonl]", "rm.engine.param_offload=true"], "param_offload"),
    (["rm.data.train_files=[x.jsonl]", "rm.data.pairs.max_length=100"], "max_position_embeddings=64"),
    (["rm.data.train_files=[x.jsonl]", "rm.data.val_fraction=0"], "rm.data.val_fraction: must be in (0, 1)"),
    (["rm.data.train_files=[x.jsonl]", "rm.engine.lora.rank=4"], "lora"),
    (["rm.data.train_files=[x.jsonl]", "actor.optim.lr=1"], "actor: is a key of 'language_model' configs"),
])
def test_config_errors_exit_2_before_anything_starts(tmp_path, capsys, extra, message):
    assert main(["rm", *TINY, f"trainer.output_dir={tmp_path}", *extra]) == 2  # later overrides win
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_print_config_shows_every_key_and_the_earlier_keys_still_work(capsys, tmp_path):
    import yaml

    # data.* is the earlier reward-model tree's key: it moves to rm.data.*, said in one line.
    assert main(["rm", "--print-config", "data.train_files=[a.parquet]", f"trainer.output_dir={tmp_path}"]) == 0
    captured = capsys.readouterr()
    tree = yaml.safe_load(captured.out)
    assert tree["rm"]["data"]["train_files"] == ["a.parquet"]
    assert tree["model"]["builtin"]["max_position_embeddings"] == 512 and tree["rm"]["engine"]["optim"]["lr"] == 1e-5
    assert "actor" not in tree and "algorithm" not in tree  # the keys of other kinds are left out
    assert "hybridflow: data is now rm.data (reward-model runs); the old key still works" in captured.err
    assert not any(tmp_path.iterdir())
