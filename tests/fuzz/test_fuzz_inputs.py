"""Fuzzing what a user hands hybridflow: config overrides and files, data rows, and every file
of a checkpoint and of a model directory, cut short or damaged. Each case must end in
success or a UserInputError of one or two lines (the CLI's exit 2), never another exception
(a traceback), a hang (pytest-timeout) or a partial write; what the pre-Ray checks accept must
then load as the run loads it (prompt data set, chat template, model), and four cases run the
`hybridflow` command end to end. Hypothesis, derandomized (the same cases every run, no example
database): the counts are the `max_examples` below; the session summary prints the cases each
test ran and the tests that found something (conftest.py)."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hybridflow.config.loader import config_to_dict
from hybridflow.config.schema import load_run_config
from hybridflow.errors import UserInputError
from tests.checkpoints import write_run_checkpoint
from tests.fuzz.cases import counted
from tests.processes import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def fuzz(examples: int) -> settings:
    # no "explain" phase: it re-runs a failing case many times (minutes); shrinking stays
    return settings(max_examples=examples, derandomize=True, database=None, deadline=None, print_blob=True,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])


def refused_in_one_or_two_lines(err: UserInputError) -> None:
    assert len(str(err).strip().splitlines()) <= 2, str(err)


def outcome(call, *args, **kwargs):
    """`call`'s result, or None when it refused with a UserInputError (checked to be short);
    any other exception propagates: the bug the fuzzing looks for."""
    try:
        return call(*args, **kwargs)
    except UserInputError as err:
        refused_in_one_or_two_lines(err)
        return None


# ----------------------------------------------------------------------------- values

# No ':' in text: "package.module:name" in any registry-named key imports that module, and a
# random string must not import whatever it happens to name (a few import paths are below).
TEXT = st.text(alphabet=st.characters(blacklist_characters=":", blacklist_categories=("Cs",)), max_size=40)
HUGE = st.sampled_from(["x" * 20_000, "\u00e9\u4e2d\U0001f600" * 5_000, "\n".join(["a: [1"] * 200)])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-3, 3),
                    st.floats(allow_nan=True, allow_infinity=True), TEXT, HUGE,
                    st.sampled_from(["nonexistent_pkg_xyz:thing", "auto", "", " ", "null", "~", "1e999", "-0"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(TEXT, inner, max_size=4)), max_leaves=8)


def _flat(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        keys += _flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else [prefix + key]
    return keys


# Every leaf of the run config but those that name code to import (a module, a file) or
# make pre-flight read the machine: values there would import whatever a string names.
CODE_KEYS = ("algorithm.module", "reward.custom_fn_path", "cost_model.custom_fn_path", "reward.templates",
             "rollout.name", "model.pretrained")
CONFIG_KEYS = sorted(k for k in _flat(config_to_dict(load_run_config(None, [])))
                     if not k.startswith(CODE_KEYS))
KEYS = st.one_of(st.sampled_from(CONFIG_KEYS), st.sampled_from(CONFIG_KEYS).map(lambda k: k.rsplit(".", 1)[0]),
                 TEXT.filter(lambda k: k and "=" not in k))


def override_text(key: str, value, raw: str | None) -> str:
    return f"{key}={raw if raw is not None else yaml.safe_dump(value, default_flow_style=True).strip()}"


OVERRIDES = st.lists(st.builds(override_text, KEYS, VALUES, st.one_of(st.none(), TEXT, HUGE)), max_size=5)


@fuzz(200)
@given(OVERRIDES)
@counted
def test_config_overrides(tmp_path_factory, overrides):
    """The run config from random dotted overrides, then pre-flight of what it names."""
    from hybridflow.trainer.run.preflight import preflight

    out = tmp_path_factory.mktemp("runs")
    cfg = outcome(load_run_config, None, [f"trainer.output_dir={out}", *overrides])
    if cfg is not None:
        outcome(preflight, cfg)
    assert not any(out.iterdir())  # the checks write nothing


TOP_KEYS = sorted({k.split(".")[0] for k in CONFIG_KEYS} | {"env", "sac", "ppo"})
TREES = st.recursive(st.dictionaries(st.one_of(st.sampled_from(TOP_KEYS), TEXT), VALUES, max_size=4),
                     lambda inner: st.dictionaries(st.one_of(st.sampled_from(TOP_KEYS), TEXT), inner, max_size=3),
                     max_leaves=6)


@fuzz(150)
@given(st.one_of(TREES.map(lambda t: yaml.safe_dump(t, allow_unicode=True)), TEXT, HUGE,
                 st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
@counted
def test_config_files(tmp_path_factory, text):
    """A --config file of random YAML (or not YAML at all), read as `hybridflow train` reads it."""
    from hybridflow.config.loader import user_tree
    from hybridflow.config.tasks import read_task_config

    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    tree = outcome(user_tree, path)
    if tree is not None:
        outcome(read_task_config, tree)


# ----------------------------------------------------------------------------- data rows

MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool"]) | TEXT,
                                           "content": st.one_of(TEXT, HUGE, st.integers())}), max_size=3)
PROMPTS = st.one_of(TEXT, HUGE, MESSAGES, VALUES)
ROWS = st.lists(st.fixed_dictionaries(
    {}, optional={"prompt": PROMPTS, "data_source": st.one_of(st.sampled_from(["arithmetic", "gsm8k", "math"]),
                                                               TEXT, VALUES),
                  "reward_model": st.one_of(st.fixed_dictionaries({"ground_truth": VALUES}), VALUES),
                  "ground_truth": VALUES, "extra_info": VALUES, "question": TEXT}), max_size=6)
DATA_SETTINGS = st.lists(st.sampled_from([
    "data.prompt.apply_chat_template=false", "data.prompt.truncation=error", "data.prompt.filter_overlong_prompts=false",
    "data.prompt.max_prompt_length=8", "data.prompt.prompt_key=question", "data.prompt.pad_to=max_length",
    "data.prompt.default_data_source=arithmetic", "data.prompt.max_samples=2"]), max_size=3, unique=True)


# The built-in demo with batches of one prompt, so that any file with a usable row is a run.
ONE_ROW_BATCH = ("sft.steps=0", "data.train_batch_size=1", "actor.micro_batch.mini_batch_size=8",
                 "actor.micro_batch.micro_batch_size_per_device=8")


def write_rows(path: Path, rows: list, raw_lines: list[str]) -> bool:
    """`rows` as jsonl or parquet (False when parquet cannot hold them); `raw_lines` appended to jsonl."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pq.write_table(pa.Table.from_pylist(rows), path)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return False
        return True
    lines = [json.dumps(row, ensure_ascii=False) for row in rows] + raw_lines
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8", errors="surrogateescape")
    return True


@pytest.fixture(scope="module")
def char_tokenizer():
    from hybridflow.data import build_char_tokenizer

    return build_char_tokenizer(64)


@fuzz(120)
@given(ROWS, st.lists(st.one_of(TEXT, st.just('{"prompt": "1+1=", "data_s'), st.just("[1, 2]")), max_size=2),
       st.sampled_from(["train.jsonl", "train.parquet"]), DATA_SETTINGS)
@counted
def test_data_rows(tmp_path_factory, char_tokenizer, rows, raw_lines, name, settings_):
    """Prompt files of random rows: pre-flight reads them as the run does; what it accepts the
    run's prompt data set takes (tokenized, rendered, collated) without another error."""
    from hybridflow.data import RLPromptDataset
    from hybridflow.trainer.run.preflight import preflight

    root = tmp_path_factory.mktemp("data")
    path = root / name
    if not write_rows(path, rows, raw_lines):
        return
    cfg = load_run_config(None, [f"trainer.output_dir={root / 'runs'}", f"data.train_files=[{path}]", *ONE_ROW_BATCH,
                                 *settings_])
    if outcome(preflight, cfg) is None and not _preflight_passes(cfg):
        return
    data = outcome(RLPromptDataset, cfg.data.train_files, char_tokenizer, cfg.data.prompt)
    if data is not None:
        data.collate([data[i] for i in range(len(data))])
    assert not (root / "runs").exists()


def _preflight_passes(cfg) -> bool:
    from hybridflow.trainer.run.preflight import preflight

    try:
        preflight(cfg)
    except UserInputError:
        return False
    return True


# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def checkpoint_template(tmp_path_factory):
    """A run checkpoint (tests/checkpoints.py) plus what an environment run adds: runner
    states (JSON + safetensors) and a pending batch."""
    import numpy as np
    import torch

    from hybridflow.protocol import DataProto
    from hybridflow.trainer.env.state import save_env_state

    run_dir = tmp_path_factory.mktemp("ckpt") / "run"
    checkpoint = write_run_checkpoint(run_dir)
    batch = DataProto.from_dict(tensors={"obs": torch.randn(2, 3)},
                                non_tensors={"uid": np.array(["a", "b"], dtype=object)})
    save_env_state(checkpoint, [{"obs": np.zeros((2, 3), dtype=np.float32), "steps": 5, "envs": None}], [batch])
    return checkpoint


def checkpoint_files(checkpoint: Path) -> list[str]:
    return sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())


def damage(target: Path, data, most: int) -> None:
    """`target` cut at a drawn length, or up to `most` drawn bytes written over it in place."""
    content = target.read_bytes()
    if data.draw(st.booleans(), label="cut"):
        target.write_bytes(content[: data.draw(st.integers(0, max(0, len(content) - 1)), label="length")])
    else:
        at = data.draw(st.integers(0, max(0, len(content) - 1)), label="at")
        patch = data.draw(st.binary(min_size=1, max_size=most), label="bytes")
        target.write_bytes(content[:at] + patch + content[at + len(patch):])


@fuzz(150)
@given(st.data())
@counted
def test_checkpoint_files_cut_or_damaged(tmp_path_factory, checkpoint_template, data):
    """Any file of a checkpoint cut at any length or overwritten in place; the file sizes
    trainer_state.json records kept or updated (what a tamperer does). `find_checkpoint`
    (eval, export and --resume call it first) accepts or refuses in one line."""
    from hybridflow.trainer.run.checkpointing import FILES_KEY, TRAINER_STATE_FILE, checkpoint_files as sizes
    from hybridflow.trainer.run.checkpointing import find_checkpoint

    name = data.draw(st.sampled_from(checkpoint_files(checkpoint_template)), label="file")
    copy = tmp_path_factory.mktemp("case") / "run" / "checkpoints" / checkpoint_template.name
    shutil.copytree(checkpoint_template, copy)
    damage(copy / name, data, 64)
    if data.draw(st.booleans(), label="sizes updated") and name != TRAINER_STATE_FILE:
        state = json.loads((copy / TRAINER_STATE_FILE).read_text())
        (copy / TRAINER_STATE_FILE).write_text(json.dumps({**state, FILES_KEY: sizes(copy)}))
    if outcome(find_checkpoint, copy) is not None:
        load_as_a_resumed_run_does(copy)  # accepted: every loader must then succeed


def load_as_a_resumed_run_does(checkpoint: Path) -> None:
    """What the workers and the controller read of a checkpoint `find_checkpoint` accepted."""
    from hybridflow.engines.train.checkpoint import load_plain
    from hybridflow.engines.train.dcp_reader import load_dcp
    from hybridflow.protocol import DataProto
    from hybridflow.trainer.env.state import load_env_state
    from hybridflow.trainer.run.checkpointing import read_trainer_state
    from tests.checkpoints import actor_state

    read_trainer_state(checkpoint)
    load_dcp(actor_state(), checkpoint / "actor")
    for file in (checkpoint / "actor").glob("*.pt"):
        load_plain(file)
    DataProto.load(checkpoint / "prompts.dataproto")
    load_env_state(checkpoint)


# ----------------------------------------------------------------------------- model directories


@pytest.fixture(scope="module")
def model_template(tmp_path_factory):
    from hybridflow.config.model_presets import write_model_presets
    from hybridflow.data import make_builtin_model_dir

    model = make_builtin_model_dir(tmp_path_factory.mktemp("model") / "model")
    write_model_presets(model, load_run_config(None, []), "the fuzz suite")
    return model


@fuzz(80)
@given(st.data())
@counted
def test_model_directory_files_cut_or_damaged(tmp_path_factory, model_template, data):
    """Any file of a model directory cut or overwritten: pre-flight (train, eval, export) accepts
    or refuses in one line; what it accepts loads, on the controller (tokenizer, chat template,
    saved presets) and as a worker loads it (the model)."""
    from hybridflow.data import load_tokenizer
    from hybridflow.data.rl_dataset import render_prompt
    from hybridflow.engines.models import load_model
    from hybridflow.trainer.jobs.offline import resolve_source
    from hybridflow.trainer.run.preflight import preflight

    name = data.draw(st.sampled_from(sorted(p.name for p in model_template.iterdir())), label="file")
    copy = tmp_path_factory.mktemp("case") / "model"
    shutil.copytree(model_template, copy)
    damage(copy / name, data, 16)
    cfg = outcome(load_run_config, None, [f"model.path={copy}", f"trainer.output_dir={copy.parent / 'runs'}"])
    if cfg is None or outcome(preflight, cfg) is None and not _preflight_passes(cfg):  # train's reading
        return
    source = outcome(resolve_source, copy, reward=False)  # eval / export's reading of a model directory
    if source is None:
        return
    tokenizer = outcome(load_tokenizer, copy)
    if tokenizer is not None:
        outcome(render_prompt, tokenizer, [{"role": "user", "content": "1+1="}], True)
    load_model(copy)  # passed pre-flight: a worker must load it


# ----------------------------------------------------------------------------- the command, end to end

CLI_CASES = [
    ("an override of unicode and a huge value", lambda root, model, ckpt: [
        "train", f"trainer.output_dir={root / 'runs'}", "rollout.n=" + "9" * 400, "actor.optim.lr=\u00e9\u4e2d"]),
    ("a data file cut in a row", lambda root, model, ckpt: [
        "train", f"trainer.output_dir={root / 'runs'}", f"data.train_files=[{_cut_data(root)}]"]),
    ("eval of a checkpoint with a shard cut (sizes updated)", lambda root, model, ckpt: [
        "eval", str(_cut_shard(root, ckpt))]),
    ("eval of a model directory with its tokenizer cut", lambda root, model, ckpt: [
        "eval", str(_cut_tokenizer(root, model)), "--data", str(_cut_data(root, whole=True))]),
]


def _cut_data(root: Path, whole: bool = False) -> Path:
    path = root / ("whole.jsonl" if whole else "cut.jsonl")
    row = {"prompt": [{"role": "user", "content": "1+1="}], "data_source": "arithmetic",
           "reward_model": {"ground_truth": "2"}}
    text = "".join(json.dumps(row) + "\n" for _ in range(8))
    path.write_text(text if whole else text[: len(text) - 17])
    return path


def _cut_shard(root: Path, checkpoint: Path) -> Path:
    from hybridflow.config import save_config
    from hybridflow.trainer.run.checkpointing import FILES_KEY, TRAINER_STATE_FILE, checkpoint_files as sizes

    from hybridflow.trainer.run.lifecycle import base_model_path

    run = root / "run"
    shutil.copytree(checkpoint.parent.parent, run)
    cfg = load_run_config(None, ["resources.world_size=1"])
    save_config(cfg, run / "config.yaml")
    base_model_path(cfg, run, write_builtin=True)  # the run's starting model: all the eval needs but the shard
    copy = run / "checkpoints" / checkpoint.name
    shard = copy / "actor" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])
    state = json.loads((copy / TRAINER_STATE_FILE).read_text())
    (copy / TRAINER_STATE_FILE).write_text(json.dumps({**state, FILES_KEY: sizes(copy)}))
    return run


def _cut_tokenizer(root: Path, model: Path) -> Path:
    copy = root / "model"
    shutil.copytree(model, copy)
    (copy / "tokenizer.json").write_text((model / "tokenizer.json").read_text()[:500])
    return copy


@pytest.mark.parametrize("what, args", CLI_CASES, ids=[case[0] for case in CLI_CASES])
@counted
def test_the_command_ends_in_exit_2_without_a_traceback(tmp_path, model_template, checkpoint_template, what, args):
    result = run_cli(args(tmp_path, model_template, checkpoint_template), tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2 and not result.ray_started, result.stderr
    assert not (tmp_path / "runs").exists()
