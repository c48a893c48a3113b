"""State trees on disk in formats that cannot run code: tensors and arrays in safetensors,
everything else in JSON.

    save_plain_state(directory / "runners", [{"obs": array, "generator": tensor, "version": 3}, ...])
    states = load_plain_state(directory / "runners")    # the same tree back, bit for bit
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from hybridflow.errors import DamagedFileError

# JSON tags of what JSON has no type for; a dict with one of these as its only key is a tag.
_TENSOR, _ARRAY, _SCALAR, _TUPLE, _DICT = "__tensor__", "__array__", "__numpy_scalar__", "__tuple__", "__dict__"


def save_plain_state(stem: str | Path, tree: Any) -> None:
    """Write `tree` to `<stem>.json` and `<stem>.safetensors`."""
    stem = Path(stem)
    tensors: dict[str, torch.Tensor] = {}
    encoded = _encode(tree, tensors, "")
    json_tmp, st_tmp = _tmp(stem, ".json"), _tmp(stem, ".safetensors")
    save_file(tensors, str(st_tmp))
    json_tmp.write_text(json.dumps(encoded), encoding="utf-8")
    os.replace(st_tmp, stem.with_suffix(".safetensors"))
    os.replace(json_tmp, stem.with_suffix(".json"))


def load_plain_state(stem: str | Path) -> Any:
    """The tree `save_plain_state` wrote (a DamagedFileError naming the file when it is damaged)."""
    stem = Path(stem)
    json_path, st_path = stem.with_suffix(".json"), stem.with_suffix(".safetensors")
    try:
        encoded = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise DamagedFileError(f"{json_path} is not readable JSON ({type(err).__name__}: {err}): the checkpoint is "
                               "damaged") from None
    try:
        tensors = load_file(str(st_path))
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for a damaged header
        raise DamagedFileError(f"{st_path} cannot be read ({type(err).__name__}: {err}): the checkpoint is "
                               "damaged") from None
    try:
        return _decode(encoded, tensors, json_path)
    except (TypeError, AttributeError, ValueError, RecursionError) as err:  # entries of the wrong shape
        raise DamagedFileError(f"{json_path}: {type(err).__name__}: {err}: the checkpoint is damaged") from None


def _tmp(stem: Path, suffix: str) -> Path:
    return stem.with_name(f".{stem.name}{suffix}.tmp")


def _encode(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if isinstance(value, np.generic):  # before float: np.float64 is a float subclass
        tensors[where] = torch.from_numpy(np.asarray(value).reshape(1).copy())
        return {_SCALAR: where}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        tensors[where] = value.detach().cpu().clone()  # own storage: safetensors refuses shared ones
        return {_TENSOR: where}
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError(f"{where or 'the state'}: an object array cannot be stored without pickle")
        tensors[where] = torch.from_numpy(np.ascontiguousarray(value).copy())
        return {_ARRAY: where}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, tensors, f"{where}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, f"{where}.{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{where or 'the state'}: only string keys can be stored, got {list(value)!r}")
        return {_DICT: {k: _encode(v, tensors, f"{where}.{k}" if where else k) for k, v in value.items()}}
    raise TypeError(f"{where or 'the state'}: a {type(value).__name__} cannot be stored without pickle")


def _decode(value: Any, tensors: dict[str, torch.Tensor], path: Path) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors, path) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise DamagedFileError(f"{path}: an entry {sorted(value)!r} that save_plain_state does not write: the "
                               "file is damaged")
    (tag, inner), = value.items()
    if tag == _DICT:
        return {k: _decode(v, tensors, path) for k, v in inner.items()}
    if tag == _TUPLE:
        return tuple(_decode(v, tensors, path) for v in inner)
    if tag in (_TENSOR, _ARRAY, _SCALAR):
        if inner not in tensors:
            raise DamagedFileError(f"{path} names the tensor {inner!r}, which its .safetensors file lacks: the "
                                   "checkpoint is damaged")
        tensor = tensors[inner]
        return tensor if tag == _TENSOR else tensor.numpy() if tag == _ARRAY else tensor.numpy()[0]
    raise DamagedFileError(f"{path}: an entry tagged {tag!r} that save_plain_state does not write: the file is "
                           "damaged")
