"""What a saved model carries for the next run that loads it: the settings it was trained
and evaluated with, written next to its weights and read back through `model.path`.

    write_model_presets("runs/r/sft_model", cfg)   # <dir>/hybridflow_presets.json
    read_model_presets("runs/r/sft_model")         # (("actor.dtype", "fp32"), ...); () if absent
"""

from __future__ import annotations

import json
from operator import attrgetter
from pathlib import Path
from typing import Any

from hybridflow.errors import ConfigError

MODEL_PRESETS_FILE = "hybridflow_presets.json"

# Settings that belong to the model rather than to the task or the algorithm.
CARRIED_KEYS = (
    "actor.dtype",
    "rollout.dtype",
    "critic.dtype",
    "data.prompt.max_prompt_length",
    "data.prompt.apply_chat_template",
    "rollout.response_length",
)


def write_model_presets(model_dir: str | Path, cfg: Any, written_by: str) -> Path:
    """`<model_dir>/hybridflow_presets.json` with `cfg`'s CARRIED_KEYS; `written_by` says
    which run (and step) the model came from."""
    path = Path(model_dir) / MODEL_PRESETS_FILE
    presets = {key: attrgetter(key)(cfg) for key in CARRIED_KEYS}
    path.write_text(json.dumps({"written_by": written_by, "presets": presets}, indent=2) + "\n")
    return path


def read_model_presets(model_dir: str | Path | None) -> tuple[tuple[str, object], ...]:
    """The presets saved next to a model's weights; () when there are none (any other model)."""
    if model_dir is None:
        return ()
    path = Path(model_dir) / MODEL_PRESETS_FILE
    if not path.is_file():
        return ()
    try:
        presets = json.loads(path.read_text(encoding="utf-8"))["presets"]
        if not isinstance(presets, dict):
            raise TypeError(f"presets is a {type(presets).__name__}, not a mapping")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, KeyError, TypeError) as err:
        raise ConfigError(f"{path} is not a presets file hybridflow wrote ({type(err).__name__}: {err}); delete it "
                          "or write it again", "model.path") from None
    unknown = sorted(set(presets) - set(CARRIED_KEYS))
    if unknown:
        raise ConfigError(f"{path} holds keys hybridflow does not carry with a model: {unknown}", "model.path")
    return tuple(presets.items())
