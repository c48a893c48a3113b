"""Checks of what a run reads, made on the controller before its run directory exists and
before Ray starts: the model directories, the data files and the reward file.

    preflight(cfg)          # raises ConfigError keyed by the setting to change
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridflow.data.records import SUFFIXES, PromptRecord, from_row, read_many
from hybridflow.errors import ConfigError
from hybridflow.trainer.run.run_dir import refuse_existing_run_dir

if TYPE_CHECKING:
    from hybridflow.config.schema import RunConfig
    from hybridflow.rewards.config import RewardConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def preflight(cfg: RunConfig, *, new_run: bool = True) -> None:
    """Check the run's model directories, data files and reward file (module docstring).
    `new_run`: the run starts a new directory (an explicit trainer.run_dir must not exist)."""
    if new_run:
        refuse_existing_run_dir(cfg)
    if cfg.resources.use_gpu and cfg.resources.ray_address is None:
        import torch

        check_gpu_count(cfg, torch.cuda.device_count())
    trust = cfg.model.trust_remote_code
    if cfg.model.path is not None:
        check_model_dir(cfg.model.path, "model.path", tokenizer=True, trust_remote_code=trust)
    check_lengths_fit(cfg, 1, "the shortest possible prompt")  # the data's own lengths: once tokenized
    if cfg.critic.model_path is not None and cfg.use_critic:
        check_model_dir(cfg.critic.model_path, "critic.model_path", tokenizer=False, trust_remote_code=trust)
    for key in ("reward_model", "cost_model"):
        if getattr(cfg, key).path is not None:
            check_model_dir(getattr(cfg, key).path, f"{key}.path", tokenizer=False, trust_remote_code=trust,
                            scorer=True)
    reward_fn = None
    if cfg.reward.custom_fn_path is not None:
        reward_fn = check_reward_file(cfg.reward.custom_fn_path, cfg.reward.custom_fn_name, "reward.custom_fn_path",
                                      cfg.reward.manager)
    if cfg.cost_model.custom_fn_path is not None:
        check_reward_file(cfg.cost_model.custom_fn_path, cfg.cost_model.custom_fn_name, "cost_model.custom_fn_path",
                          cfg.reward.manager)
    if cfg.data.train_files:
        records = prompt_records(cfg.data.train_files, "data.train_files", cfg)
        limit = cfg.data.prompt.max_samples
        usable = len(records) if limit is None else min(len(records), limit)
        if usable < cfg.data.train_batch_size:
            raise ConfigError(
                f"the training files hold {usable} usable prompt rows, fewer than one batch "
                f"(data.train_batch_size={cfg.data.train_batch_size}); set data.train_batch_size to at most "
                f"{usable}, or add rows", "data.train_batch_size")
        if reward_fn is None and cfg.reward_model.path is None:
            check_scorers((r.data_source for r in records), "data.train_files")
        check_prompts_render(records, cfg)
    if cfg.data.val_files:
        records = prompt_records(cfg.data.val_files, "data.val_files", cfg)
        if reward_fn is None:
            check_scorers((r.data_source for r in records), "data.val_files")
        check_prompts_render(records, cfg)


def check_gpu_count(cfg: RunConfig, visible: int) -> None:
    """An embedded Ray has this machine's GPUs only: a run that needs more would wait for
    them until the pool's reservation times out (seen on one H100 with trainer.mode=async:
    the rollout pool's GPU beside the training rank's). Refuse before anything starts."""
    train = cfg.resources.resolved_world_size()
    rollout = cfg.async_rl.rollout_ranks if cfg.trainer.mode != "sync" else 0
    if train + rollout <= visible:
        return
    if rollout:
        raise ConfigError(
            f"trainer.mode={cfg.trainer.mode} runs a generation pool of async_rl.rollout_ranks={rollout} GPU(s) "
            f"beside {train} training rank(s): {train + rollout} GPUs, and this machine has {visible}; use "
            "trainer.mode=sync here, fewer resources.world_size ranks, or a Ray cluster (resources.ray_address)",
            "trainer.mode")
    raise ConfigError(f"{train} ranks with resources.use_gpu=true need {train} GPUs, and this machine has "
                      f"{visible}; set resources.world_size to at most {visible}, or join a Ray cluster "
                      "(resources.ray_address)", "resources.world_size")


# ----------------------------------------------------------------------------- lengths


def model_positions(cfg: RunConfig) -> tuple[int, str] | None:
    """How many positions (prompt + response) the policy's generation has, and the setting
    or file that says so; None when the model directory does not say."""
    if cfg.rollout.max_model_len is not None:
        return cfg.rollout.max_model_len, "rollout.max_model_len"
    if cfg.model.uses_builtin:
        return cfg.model.builtin.max_position_embeddings, "model.builtin.max_position_embeddings"
    if cfg.model.path is None:
        return None
    value = read_model_config(Path(cfg.model.path), "model.path").get("max_position_embeddings")
    return (int(value), f"max_position_embeddings in {cfg.model.path}/config.json") if value else None


def check_lengths_fit(cfg: RunConfig, longest_prompt: int, what: str) -> None:
    """Raise ConfigError(rollout.response_length) when `longest_prompt` tokens plus the
    response do not fit the model's positions (found here, not by the workers a minute later)."""
    found = model_positions(cfg)
    response = cfg.rollout.response_length
    if found is None or longest_prompt + response <= found[0]:
        return
    positions, source = found
    room = positions - longest_prompt
    raise ConfigError(f"{what} ({longest_prompt} tokens) + rollout.response_length ({response}) = "
                      f"{longest_prompt + response} positions, more than the model's {positions} ({source}); lower "
                      f"rollout.response_length{f' to at most {room}' if room >= 1 else ''}, or "
                      "data.prompt.max_prompt_length (longer prompts are filtered or truncated) to leave it room",
                      "rollout.response_length")


# ----------------------------------------------------------------------------- model directories


def check_model_dir(path: str | Path, key: str, *, tokenizer: bool, trust_remote_code: bool,
                    scorer: bool = False) -> None:
    """Raise ConfigError(key) unless `path` is a complete local Hugging Face model directory
    of a supported family (module docstring); `scorer`: a reward or cost model."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{str(path)!r} is not a directory; give a local Hugging Face model directory "
                          "(config.json, *.safetensors, tokenizer files). Nothing is downloaded", key)
    config = read_model_config(path, key)
    if not trust_remote_code:
        check_no_remote_code(path, config, key)
    check_model_type(path, config, key)
    if scorer:
        check_scorer_head(path, config, key)
    tensors = weight_shapes(path, key)
    if tensors is not None:
        _check_sizes(path, config, tensors, key)
        _check_shapes(path, tensors, key, trust_remote_code)
    if tokenizer and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{str(path)!r} has no tokenizer (none of {list(TOKENIZER_FILES)}); copy the model's "
                          "tokenizer files into it (tokenizer.save_pretrained(path))", key)


REMOTE_CODE_KEY = "model.trust_remote_code"


def check_no_remote_code(path: Path, config: dict[str, Any], key: str) -> None:
    """ConfigError(model.trust_remote_code) when the directory names Python code of its own
    for transformers to run: an `auto_map` in config.json or tokenizer_config.json."""
    named = {"config.json": config.get("auto_map")}
    tokenizer_config = path / "tokenizer_config.json"
    if tokenizer_config.is_file():
        try:
            tok = json.loads(tokenizer_config.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
            raise ConfigError(f"{tokenizer_config} is not valid JSON ({type(err).__name__}: {err}); restore the file "
                              "from the model's source", key) from None
        named["tokenizer_config.json"] = tok.get("auto_map") if isinstance(tok, dict) else None
    found = {name: value for name, value in named.items() if value}
    if found:
        name, value = next(iter(found.items()))
        classes = sorted({str(v) for v in (value.values() if isinstance(value, dict) else [value])
                          for v in (v if isinstance(v, list) else [v]) if v})[:3]
        raise ConfigError(f"{str(path / name)!r} ({key}) names Python code of its own to run ({name}: auto_map "
                          f"{classes}); hybridflow runs a model directory's code only with "
                          f"{REMOTE_CODE_KEY}=true, which runs it with your permissions in the controller and every "
                          "worker: set it only for a directory whose code you have read", REMOTE_CODE_KEY)


def check_model_type(path: Path, config: dict[str, Any], key: str) -> None:
    """ConfigError(key) unless config.json's model_type is a family the engines support."""
    from hybridflow.engines.model_families import SUPPORTED_FAMILIES

    model_type = config.get("model_type")
    if model_type not in SUPPORTED_FAMILIES:
        raise ConfigError(f"{str(path / 'config.json')!r}: model_type {model_type!r} is not supported; supported "
                          f"families: {sorted(SUPPORTED_FAMILIES)} (docs/models.md)", key)


def check_scorer_head(path: Path, config: dict[str, Any], key: str) -> None:
    """ConfigError(key) unless config.json describes a one-label *ForSequenceClassification."""
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not any(
            isinstance(a, str) and a.endswith("ForSequenceClassification") for a in architectures):
        raise ConfigError(f"{str(path)!r} is not a reward model: its architectures are {architectures!r}; a "
                          "scoring model must be saved as a *ForSequenceClassification with one label "
                          "(hybridflow rm trains one)", key)
    labels = config.get("id2label")
    count = len(labels) if isinstance(labels, dict) else config.get("num_labels", 2)
    if count != 1:
        raise ConfigError(f"{str(path)!r} has {count} labels; a scoring model needs exactly 1", key)


def read_model_config(path: Path, key: str) -> dict[str, Any]:
    """config.json of a model directory as a dict (ConfigError when missing or not JSON)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"{str(path)!r} has no config.json; is it a Hugging Face model directory?", key)
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ConfigError(f"{config_file} is not valid JSON ({err}); restore the file from the model's "
                          "source", key) from None
    if not isinstance(config, dict):
        raise ConfigError(f"{config_file} must hold a JSON object, got {type(config).__name__}", key)
    return config


def weight_shapes(path: Path, key: str) -> dict[str, list[int]] | None:
    """Tensor name -> shape over the directory's safetensors files, each checked complete;
    None when the weights are pytorch_model*.bin (not inspectable without loading)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        if any(path.glob("pytorch_model*.bin")):
            return None
        raise ConfigError(f"{str(path)!r} has a config.json but no weights (*.safetensors); save the model "
                          "with save_pretrained, or copy its weight files in", key)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            wanted = set(json.loads(index.read_text())["weight_map"].values())
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ConfigError(f"{index} is not a valid safetensors index ({err})", key) from None
        missing = sorted(wanted - {f.name for f in files})
        if missing:
            raise ConfigError(f"{str(path)!r} lacks weight file(s) {missing} named in {index.name}; copy them in",
                              key)
    shapes: dict[str, list[int]] = {}
    for file in files:
        shapes.update(safetensors_shapes(file, key))
    return shapes


def safetensors_shapes(file: Path, key: str) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors header, after checking the file holds every
    byte its header promises (a truncated download or copy fails here)."""
    size = file.stat().st_size
    try:
        with file.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(handle.read(length))
        end = max((_entry_end(name, entry) for name, entry in header.items() if name != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError, AttributeError,
            RecursionError) as err:
        raise ConfigError(f"{file} is not a readable safetensors file ({type(err).__name__}: {err}); copy or "
                          "download it again", key) from None
    if 8 + length + end != size:
        raise ConfigError(f"{file} is truncated or damaged: its header describes {8 + length + end} bytes, the "
                          f"file has {size}; copy or download it again", key)
    return {name: list(t["shape"]) for name, t in header.items() if name != "__metadata__"}


# Bytes per element of each safetensors dtype (the format's own names).
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def _entry_end(name: str, entry: Any) -> int:
    """Where the header entry `name` ends in the data, once its dtype, shape and offsets agree
    (what safetensors itself checks when loading); ValueError otherwise."""
    begin, end = entry["data_offsets"]
    shape, dtype = entry["shape"], entry["dtype"]
    if dtype not in _DTYPE_BYTES or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ValueError(f"the entry {name!r} has dtype {dtype!r} and shape {shape!r}")
    count = 1
    for n in shape:
        count *= n
    if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end
            and end - begin == count * _DTYPE_BYTES[dtype]):
        raise ValueError(f"the entry {name!r} spans bytes {begin}..{end}, not its {count} {dtype} elements")
    return end


def _check_sizes(path: Path, config: dict[str, Any], shapes: dict[str, list[int]], key: str) -> None:
    """The embedding [vocab_size, hidden_size] and the decoder-layer count of the weights
    against config.json (a mismatch would otherwise surface as a worker's load error)."""
    embeddings = [shape for name, shape in shapes.items() if name.endswith("embed_tokens.weight")]
    expected = [config.get("vocab_size"), config.get("hidden_size")]
    if embeddings and None not in expected and embeddings[0] != expected:
        raise ConfigError(f"{str(path)!r}: the weights' embedding is {embeddings[0]} but config.json says "
                          f"vocab_size={expected[0]}, hidden_size={expected[1]}; config.json and the weights "
                          "come from different models", key)
    layers = {int(m.group(1)) for name in shapes if (m := _LAYER.search(name))}
    declared = config.get("num_hidden_layers")
    if layers and isinstance(declared, int) and len(layers) != declared:
        raise ConfigError(f"{str(path)!r}: the weights hold {len(layers)} decoder layers but config.json says "
                          f"num_hidden_layers={declared}; config.json and the weights come from different models",
                          key)


def _check_shapes(path: Path, shapes: dict[str, list[int]], key: str, trust_remote_code: bool) -> None:
    """Every weight of the backbone against the shape config.json implies (a model built on the
    meta device: engines/models.py `backbone_shapes`), so a config.json that disagrees with its
    weights anywhere fails here, not in the workers' load."""
    from hybridflow.engines.models import backbone_shapes

    try:
        expected = backbone_shapes(path, trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001 - transformers' errors for values it cannot build a model from
        raise ConfigError(f"{str(path / 'config.json')!r} describes no model transformers can build "
                          f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); restore the file "
                          "from the model's source", key) from None
    for name, shape in shapes.items():
        want = expected.get(name.removeprefix("model."))
        if want is not None and want != shape:
            raise ConfigError(f"{str(path)!r}: the weight {name} is {shape} but config.json implies {want}; "
                              "config.json and the weights come from different models", key)


def model_manifest(path: str | Path) -> dict[str, Any]:
    """What identifies the model in `path`: config.json's content and each weight file's
    name, size and header hash (cheap: the tensor data is not read)."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    files = {}
    for file in sorted(path.glob("*.safetensors")) + sorted(path.glob("pytorch_model*.bin")):
        with file.open("rb") as handle:
            head = handle.read(1 << 20)
        files[file.name] = {"bytes": file.stat().st_size, "head_sha256": hashlib.sha256(head).hexdigest()}
    return {"config": config, "files": files}


def manifest_difference(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """A short description of how two model manifests differ (None: the same model)."""
    old, new = saved["config"], current["config"]
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k != "transformers_version")
    if changed:
        return "config.json differs in " + ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:4])
    if saved["files"] != current["files"]:
        return f"the weight files differ ({sorted(saved['files'])} -> {sorted(current['files'])}, sizes or content)"
    return None


# ----------------------------------------------------------------------------- data files


def prompt_records(files: list[str], key: str, cfg: RunConfig) -> list[PromptRecord]:
    """Every row of `files` read as the RL dataset will. ConfigError on a missing,
    unreadable or empty file, a malformed row or a row without a usable prompt."""
    for name in files:
        file = Path(name)
        if not file.is_file():
            raise ConfigError(f"data file {name!r} does not exist", key)
        if not name.lower().endswith(SUFFIXES):
            raise ConfigError(f"data file {name!r} is not one of {list(SUFFIXES)}", key)
    try:
        rows = read_many(files)
    except ValueError as err:  # a malformed jsonl line names file:line
        raise ConfigError(str(err), key) from None
    except Exception as err:  # noqa: BLE001 - pyarrow's errors (ArrowInvalid, OSError) on a non-parquet file
        raise ConfigError(f"cannot read {files}: {type(err).__name__}: {err}; is it really the format its "
                          "suffix says (parquet / jsonl)?", key) from None
    if not rows:
        raise ConfigError(f"{files} hold no rows; give files with at least data.train_batch_size prompts", key)
    prompt = cfg.data.prompt
    try:
        return [from_row(row, index, prompt.prompt_key, prompt.default_data_source) for index, row in enumerate(rows)]
    except ValueError as err:
        raise ConfigError(f"{files}: {err}", key) from None


def _prompt_shape(prompt: Any) -> tuple:
    """What a chat template's acceptance depends on: a string, or each message's role and
    the types of its values."""
    if isinstance(prompt, str):
        return ("str",)
    return tuple((m.get("role"), tuple(sorted((k, type(v).__name__) for k, v in m.items())))
                 if isinstance(m, dict) else type(m).__name__ for m in prompt)


def check_prompts_render(records: list[PromptRecord], cfg: RunConfig) -> None:
    """One prompt of each shape rendered as the run's prompt data set will render it (its
    tokenizer's chat template), so a message the template refuses is refused here, not after
    Ray started (data.prompt.apply_chat_template, the row)."""
    from hybridflow.data.rl_dataset import render_prompt

    apply = cfg.data.prompt.apply_chat_template
    if apply and cfg.model.path is None and cfg.model.pretrained is not None:
        return  # its tokenizer is fetched and converted with the model, after these checks
    firsts = {_prompt_shape(r.prompt): r for r in reversed(records)}
    tokenizer = run_tokenizer(cfg) if apply else None
    for record in sorted(firsts.values(), key=lambda r: r.index):
        render_prompt(tokenizer, record.prompt, apply, f"row {record.index}")


def run_tokenizer(cfg: RunConfig) -> Any:
    """The tokenizer the run will load: model.path's, or the built-in model's (model.pretrained
    null)."""
    from hybridflow.data import build_char_tokenizer, load_tokenizer

    if cfg.model.path is None:
        return build_char_tokenizer()
    return load_tokenizer(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)


def check_scorers(data_sources: Iterable[str], key: str) -> None:
    """Every one of `data_sources` (one per row) has a built-in or registered scorer (for
    runs and evaluations without a reward file)."""
    from hybridflow.rewards.registry import SCORERS

    sources = Counter(str(source) for source in data_sources)
    unknown = {source: n for source, n in sources.items() if source not in SCORERS}
    if unknown:
        raise ConfigError(
            f"no scorer for data_source {', '.join(f'{s!r} ({n} rows)' for s, n in sorted(unknown.items()))}; "
            f"built-in: {sorted(SCORERS)}. Set reward.custom_fn_path to your reward file, or "
            "hybridflow.rewards.register_scorer(data_source, fn) in the script that starts the run", key)


# ----------------------------------------------------------------------------- reward file


def check_reward_file(path: str, name: str | list[str], key: str, manager: RewardConfig) -> Any:
    """The reward function(s) `name` of `path`, each imported and checked in a reward worker
    confined as the run's will be (rewards/manager.py `check_reward_function`; a module path
    is installed code, imported here); ConfigError naming the file."""
    from hybridflow.rewards.manager import check_reward_function
    from hybridflow.rewards.registry import load_reward_fn

    fns = []
    for one in [name] if isinstance(name, str) else name:
        try:
            fn = load_reward_fn(path, one, resolve=False)
        except (OSError, ImportError, AttributeError, TypeError) as err:
            raise ConfigError(str(err), key) from None
        problem = check_reward_function(fn, manager)
        if problem is not None:
            raise ConfigError(problem, key)
        fns.append(fn)
    return fns[0]
