"""What the fuzzing suite (tests/fuzz) found, one case each, in the fast suite: inputs that
ended in a traceback, in a worker's load error after the checks passed them, or in a message
of many lines or many KB. Each must now be one short line naming the setting (exit 2)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from hybridflow.config.schema import load_run_config
from hybridflow.errors import ConfigError


@pytest.fixture(scope="module")
def model_template(tmp_path_factory) -> Path:
    from hybridflow.data import make_builtin_model_dir

    return make_builtin_model_dir(tmp_path_factory.mktemp("model") / "model")


@pytest.fixture
def model(model_template, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(model_template, tmp_path / "model"))


def short(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert len(text.splitlines()) == 1 and len(text) < 2100, text[:300]
    return text


@pytest.mark.parametrize("override, message", [
    ("rollout.n=" + "9" * 400, "rollout.n"),  # was OverflowError: int too large to convert to float
    ("actor.optim.lr=" + "9" * 400, "actor.optim.lr: expected float"),
    ("trainer.total_steps=" + "x" * 20_000, "trainer.total_steps: expected int"),  # was a 20 KB message
    ("x" * 20_000 + "=1", "unknown config key"),  # was a 20 KB message
])
def test_huge_override_values_are_refused_in_one_short_line(override, message):
    with pytest.raises(ConfigError) as err:
        load_run_config(None, [override])
    assert message in short(err)


@pytest.mark.parametrize("content, what", [
    (b'{"presets": {"actor.dtype": "fp32"}}\xff\xfe', "UnicodeDecodeError"),  # was a traceback
    (b'{"written_by": "x", "presets": ["actor.dtype"]}', "presets is a list, not a mapping"),
])
def test_a_damaged_presets_file_is_refused(model, content, what):
    (model / "hybridflow_presets.json").write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_run_config(None, [f"model.path={model}"])
    assert "hybridflow_presets.json is not a presets file hybridflow wrote" in short(err) and what in short(err)
    assert err.value.key == "model.path"


def rewrite_safetensors_header(file: Path, edit) -> None:
    """`edit(header)` applied to the file's JSON header, the data bytes kept."""
    data = file.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    edit(header)
    raw = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length:])


def _widen(header: dict) -> None:
    name = next(n for n, t in header.items() if n != "__metadata__" and len(t["shape"]) == 2)
    header[name]["shape"][1] += 1  # the bytes stay; the shape no longer fits them


def _bad_dtype(header: dict) -> None:
    name = next(n for n in header if n != "__metadata__")
    header[name]["dtype"] = "F33"


def _config_edit(model: Path, **changes) -> None:
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **changes}))


@pytest.mark.parametrize("damage, message", [
    # each passed pre-flight at 6c4bac7 and failed in the model load (a worker's, after Ray)
    (lambda m: rewrite_safetensors_header(m / "model.safetensors", _widen),
     "model.safetensors is not a readable safetensors file"),
    (lambda m: rewrite_safetensors_header(m / "model.safetensors", _bad_dtype),
     "model.safetensors is not a readable safetensors file"),
    (lambda m: _config_edit(m, intermediate_size=24), "config.json and the weights come from different models"),
    (lambda m: _config_edit(m, num_attention_heads=3), "describes no model transformers can build"),
], ids=["shape-not-its-bytes", "unknown-dtype", "intermediate-size", "heads-not-dividing-hidden"])
def test_model_directory_damage_the_load_would_meet_is_found_before_ray(model, damage, message):
    from hybridflow.engines.models import load_model
    from hybridflow.trainer.run.preflight import preflight

    damage(model)
    with pytest.raises(Exception):  # what a worker would meet: the check below must find it first
        load_model(model)
    cfg = load_run_config(None, [f"model.path={model}"])
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    assert message in short(err) and err.value.key == "model.path"


def test_an_untied_head_of_the_wrong_shape_is_found_before_ray(tmp_path):
    # transformers loads a head whose shape disagrees with config.json by initialising it
    # afresh (a warning only): the model would train from a random head.
    from hybridflow.engines.models import save_tiny_model
    from hybridflow.trainer.run.preflight import preflight

    model = save_tiny_model(tmp_path / "untied", tie_word_embeddings=False)

    def transpose_head(header: dict) -> None:
        header["lm_head.weight"]["shape"] = header["lm_head.weight"]["shape"][::-1]  # same bytes

    rewrite_safetensors_header(model / "model.safetensors", transpose_head)
    cfg = load_run_config(None, [f"model.path={model}"])
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    assert "lm_head.weight" in short(err) and err.value.key == "model.path"


def test_a_chat_message_the_template_refuses_is_a_config_error(tmp_path):
    """The built-in chat template raises jinja2's TemplateError on an unknown role; that was
    a traceback (exit 1) after Ray started."""
    from hybridflow.data import RLPromptDataset, build_char_tokenizer
    from hybridflow.data.configs import PromptDataConfig

    rows = tmp_path / "train.jsonl"
    rows.write_text(json.dumps({"prompt": [{"role": "robot", "content": "1+1="}], "data_source": "arithmetic"}) + "\n")
    with pytest.raises(ConfigError) as err:
        RLPromptDataset([str(rows)], build_char_tokenizer(), PromptDataConfig())
    assert "row 0: the tokenizer's chat template cannot render it" in short(err) and "unknown role robot" in short(err)
    assert err.value.key == "data.prompt.apply_chat_template"


def test_a_chat_message_the_template_refuses_stops_the_command_before_ray(tmp_path, capsys):
    from hybridflow.cli import main

    rows = tmp_path / "train.jsonl"
    good = {"prompt": [{"role": "user", "content": "1+1="}], "data_source": "arithmetic",
            "reward_model": {"ground_truth": "2"}}
    bad = {**good, "prompt": [{"role": "robot", "content": "1+1="}]}
    rows.write_text("".join(json.dumps(row) + "\n" for row in [good] * 7 + [bad]))
    out = tmp_path / "runs"
    assert main(["train", f"trainer.output_dir={out}", f"data.train_files=[{rows}]", "data.train_batch_size=1",
                 "actor.micro_batch.mini_batch_size=8", "actor.micro_batch.micro_batch_size_per_device=8",
                 "sft.steps=0"]) == 2
    err = capsys.readouterr().err
    assert "data.prompt.apply_chat_template: row 7: the tokenizer's chat template cannot render it" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
