"""Bad input to `hybridflow train` ends in a short message and exit status 2, before a run
directory exists and before Ray starts (trainer/run/preflight.py, cli/__init__.py): YAML
syntax errors, an existing run_dir, broken reward files, broken model directories, broken
or too small data files, and data sources no scorer knows."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.cli import main
from hybridflow.data.records import write_records
from hybridflow.errors import ConfigError
from tests.processes import run_cli

ROWS = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"{i}+1="}],
         "reward_model": {"ground_truth": str(i + 1)}} for i in range(8)]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, Path]:
    """A complete tiny model directory (char tokenizer) and an 8-row prompt file."""
    from hybridflow.data import make_builtin_model_dir

    root = tmp_path_factory.mktemp("good")
    model = make_builtin_model_dir(root / "model")
    data = write_records(ROWS, root / "train.jsonl")
    return {"model": model, "data": data}


def argv(out: Path, model: Path, data: Path | str, *extra: str) -> list[str]:
    return ["train", f"trainer.output_dir={out}", f"model.path={model}", f"data.train_files=[{data}]",
            "data.train_batch_size=4", "rollout.n=2", "rollout.response_length=16", "sft.steps=0", *extra]


def refused(args: list[str], out: Path, capsys) -> str:
    """Run the command; assert exit 2, a short message and no run directory; the message."""
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert not out.exists() or not any(out.iterdir())
    return err


def test_good_inputs_pass_the_checks(good, tmp_path):
    from hybridflow.config.schema import load_run_config
    from hybridflow.trainer.run.preflight import preflight

    cfg = load_run_config(None, argv(tmp_path, good["model"], good["data"])[1:])
    preflight(cfg)  # no error: the negative cases below differ from this in one thing each


def test_yaml_syntax_errors_in_the_file_and_an_override(good, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  total_steps: 3\n bad: [1\n")
    out = tmp_path / "runs"
    err = refused(["train", "--config", str(bad), f"trainer.output_dir={out}"], out, capsys)
    assert "bad.yaml" in err and "not valid YAML" in err and "line 3" in err
    err = refused(argv(out, good["model"], good["data"], "trainer.total_steps=[1,"), out, capsys)
    assert "trainer.total_steps=[1," in err and "quote it" in err


def test_an_existing_run_dir_is_refused_and_kept(good, tmp_path, capsys):
    run_dir = tmp_path / "mine"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("keep me")
    err = refused(argv(tmp_path / "runs", good["model"], good["data"], f"trainer.run_dir={run_dir}"),
                  tmp_path / "runs", capsys)
    assert "trainer.run_dir" in err and "already exists" in err
    assert (run_dir / "notes.txt").read_text() == "keep me"
    assert "rm -r" not in err
    # A directory that holds only what a start writes (a start that failed outside `with`, or
    # was killed) is refused too, with how to start there again.
    (run_dir / "notes.txt").unlink()
    (run_dir / "config.yaml").write_text("name: x\n")
    (run_dir / "metrics.jsonl").write_text("")
    err = refused(argv(tmp_path / "runs", good["model"], good["data"], f"trainer.run_dir={run_dir}"),
                  tmp_path / "runs", capsys)
    assert f"no step ran): remove it (rm -r {run_dir})" in err and (run_dir / "config.yaml").is_file()


@pytest.mark.parametrize("source, message", [
    (None, "does not exist"),
    ("def compute_score(data_source, solution_str, ground_truth, extra_info=None)\n    return 1.0\n",
     "SyntaxError at line 1"),
    ("def compute_score(text):\n    return 1.0\n", "none of the shapes a reward function may have: "
     "compute_score(data_source, solution_str, ground_truth"),
    ("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n",
     "defines no 'compute_score'; functions there: ['score']"),
    ("import sys\nsys.exit(3)\n", "called exit(3) while being imported"),
])
def test_reward_file_problems_name_the_file(good, tmp_path, capsys, source, message):
    reward = tmp_path / "my_reward.py"
    if source is not None:
        reward.write_text(source)
    out = tmp_path / "runs"
    err = refused(argv(out, good["model"], good["data"], f"reward.custom_fn_path={reward}"), out, capsys)
    assert "reward.custom_fn_path" in err and "my_reward.py" in err and message in err


def _broken_model(good: dict, tmp_path: Path, how: str) -> Path:
    model = tmp_path / "model"
    shutil.copytree(good["model"], model)
    weights = model / "model.safetensors"
    if how == "corrupt_config":
        (model / "config.json").write_text('{"model_type": "llama", ')
    elif how == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) - 100])
    elif how == "no_weights":
        weights.unlink()
    elif how == "sizes":
        config = json.loads((model / "config.json").read_text())
        config["num_hidden_layers"] += 2
        (model / "config.json").write_text(json.dumps(config))
    elif how == "hidden":
        config = json.loads((model / "config.json").read_text())
        config["hidden_size"] *= 2
        (model / "config.json").write_text(json.dumps(config))
    elif how == "no_tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (model / name).unlink()
    elif how == "model_type":
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    elif how == "remote_code":
        plant_remote_code(model, tmp_path / "planted-code-ran")
    return model


def plant_remote_code(model: Path, marker: Path) -> None:
    """What the report found: config.json names an unknown model_type with code of its own
    (auto_map), whose import touches `marker`."""
    (model / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
                                   "from transformers import LlamaConfig\n"
                                   "class EvilConfig(LlamaConfig):\n    model_type = 'evil_llama'\n")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "evil_llama",
                                                   "auto_map": {"AutoConfig": "evil.EvilConfig"}}))


@pytest.mark.parametrize("how, message", [
    ("missing", "is not a directory"),
    ("corrupt_config", "config.json is not valid JSON"),
    ("truncated", "model.safetensors is truncated"),
    ("no_weights", "no weights"),
    ("sizes", "decoder layers but config.json says num_hidden_layers"),
    ("hidden", "config.json and the weights come from different models"),
    ("no_tokenizer", "has no tokenizer"),
    ("model_type", "model_type 'gpt2' is not supported; supported families: ["),
    ("remote_code", "names Python code of its own to run (config.json: auto_map ['evil.EvilConfig']); hybridflow "
                    "runs a model directory's code only with model.trust_remote_code=true"),
])
def test_model_directory_problems(good, tmp_path, capsys, how, message):
    model = tmp_path / "absent" if how == "missing" else _broken_model(good, tmp_path, how)
    out = tmp_path / "runs"
    err = refused(argv(out, model, good["data"]), out, capsys)
    assert "model.path" in err and message in err
    if how != "missing":  # eval and export of the same directory: the same check, before anything starts
        for command in (["eval", str(model), "--data", str(good["data"])],
                        ["export", str(model), "--out", str(tmp_path / "exported")]):
            err = refused(command, out, capsys)
            assert "model.path" in err and message in err and str(model) in err
    assert not (tmp_path / "planted-code-ran").exists()


@pytest.mark.parametrize("name, content, message", [
    ("absent.jsonl", None, "does not exist"),
    ("empty.jsonl", "", "hold no rows"),
    ("fake.parquet", "not parquet at all", "not a parquet file"),
    ("torn.jsonl", json.dumps(ROWS[0]) + '\n{"prompt": "1+1=", "data_s\n', "torn.jsonl:2: not valid JSON"),
    ("noprompt.jsonl", "".join(json.dumps({"question": "1+1=", "data_source": "arithmetic"}) + "\n"
                               for _ in range(8)),
     "has no 'prompt' column (columns: ['data_source', 'question']); set data.prompt.prompt_key"),
    ("ints.jsonl", "".join(json.dumps({"prompt": i, "data_source": "arithmetic"}) + "\n" for i in range(8)),
     "'prompt' must be a string or a list of chat messages, got int"),
    ("few.jsonl", "".join(json.dumps(row) + "\n" for row in ROWS[:3]),
     "3 usable prompt rows, fewer than one batch (data.train_batch_size=4); set data.train_batch_size to at most 3"),
    ("unknown.jsonl", "".join(json.dumps({**row, "data_source": "my_task"}) + "\n" for row in ROWS),
     "no scorer for data_source 'my_task' (8 rows)"),
])
def test_data_file_problems(good, tmp_path, capsys, name, content, message):
    data = tmp_path / name
    if content is not None:
        data.write_text(content)
    out = tmp_path / "runs"
    err = refused(argv(out, good["model"], data), out, capsys)
    assert "data.train" in err and message in err


def test_debug_shows_the_traceback(good, tmp_path):
    from hybridflow.errors import ConfigError

    with pytest.raises(ConfigError, match="does not exist"):
        main(argv(tmp_path / "runs", good["model"], tmp_path / "absent.jsonl", "--debug"))
    with pytest.raises(ConfigError, match="does not exist"):
        main(["--debug", *argv(tmp_path / "runs", good["model"], tmp_path / "absent.jsonl")])


def test_a_start_that_fails_after_the_run_dir_was_made_removes_it(good, tmp_path, capsys):
    # A tokenizer.json that passes the file checks but does not load fails inside the start.
    model = tmp_path / "model"
    shutil.copytree(good["model"], model)
    (model / "tokenizer.json").write_text("{}")
    out = tmp_path / "runs"
    err = refused(argv(out, model, good["data"]), out, capsys)
    assert "could not load a tokenizer" in err


def test_eval_refuses_data_sources_no_scorer_knows(good, tmp_path, capsys):
    data = write_records([{**row, "data_source": "my_task"} for row in ROWS], tmp_path / "test.jsonl")
    assert main(["eval", str(good["model"]), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "no scorer for data_source 'my_task' (8 rows)" in err and "--data" in err


def test_eval_of_a_run_without_checkpoints_uses_its_final_model(good, tmp_path):
    from hybridflow.config import save_config
    from hybridflow.config.schema import load_run_config
    from hybridflow.trainer.jobs.offline import resolve_source

    run_dir = tmp_path / "run"
    shutil.copytree(good["model"], run_dir / "final_model")
    save_config(load_run_config(None, ["trainer.save_freq=0"]), run_dir / "config.yaml")
    source = resolve_source(run_dir, ["trainer.validation.n=2"])
    assert source.model_path == str(run_dir / "final_model") and source.checkpoint is None
    assert source.run_dir == run_dir and source.cfg.trainer.validation.n == 2


@pytest.mark.parametrize("mode", ["async", "one_step_off"])
def test_an_async_run_needing_more_gpus_than_the_machine_has_is_refused(mode):
    # On one H100 such a run waited for a second GPU (benchmarks/gpu/results/gpu_check.json).
    from hybridflow.config.schema import load_run_config
    from hybridflow.errors import ConfigError
    from hybridflow.trainer.run.preflight import check_gpu_count

    cfg = load_run_config(None, ["resources.use_gpu=true", "resources.world_size=1", f"trainer.mode={mode}"])
    with pytest.raises(ConfigError) as info:
        check_gpu_count(cfg, visible=1)
    assert info.value.key == "trainer.mode" and "2 GPUs" in str(info.value) and "has 1" in str(info.value)
    check_gpu_count(cfg, visible=2)  # a generation GPU beside the training one: fine
    sync = load_run_config(None, ["resources.use_gpu=true", "resources.world_size=2"])
    with pytest.raises(ConfigError) as info:
        check_gpu_count(sync, visible=1)
    assert info.value.key == "resources.world_size"
    check_gpu_count(sync, visible=2)


def test_a_response_longer_than_the_model_is_refused_before_anything_starts(good, tmp_path, capsys):
    # The model has 512 positions; a response of 600 tokens alone does not fit.
    out = tmp_path / "runs"
    err = refused(argv(out, good["model"], good["data"], "rollout.response_length=600"), out, capsys)
    assert "rollout.response_length (600)" in err and "more than the model's 512" in err
    assert "max_position_embeddings in" in err and "data.prompt.max_prompt_length" in err


def test_prompt_plus_response_past_the_model_is_refused_before_the_workers_start(good, tmp_path):
    # 509 of 512 positions leave 3 for the prompt: these prompts (chat-templated) are longer.
    # Found once the prompts are tokenized, after Ray started (so in a subprocess: Ray's log
    # handlers outlive pytest's captured streams), before any worker.
    out = tmp_path / "runs"
    args = [sys.executable, "-m", "hybridflow.cli", *argv(out, good["model"], good["data"], "rollout.response_length=509")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert "the longest training prompt (" in err and "rollout.response_length (509)" in err
    assert "lower rollout.response_length to at most" in err and "data.prompt.max_prompt_length" in err
    assert "actor rank" not in proc.stderr and not any(out.iterdir())  # no worker, no run directory left


def test_no_error_names_a_config_class_instead_of_a_key():
    """Messages tell the user a dotted key (rollout.max_model_len), never a class attribute
    (RolloutConfig.max_model_len), which is nothing a user can set."""
    root = Path(__file__).resolve().parents[2] / "hybridflow"
    pattern = re.compile(r"""["'][^"'\n]*\b[A-Z]\w*Config\.[a-z_]+""")
    offenders = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py")
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if pattern.search(line) and not line.lstrip().startswith(("#", '"""'))]  # messages, not docs
    assert offenders == []


def test_planted_model_code_never_runs_even_when_stdin_says_yes(good, tmp_path):
    # transformers asks "Do you wish to run the custom code? [y/N]" when trust_remote_code is not
    # given; a piped "y" answered it. Now every load passes it, and the directory is refused first.
    model = _broken_model(good, tmp_path, "remote_code")
    result = run_cli(argv(tmp_path / "runs", model, good["data"]), tmp_path, stdin="y\ny\ny\n")
    assert result.returncode == 2 and not result.ray_started, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "model.trust_remote_code=true" in result.stderr
    assert not (tmp_path / "planted-code-ran").exists() and not (tmp_path / "runs").exists()


def test_trust_remote_code_runs_the_directorys_code_when_set(good, tmp_path):
    """model.trust_remote_code=true passes the checks and reaches transformers' loaders, which
    then run the directory's code (its tokenizer class here); nothing is asked."""
    from hybridflow.config.schema import load_run_config
    from hybridflow.trainer.run.preflight import preflight

    model = tmp_path / "model"
    shutil.copytree(good["model"], model)
    marker = tmp_path / "tokenizer-code-ran"
    (model / "marked_tokenizer.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from transformers import PreTrainedTokenizerFast\nclass MarkedTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    config = json.loads((model / "tokenizer_config.json").read_text())
    auto_map = {"AutoTokenizer": ["marked_tokenizer.MarkedTokenizer", None]}
    (model / "tokenizer_config.json").write_text(json.dumps(
        {**config, "tokenizer_class": "MarkedTokenizer", "auto_map": auto_map}))
    args = argv(tmp_path / "runs", model, good["data"])[1:]
    with pytest.raises(ConfigError, match="tokenizer_config.json.*auto_map"):
        preflight(load_run_config(None, args))
    preflight(load_run_config(None, [*args, "model.trust_remote_code=true"]))
    # The controller's tokenizer load, as a run starts (in a process whose module cache is here).
    script = ("from hybridflow.data import load_tokenizer; import sys; "
              f"print(type(load_tokenizer({str(model)!r}, trust_remote_code=True)).__name__)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env={**os.environ, "HF_HOME": str(tmp_path / "hf")}, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "MarkedTokenizer", done.stderr
    assert marker.exists()
