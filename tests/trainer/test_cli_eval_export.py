"""`hybridflow eval` and `hybridflow export` against the run that wrote the checkpoint.

One tiny GRPO run (Ray, 2 ranks, 2 steps) saves a checkpoint and its final model at
step 2 and evaluates greedily there. Scoring the checkpoint (and the exported final
model) with `hybridflow eval` must give exactly the run's numbers; `hybridflow export`
must write a model directory whose logits equal the checkpointed policy's (loaded from
the DCP checkpoint files directly) and the run's own final_model."""

from __future__ import annotations

import json

import pytest
import torch

from hybridflow import RLTrainer
from hybridflow.cli import main as cli_main
from hybridflow.trainer.run.run_dir import read_metrics
from validation_data import two_source_overrides

STEPS = 2


def _val(record: dict) -> dict:
    return {k: v for k, v in record.items() if k.startswith("val/")}


# ~100 s on 2 cores: one 2-step run, then three actor groups (eval x2, export) on 2 Ray ranks.
@pytest.mark.slow
def test_eval_and_export_reproduce_the_run(ray_local, tiny_config, tmp_path, capsys):
    # One run serves every check below (training is the expensive part).
    cfg = tiny_config(*two_source_overrides(tmp_path), f"trainer.save_freq={STEPS}", "trainer.save_final_model=true",
                      "trainer.val_before_train=false")
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=STEPS)
    evals = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [STEPS] and result.accuracy_before is None  # no evaluation at step 0
    final_eval = evals[-1]
    capsys.readouterr()
    _check_eval_of_the_checkpoint(result.run_dir, tmp_path, _val(final_eval), capsys)
    _check_eval_of_the_final_model(result.run_dir, tmp_path, _val(final_eval))
    _check_export(result.run_dir, tmp_path, capsys)


def _check_eval_of_the_checkpoint(run_dir, root, expected: dict, capsys) -> None:
    out = root / "report.json"
    checkpoint = run_dir / "checkpoints" / f"global_step_{STEPS}"
    # The run scored with its own reward file: used as saved only when confirmed (or named)
    assert cli_main(["eval", str(checkpoint), "--use-run-reward", "--data", str(root / "val.jsonl"),
                     "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["step"] == STEPS and report["sampling"]["do_sample"] is False
    assert report["metrics"] == expected
    table = capsys.readouterr().out
    assert "always_right" in table and "arithmetic" in table and "100.0%" in table
    assert "dtype: actor fp32, rollout fp32" in table  # the precision it scored in (the tiny model's preset)
    # The report is never overwritten.
    assert cli_main(["eval", str(run_dir), "--output", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and json.loads(out.read_text()) == report


def _check_eval_of_the_final_model(run_dir, root, expected: dict) -> None:
    out = root / "report_final_model.json"
    args = ["eval", str(run_dir / "final_model"), "resources.world_size=2", f"reward.custom_fn_path={root / 'reward.py'}",
            "--data", str(root / "val.jsonl"), "--output", str(out)]
    assert cli_main(args) == 0
    assert json.loads(out.read_text())["metrics"] == expected


def _logits(model_dir, input_ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        return model(input_ids).logits


def _checkpoint_policy_logits(run_dir, input_ids: torch.Tensor) -> torch.Tensor:
    """The reference: the actor weights read straight from the DCP checkpoint files into a
    model built from the run's starting model config."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoConfig, AutoModelForCausalLM

    flat = run_dir / "actor_flat.pt"
    dcp_to_torch_save(run_dir / "checkpoints" / f"global_step_{STEPS}" / "actor", flat)
    weights = torch.load(flat, weights_only=False)["model"]
    flat.unlink()
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(run_dir / "model"), torch_dtype=torch.float32)
    model.load_state_dict(weights, strict=not model.config.tie_word_embeddings)
    with torch.no_grad():
        return model.eval()(input_ids).logits


def _check_export(run_dir, root, capsys) -> None:
    out = root / "exported"
    assert cli_main(["export", str(run_dir), "--out", str(out)]) == 0
    input_ids = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(0))
    exported = _logits(out, input_ids)
    assert torch.equal(exported, _checkpoint_policy_logits(run_dir, input_ids))
    assert torch.equal(exported, _logits(run_dir / "final_model", input_ids))
    # A non-empty directory is refused and left as it was.
    before = sorted(p.name for p in out.iterdir())
    assert cli_main(["export", str(run_dir), "--out", str(out)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before


def test_eval_and_export_explain_a_path_that_is_not_a_run(tmp_path, capsys):
    assert cli_main(["eval", str(tmp_path), "--data", "x.jsonl"]) == 2
    assert "Hugging Face model directory" in capsys.readouterr().err
    assert cli_main(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
