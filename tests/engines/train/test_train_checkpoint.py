"""Sharded checkpoints (resume equality, crash safety) and Hugging Face export."""

from __future__ import annotations

import shutil
import signal
import time

import pytest
import torch
import transformers

import train_cases
from train_harness import run_ranks, start_ranks


def _model_with_tokenizer(src, dst):
    """Copy a tiny model and give it a small word-level tokenizer (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    shutil.copytree(src, dst)
    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3, "hello": 4, "world": 5}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    fast.save_pretrained(dst)
    return dst


def test_resume_equals_uninterrupted_run_and_export_reloads(tiny_llama_dir, tmp_path):
    model = _model_with_tokenizer(tiny_llama_dir, tmp_path / "model")
    results = run_ranks(train_cases.checkpoint_resume_and_export, 2, str(model),
                        str(tmp_path / "ckpt"), str(tmp_path / "export"))
    for res in results:
        assert res["saved"] == res["loaded"] == res["latest"] == str(tmp_path / "ckpt" / "global_step_1")
        assert res["step_after_load"] == 1
        assert res["param_diff"] == 0.0  # deterministic replay: bitwise equal
        assert res["loss"][0] == res["loss"][1] and res["lr"][0] == res["lr"][1]
        assert res["moved"] > 1e-4  # the run did train
    assert results[0]["export_log_prob"] < 1e-5
    assert results[0]["tokenizer_ids"] == [4, 5]
    exported = sorted(p.name for p in (tmp_path / "export").iterdir())
    assert "model.safetensors" in exported and "config.json" in exported and "tokenizer.json" in exported


@pytest.mark.usefixtures("single_process_group")
def test_killed_save_leaves_a_loadable_checkpoint(tiny_llama_dir, tmp_path):
    from hybridflow.engines.train import ActorEngine, TrainEngineConfig
    from hybridflow.engines.train.checkpoint import LATEST_FILE, latest_checkpoint, load_checkpoint

    root = tmp_path / "ckpt"
    procs, _results = start_ranks(train_cases.save_forever, 1, str(tiny_llama_dir), str(root))
    pointer = root / LATEST_FILE
    # Kill it in the middle of its saves: once a few complete checkpoints exist, SIGKILL.
    deadline = time.monotonic() + 300
    while not (pointer.is_file() and int(pointer.read_text() or 0) >= 3):
        assert procs[0].is_alive() and time.monotonic() < deadline, "saver died or made no progress"
        time.sleep(0.05)
    procs[0].kill()
    procs[0].join()
    assert procs[0].exitcode == -signal.SIGKILL

    latest = latest_checkpoint(root)
    assert latest is not None and latest.name == f"global_step_{int(pointer.read_text())}"
    engine = ActorEngine(TrainEngineConfig(model_path=str(tiny_llama_dir), dtype="fp32"))
    assert load_checkpoint(engine, root) == latest
    assert engine.global_step == int(pointer.read_text())
    # A half-written directory from the crash (if the kill landed mid-save) is never picked up.
    for partial in root.glob(".tmp-*"):
        assert partial.name != latest.name
    # keep_last=2 pruned older steps (a kill between prune steps may leave one more).
    assert len(list(root.glob("global_step_*"))) <= 3


@pytest.mark.usefixtures("single_process_group")
def test_missing_checkpoint_gives_clear_error(tiny_llama_dir, tmp_path):
    from hybridflow.engines.train import ActorEngine, TrainEngineConfig
    from hybridflow.engines.train.checkpoint import load_checkpoint

    engine = ActorEngine(TrainEngineConfig(model_path=str(tiny_llama_dir), dtype="fp32"))
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        load_checkpoint(engine, tmp_path)


@pytest.mark.usefixtures("single_process_group")
def test_critic_export_reloads_as_token_classifier(tiny_llama_dir, tmp_path):
    from hybridflow.engines.train import CriticEngine, TrainEngineConfig
    from hybridflow.engines.train.export import export_hf
    from train_harness import make_rl_batch

    engine = CriticEngine(TrainEngineConfig(model_path=str(tiny_llama_dir), dtype="fp32"))
    batch = make_rl_batch(3, seed=4)
    values = engine.compute_values(batch)
    export_hf(engine, tmp_path / "critic")
    hf = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "critic")
    assert hf.config.num_labels == 1
    r = batch["responses"].shape[1]
    with torch.no_grad():
        hidden = hf.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          position_ids=batch["position_ids"]).last_hidden_state
        expected = hf.score(hidden)[..., 0][:, -r - 1 : -1]
    mask = batch["response_mask"].bool()
    assert (values - expected)[mask].abs().max() < 1e-5
