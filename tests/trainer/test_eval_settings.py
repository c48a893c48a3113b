"""`hybridflow eval` of a model directory (issue 26): settings from the directory's saved
presets and the command line, never the built-in demo's; the settings printed; --show and
--output with every response; a saved model carries its presets to a later run."""

from __future__ import annotations

import json
import shutil

import pytest

from hybridflow.cli import main as cli_main
from hybridflow.config import ConfigError
from hybridflow.config.model_presets import MODEL_PRESETS_FILE, read_model_presets, write_model_presets
from hybridflow.config.schema import load_run_config
from hybridflow.config.sections.model import BuiltinModelSection
from hybridflow.data import write_records
from hybridflow.data.arithmetic import ArithmeticConfig, rl_records
from hybridflow.data.configs import PromptDataConfig
from hybridflow.trainer.run.lifecycle import write_builtin_model
from hybridflow.trainer.observe.live_status import read_timeline
from hybridflow.trainer.observe.monitor import attach
from hybridflow.trainer.run.run_dir import read_metrics
from hybridflow.trainer.jobs.offline import resolve_source, settings_lines
from hybridflow.workers.config import RolloutWorkerConfig
from trainer_helpers import profile_in_background

TINY_MODEL = BuiltinModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_builtin_model(TINY_MODEL, tmp_path_factory.mktemp("m") / "model", seed=0)


@pytest.fixture
def bare_dir(tmp_path):
    """A complete model directory with no saved settings (eval's pre-flight reads it whole)."""
    from hybridflow.data.tokenizer import save_char_tokenizer
    from hybridflow.engines.models import save_tiny_model

    save_tiny_model(tmp_path, "llama")
    save_char_tokenizer(tmp_path)
    return tmp_path


def test_a_model_directory_gets_the_defaults_not_the_demo_and_says_so(bare_dir):
    source = resolve_source(bare_dir)
    assert source.cfg.rollout.response_length == RolloutWorkerConfig().response_length != 6
    assert source.cfg.data.prompt.max_prompt_length == PromptDataConfig().max_prompt_length != 32
    text = "\n".join(settings_lines(source))
    assert "defaults (the model directory has no saved settings)" in text
    for key in ("data.prompt.max_prompt_length", "rollout.response_length", "rollout.dtype", "trainer.validation"):
        assert key in text
    assert "greedy" in text and f"responses up to {RolloutWorkerConfig().response_length} tokens" in text


def test_saved_presets_fill_what_the_command_line_does_not_set(bare_dir):
    cfg = load_run_config(None, [])  # the demo: fp32 tiny model, 32-token prompts, 6-token answers
    write_model_presets(bare_dir, cfg, "a test")
    source = resolve_source(bare_dir, ["rollout.response_length=9"])
    assert source.cfg.rollout.response_length == 9  # the flag wins
    assert source.cfg.data.prompt.max_prompt_length == 32 and source.cfg.rollout.dtype == "fp32"
    assert MODEL_PRESETS_FILE in source.settings_from and "command line" in source.settings_from


def test_a_run_started_from_a_saved_model_keeps_its_presets(bare_dir):
    """model.path=<run>/sft_model of the built-in demo: fp32 as the run that wrote it (it was
    dropped before: the presets lived only in schema.py)."""
    write_model_presets(bare_dir, load_run_config(None, []), "a test")
    cfg = load_run_config(None, [f"model.path={bare_dir}", "actor.dtype=bf16"])
    assert (cfg.actor.dtype, cfg.rollout.dtype, cfg.critic.dtype) == ("bf16", "fp32", "fp32")
    assert dict(read_model_presets(bare_dir))["rollout.response_length"] == 6


def test_a_damaged_presets_file_names_model_path(bare_dir):
    (bare_dir / MODEL_PRESETS_FILE).write_text('{"presets": {"actor.optim.lr": 1}}')
    with pytest.raises(ConfigError, match=r"^model\.path: .*actor\.optim\.lr"):
        load_run_config(None, [f"model.path={bare_dir}"])


def test_eval_of_a_model_directory_shows_and_saves_every_response(ray_local, model_dir, tmp_path, capsys):
    write_model_presets(model_dir, load_run_config(None, []), "a test")
    data = write_records(rl_records(ArithmeticConfig(), "test", 5), tmp_path / "val.jsonl")
    out = tmp_path / "report.json"
    args = ["eval", str(model_dir), "--data", str(data), "--show", "2", "--output", str(out),
            "resources.world_size=1", "rollout.response_length=4"]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert f"settings from {model_dir / MODEL_PRESETS_FILE}" in printed
    assert "responses up to 4 tokens (rollout.response_length)" in printed and "greedy" in printed
    assert printed.count("--- response ") == 2 and "ground truth:" in printed
    assert "tokens on average" in printed and "cut at rollout.response_length=4" in printed
    report = json.loads(out.read_text())
    assert len(report["responses"]) == 5 and report["settings"]["rollout.response_length"] == 4
    first = report["responses"][0]
    assert {"prompt", "response", "ground_truth", "score", "correct", "length", "finish_reason"} <= set(first)
    scores = [r["score"] for r in report["responses"]]
    assert report["metrics"]["val/accuracy"] == pytest.approx(sum(s >= 1 for s in scores) / 5)
    assert all(1 <= r["length"] <= 4 for r in report["responses"])
    assert report["metrics"]["val/response_length"] == pytest.approx(sum(r["length"] for r in report["responses"]) / 5)


def test_agent_batches_report_tool_call_rate_and_turns_in_validation():
    import numpy as np

    from hybridflow.trainer.observe.display import eval_summary
    from hybridflow.trainer.lm.evaluate import agent_metrics

    assert agent_metrics({"data_source": np.array(["a"])}) == {}  # single-turn: no agent numbers
    metrics = agent_metrics({"num_tool_calls": np.array([0, 2, 1, 0], dtype=object),
                             "num_turns": np.array([1, 3, 2, 1], dtype=object)})
    assert metrics == {"val/tool_call_rate": 0.5, "val/num_tool_calls_mean": 0.75, "val/num_turns_mean": 1.75}
    line = eval_summary({"val/accuracy": 0.25, "val/score": 0.25, "val/samples": 4.0, **metrics})
    assert "tool-call rate 50.0% (0.75 calls, 1.75 turns each)" in line


def test_sft_on_conversations_restarts_and_saves_a_model_that_carries_its_presets(ray_local, tiny_config, tmp_path,
                                                                                   monkeypatch):
    """`sft.files` with a messages column trains (finite loss), restarts from its checkpoint
    when its worker is killed (the one lifecycle, trainer/task.py), and its sft_model carries
    the run's presets: a later run with model.path there computes in fp32 like the built-in model."""
    from hybridflow.trainer.jobs.sft import run_sft_job

    rows = [{"messages": [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": f"@add[{a},{b}]"},
                          {"role": "user", "content": f"{a + b:03d}"}, {"role": "assistant", "content": f"{a + b:03d}"}]}
            for a, b in ((12, 34), (56, 7), (40, 41), (9, 90))]
    data = write_records(rows, tmp_path / "conversations.jsonl")
    cfg = tiny_config("resources.world_size=1", f"sft.files=[{data}]", "sft.steps=3", "sft.batch_size=4",
                      "sft.micro_batch_size_per_device=2", "trainer.save_freq=2")
    monkeypatch.setenv("HYBRIDFLOW_FAULT", f"kill:actor.update_actor:0:3:{tmp_path / 'fired'}")  # in step 3
    result = run_sft_job(cfg)
    assert result.final_loss == result.final_loss and result.final_loss > 0  # finite
    records = read_metrics(result.model_dir.parent / "metrics.jsonl")
    assert [(r["restart/failed_step"], r["restart/resumed_step"]) for r in records if r["phase"] == "restart"] == [
        (3, 2)]
    assert [r["step"] for r in records if r["phase"] == "sft"] == [1, 2, 3]
    assert (result.model_dir / MODEL_PRESETS_FILE).is_file()
    later = load_run_config(None, [f"model.path={result.model_dir}"])
    assert (later.actor.dtype, later.rollout.dtype) == ("fp32", "fp32")
    assert later.data.prompt.max_prompt_length == cfg.data.prompt.max_prompt_length


def test_eval_of_an_agent_task_reports_tool_calls_and_turns(ray_local, tmp_path, capsys):
    """Rows that name the tools environment, rolled out by the agent loop: the report has
    the tool-call rate and turns (overall and per response), whatever the model does."""
    from hybridflow.envs.agent.calculator_task import rl_rows

    model = write_builtin_model(BuiltinModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                    max_position_embeddings=128), tmp_path / "model", seed=0)
    data = write_records(rl_rows("test", 4), tmp_path / "agent.jsonl")
    out = tmp_path / "report.json"
    args = ["eval", str(model), "--data", str(data), "--output", str(out), "resources.world_size=1",
            "rollout.agent.enable=true", "rollout.agent.max_turns=2", "rollout.response_length=24",
            "data.prompt.max_prompt_length=24", "actor.dtype=fp32", "rollout.dtype=fp32"]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert "agent loop on (rollout.agent.enable)" in printed and "agent: tool-call rate" in printed
    report = json.loads(out.read_text())
    metrics = report["metrics"]
    assert {"val/tool_call_rate", "val/num_tool_calls_mean", "val/num_turns_mean"} <= set(metrics)
    calls = [r["num_tool_calls"] for r in report["responses"]]
    assert metrics["val/tool_call_rate"] == pytest.approx(sum(c > 0 for c in calls) / len(calls))
    assert all(r["num_turns"] >= 1 for r in report["responses"])


def test_sft_logs_held_out_accuracy_at_test_freq_and_before_and_after(ray_local, tiny_config, tmp_path, capsys):
    """`hybridflow sft` (jobs/sft.py: train_steps): held-out accuracy before and after as
    "sft_eval", and at every sft.test_freq steps but the last inside the step's timed "sft" record;
    `hybridflow monitor` watches the job's actor and `hybridflow plot` draws its loss and accuracy."""
    from hybridflow.trainer.jobs.sft import run_sft_job

    run_dir = tmp_path / "sft"
    profile = profile_in_background(lambda: run_dir, tmp_path / "profile")
    result = run_sft_job(tiny_config("resources.world_size=1", "sft.steps=3", "sft.test_freq=2", "sft.batch_size=4",
                                     "sft.micro_batch_size_per_device=2", "trainer.console=plain",
                                     f"trainer.run_dir={run_dir}"))
    assert set(profile()["phases"]) <= {"update_actor"} and [w.label for w in attach(run_dir)] == ["actor/0"]
    assert {e["phase"] for e in read_timeline(run_dir) if e["state"] == "training"} == {"update_actor"}
    capsys.readouterr()
    assert cli_main(["plot", str(run_dir), "--out", str(tmp_path / "plots")]) == 0
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "sft_grad_norm.png", "sft_loss.png", "sft_val_accuracy.png"]
    records = read_metrics(result.model_dir.parent / "metrics.jsonl")
    assert [(r["phase"], r["step"]) for r in records] == [("sft_eval", 0), ("sft", 1), ("sft", 2), ("sft", 3),
                                                          ("sft_eval", 3)]
    steps = [r for r in records if r["phase"] == "sft"]
    assert ["val/accuracy" in r for r in steps] == [False, True, False]
    assert all({"sft/loss", "sft/grad_norm", "sft/lr", "timing_s/step"} <= set(r) for r in steps)
    assert result.final_loss == steps[-1]["sft/loss"] and result.accuracy_before == records[0]["val/accuracy"]


def test_eval_of_an_sft_job_scores_its_newest_checkpoint_as_the_job_did(ray_local, tiny_config, tmp_path):
    """`hybridflow eval` of a `hybridflow sft` run (offline.py: POLICY_RUNS): its newest
    checkpoint's actor on the base model scores the held-out prompts exactly as the job's own
    last evaluation did; without checkpoints it is the job's sft_model, and an RL run's warm-start
    sft_model is never taken for the RL policy."""
    from hybridflow.trainer.jobs.sft import run_sft_job
    from hybridflow.trainer.run.checkpointing import CheckpointNotFoundError

    run_dir = tmp_path / "sft"
    run_sft_job(tiny_config("resources.world_size=1", "sft.steps=2", "sft.batch_size=4",
                            "sft.micro_batch_size_per_device=2", "trainer.save_freq=1", "trainer.console=none",
                            f"trainer.run_dir={run_dir}"))
    last = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "sft_eval"][-1]
    out = tmp_path / "report.json"
    assert cli_main(["eval", str(run_dir), "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["step"], report["model_path"]) == (2, str(run_dir / "model"))  # the base model, not sft_model
    assert report["metrics"] == {k: v for k, v in last.items() if k.startswith("val/")}
    shutil.rmtree(run_dir / "checkpoints")
    source = resolve_source(run_dir)
    assert (source.model_path, source.checkpoint) == (str(run_dir / "sft_model"), None)
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:  # as an RL run with a warm start logs
        f.write(json.dumps({"phase": "rl", "step": 1}) + "\n")
    with pytest.raises(CheckpointNotFoundError):
        resolve_source(run_dir)
