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
