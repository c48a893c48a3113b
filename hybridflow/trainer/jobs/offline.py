"""Scoring and exporting a saved policy outside a training run (`hybridflow eval`,
`hybridflow export`).

    source = resolve_source("runs/grpo-20260101-120000")         # run dir: its newest checkpoint
    report = evaluate_source(source, ["test.parquet"])           # None: the run's held-out prompts
    report.metrics["val/accuracy"], report.metrics["val/gsm8k/accuracy"]
    export_source(resolve_source("runs/.../checkpoints/global_step_20"), "exported/")
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hybridflow.config.dtypes import resolved_dtypes
from hybridflow.config.loader import override_keys, user_tree, with_overrides
from hybridflow.config.model_presets import MODEL_PRESETS_FILE, write_model_presets
from hybridflow.config.schema import RunConfig, load_run_config, resolved_resources, run_config_from_tree
from hybridflow.config.tasks import TASK_KINDS, task_kind_of_checkpoint
from hybridflow.config.validation import validate_run_config
from hybridflow.controller import RayHold, RoleSpec, WorkerGroup
from hybridflow.data import RLPromptDataset, load_tokenizer
from hybridflow.errors import ConfigError
from hybridflow.protocol import DataProto
from hybridflow.trainer.run.checkpointing import (
    CHECKPOINTS_DIR,
    CheckpointNotFoundError,
    complete_checkpoints,
    actor_checkpoint_path,
    checkpoint_step,
    find_checkpoint,
    read_trainer_state,
    run_config_path,
    run_dir_of,
)
from hybridflow.trainer.jobs.sft import SFTPart
from hybridflow.trainer.lm.evaluate import evaluate_responses, sampling_meta
from hybridflow.trainer.lm.part import LanguageModelPart
from hybridflow.trainer.run.lifecycle import SFT_MODEL_DIR, base_model_path, policy_start_path
from hybridflow.trainer.run.preflight import check_model_dir, check_reward_file, check_scorers
from hybridflow.trainer.run.run_dir import read_metrics
from hybridflow.trainer.run.setup import (
    actor_config,
    build_groups,
    build_reward_manager,
    first_prompts,
    rank_cpus,
    val_prompts,
)
from hybridflow.workers import ActorRolloutRefWorker, shutdown_role_groups

FINAL_MODEL_DIR = "final_model"  # <run>/final_model: the exported policy (run/run_dir.py)


@dataclass(frozen=True)
class PolicyRun:
    """A kind of run that trains a language-model policy, as eval and export read it.
    checkpoint_kind: trainer_state.json's "kind" of its checkpoints (their actor/ in one
    layout); phase: the metrics.jsonl phase of its steps; exported: <run>/<exported>, the
    policy it exports at its end; start(cfg, run_dir): the model its checkpoints' actor is
    built from before their weights replace its own."""

    checkpoint_kind: str | None
    phase: str
    exported: str
    start: Callable[[RunConfig, Path], str]


# In the order a run directory is matched: an RL run first (its SFT warm start logs "sft"
# steps and leaves sft_model too); a `hybridflow sft` job's actor starts from the base model.
POLICY_RUNS = (
    PolicyRun(TASK_KINDS["language_model"].checkpoint_kind, LanguageModelPart.phase, FINAL_MODEL_DIR,
              policy_start_path),
    PolicyRun(SFTPart.checkpoint_kind, SFTPart.phase, SFT_MODEL_DIR, partial(base_model_path, write_builtin=False)),
)


@dataclass
class ModelSource:
    """What to load: the actor is built from `model_path`, then (for a checkpoint) its
    weights are replaced by the checkpoint's actor."""

    path: Path  # as the user gave it
    cfg: RunConfig  # the run's config (with overrides), or the defaults for a model dir
    model_path: str
    checkpoint: Path | None = None
    step: int | None = None
    run_dir: Path | None = None  # the run whose final_model/ this is (held-out prompts from its config)
    settings_from: str = ""  # where cfg's values come from, in words (settings_lines)
    not_taken: dict[str, Any] = dataclasses.field(default_factory=dict)  # config.yaml's code settings left out


@dataclass
class EvalReport:
    source: ModelSource
    data: list[str]  # files, or ["<held-out prompts of the run>"]
    metrics: dict[str, float]
    responses: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # evaluate.response_records

    def to_json(self) -> dict[str, Any]:
        src = self.source
        return {
            "source": str(src.path), "model_path": src.model_path,
            "checkpoint": str(src.checkpoint) if src.checkpoint is not None else None, "step": src.step,
            "data": self.data, "sampling": sampling_meta(src.cfg.trainer.validation),
            "response_length": src.cfg.rollout.response_length, "world_size": src.cfg.resources.world_size,
            "settings": eval_settings(src.cfg), "settings_from": src.settings_from,
            "metrics": self.metrics, "responses": self.responses,
        }


def resolve_source(path: str | Path, overrides: Sequence[str] = (), *, reward: bool = True,
                   use_run_reward: bool = False) -> ModelSource:
    """The model source `path` names (module docstring); overrides are dotted config keys.
    `reward`: the command scores responses (eval; export does not); `use_run_reward`: take
    the reward settings of the run's config.yaml as saved (eval's --use-run-reward)."""
    path = Path(path)
    with_flags = " and the command line" if overrides else ""
    if (path / "config.json").is_file():  # a Hugging Face model directory
        # Never the built-in demo's presets: they fit the tiny model and its 3-token answers.
        # rollout.n only satisfies the default algorithm's checks: eval samples trainer.validation.n.
        cfg = load_run_config(None, [f"model.path={path}", "sft.steps=0", "rollout.n=2", *overrides], demo=False)
        saved = path / MODEL_PRESETS_FILE
        origin = f"{saved}, defaults" if saved.is_file() else "defaults (the model directory has no saved settings)"
        return _checked(ModelSource(path, _resolved(cfg), str(path), settings_from=origin + with_flags), reward)
    exported = exported_policy(path)
    if exported is not None:
        # A run that saved no checkpoints (trainer.save_freq=0) but exported its policy.
        cfg, not_taken = run_config_as_data(path / "config.yaml", overrides, reward, use_run_reward)
        return _checked(ModelSource(path, _resolved(cfg), str(exported), run_dir=path,
                                    settings_from=f"{path / 'config.yaml'}{with_flags}", not_taken=not_taken), reward)
    try:
        checkpoint = find_checkpoint(path)
    except CheckpointNotFoundError as err:
        raise CheckpointNotFoundError(
            f"{err}. Give a run directory, a checkpoint directory (checkpoints/global_step_<N>) or a "
            "Hugging Face model directory (with config.json)") from None
    run = policy_run_of(read_trainer_state(checkpoint), path)
    cfg, not_taken = run_config_as_data(run_config_path(checkpoint), overrides, reward, use_run_reward)
    cfg = _resolved(cfg)
    return _checked(ModelSource(path, cfg, run.start(cfg, run_dir_of(checkpoint)), checkpoint,
                                checkpoint_step(checkpoint), settings_from=f"{run_config_path(checkpoint)}{with_flags}",
                                not_taken=not_taken), reward)


def exported_policy(run_dir: Path) -> Path | None:
    """The policy a run that saved no complete checkpoint exported: the first POLICY_RUNS row's
    export the run holds, up to the row whose steps the run logged (an RL run without
    final_model is not read as its warm start's sft_model). None: not such a run."""
    if not (run_dir / "config.yaml").is_file() or complete_checkpoints(run_dir / CHECKPOINTS_DIR):
        return None
    logged: set[str] | None = None  # the phases of metrics.jsonl, read once a row's export is missing
    for run in POLICY_RUNS:
        if (run_dir / run.exported / "config.json").is_file():
            return run_dir / run.exported
        if logged is None:
            metrics = run_dir / "metrics.jsonl"
            logged = {record["phase"] for record in read_metrics(metrics)} if metrics.is_file() else set()
        if run.phase in logged:
            return None
    return None


def policy_run_of(state: dict[str, Any], path: Path) -> PolicyRun:
    """The POLICY_RUNS row of a checkpoint's trainer_state.json; another task kind's
    checkpoint is a ConfigError saying where its results are."""
    found = next((run for run in POLICY_RUNS if run.checkpoint_kind == state.get("kind")), None)
    if found is None:
        kind = task_kind_of_checkpoint(state)  # a kind no task writes: its own error
        raise ConfigError(f"{str(path)!r} is a run of task kind {kind.name!r}; eval and export take language-model "
                          f"runs and models ({kind.offline})")
    return found


# Settings of a run's config.yaml that name code to run, or loosen the reward workers'
# confinement, and when a saved value does: eval and export take such a value from the file
# only when the command line names the key (module docstring). The reward ones (all but the
# first two) are taken as saved with eval's --use-run-reward.
RUN_CODE_SETTINGS: dict[str, Any] = {
    "algorithm.module": lambda v: v is not None,
    "model.trust_remote_code": lambda v: v is True,
    "reward.custom_fn_path": lambda v: v is not None,
    "cost_model.custom_fn_path": lambda v: v is not None,
    "reward.templates": lambda v: isinstance(v, list) and any(
        isinstance(t, dict) and t.get("name") == "user" for t in v),
    "reward.manager.sandbox": lambda v: v is False,
    "reward.manager.num_workers": lambda v: v == 0,
    "reward.manager.allow_subprocess": lambda v: v is True,
    "reward.manager.env_passthrough": lambda v: bool(v),
    "reward.manager.readable_paths": lambda v: bool(v),
}
REWARD_CODE = ("reward.custom_fn_path", "cost_model.custom_fn_path", "reward.templates")


def run_config_as_data(config_path: Path, overrides: Sequence[str], reward: bool,
                       use_run_reward: bool) -> tuple[RunConfig, dict[str, Any]]:
    """The run's config with `overrides`, its RUN_CODE_SETTINGS left at their defaults unless
    named on the command line (the reward ones also with `use_run_reward`); and those left out.
    A reward's code left out is an error when the command scores (`reward`)."""
    tree = user_tree(config_path)
    named = override_keys(list(overrides))
    not_taken = {}
    for key, loosens in RUN_CODE_SETTINGS.items():
        value = _tree_value(tree, key)
        given = any(key == n or key.startswith(n + ".") for n in named)
        kept_by_flag = use_run_reward and key not in ("algorithm.module", "model.trust_remote_code")
        if value is not _ABSENT and loosens(value) and not given and not kept_by_flag:
            not_taken[key] = value
            _drop(tree, key)
    if "algorithm.module" in not_taken:  # its algorithm is not registered then; eval and export use none
        tree["algorithm"] = {}
        rollout = tree.setdefault("rollout", {})
        if isinstance(rollout, dict) and not (isinstance(rollout.get("n"), int) and rollout["n"] >= 2):
            rollout["n"] = 2  # what the default algorithm (grpo) needs
    code = {key: value for key, value in not_taken.items() if key in REWARD_CODE}
    if reward and code:
        key, value = next(iter(code.items()))
        raise ConfigError(f"{config_path} scores with code of its own ({key}={value!r}); eval runs a run's reward code "
                          f"only when you name it: add {key}={value if not isinstance(value, list) else '[...]'} "
                          "(it runs in the confined reward workers, reward.manager.*), or --use-run-reward to take the "
                          "run's reward settings as saved", key)
    return run_config_from_tree(with_overrides(tree, list(overrides))), not_taken


_ABSENT = object()


def _tree_value(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _drop(tree: dict[str, Any], key: str) -> None:
    *sections, last = key.split(".")
    node: Any = tree
    for part in sections:
        node = node[part]
    del node[last]


def eval_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings that decide what an evaluation measures, by their dotted keys."""
    v = cfg.trainer.validation
    return {"data.prompt.max_prompt_length": cfg.data.prompt.max_prompt_length,
            "data.prompt.apply_chat_template": cfg.data.prompt.apply_chat_template,
            "rollout.response_length": cfg.rollout.response_length, "rollout.dtype": cfg.rollout.dtype,
            "rollout.name": cfg.rollout.name, "rollout.agent.enable": cfg.rollout.agent.enable,
            **{f"trainer.validation.{key}": value for key, value in sampling_meta(v).items()}}


def settings_lines(source: ModelSource) -> list[str]:
    """What `hybridflow eval` prints before it starts: each setting and where they came from."""
    prompt, r, v = source.cfg.data.prompt, source.cfg.rollout, source.cfg.trainer.validation
    dtype = "auto (bf16 where the device computes it natively, else fp32)" if r.dtype == "auto" else r.dtype
    sampling = ("greedy" if not v.do_sample else
                f"sampled (temperature {v.temperature}, top_p {v.top_p}, top_k {v.top_k}, seed {v.seed})")
    agent = ", agent loop on (rollout.agent.enable)" if r.agent.enable else ""
    left_out = ([f"  not taken from config.yaml (name them on the command line to use them): "
                 f"{', '.join(f'{k}={v!r}' for k, v in source.not_taken.items())}"] if source.not_taken else [])
    return [f"settings from {source.settings_from}:", *left_out,
            f"  prompts up to {prompt.max_prompt_length} tokens (data.prompt.max_prompt_length), chat "
            f"template {_template_word(prompt.apply_chat_template)} (data.prompt.apply_chat_template)",
            f"  responses up to {r.response_length} tokens (rollout.response_length), dtype {dtype} "
            f"(rollout.dtype), backend {r.name}{agent}",
            f"  {sampling}, {v.n} response(s) per prompt (trainer.validation.*)"]


def _template_word(apply: bool | str) -> str:
    return "for chat-message prompts only" if apply == "conversational" else "on" if apply else "off"


def _checked(source: ModelSource, reward: bool) -> ModelSource:
    """`source` once train's pre-flight checks of what it reads pass (trainer/run/preflight.py):
    the model directory (a truncated safetensors file is one line naming it, not a
    deserializer error from a worker) and, for a command that scores (`reward`), the reward
    file, imported in a confined reward worker, before Ray starts."""
    if Path(source.model_path).is_dir():  # a built-in model is written into the run dir on first use
        check_model_dir(source.model_path, "model.path", tokenizer=True,
                        trust_remote_code=source.cfg.model.trust_remote_code)
    section = source.cfg.reward
    if reward and section.custom_fn_path is not None:
        check_reward_file(section.custom_fn_path, section.custom_fn_name, "reward.custom_fn_path", section.manager)
    return source


def _resolved(cfg: RunConfig) -> RunConfig:
    # dtype: auto as the run would resolve it (a run's own config.yaml holds its value already)
    return resolved_dtypes(dataclasses.replace(cfg, resources=resolved_resources(cfg.resources)))


def held_out_or_files(source: ModelSource, files: Sequence[str], max_samples: int | None,
                      tokenizer: Any) -> tuple[DataProto, list[str]]:
    """The prompts to score: `files` (verl columns), or the run's held-out prompts."""
    cfg = source.cfg
    if files:
        missing = [f for f in files if not Path(f).is_file()]
        if missing:
            raise FileNotFoundError(f"data file(s) not found: {missing}; give parquet or jsonl files in verl "
                                    "columns (prompt, data_source, reward_model.ground_truth)")
        limit = max_samples if max_samples is not None else cfg.data.max_val_samples
        return first_prompts(RLPromptDataset(list(files), tokenizer, cfg.data.prompt), limit), list(files)
    if source.checkpoint is None and source.run_dir is None and not cfg.data.val_files:
        raise ValueError("a Hugging Face model directory has no held-out prompts of its own; pass --data FILE")
    if max_samples is not None:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_val_samples=max_samples))
    batch = val_prompts(cfg, tokenizer)
    if batch is None:
        raise ValueError("the run has no held-out prompts (data.val_files is empty); pass --data FILE")
    return batch, ["<held-out prompts of the run>"]


def evaluate_source(source: ModelSource, files: Sequence[str] = (), max_samples: int | None = None) -> EvalReport:
    """Score the source's policy on the prompts (trainer.validation sampling: greedy by
    default); the report keeps every response (evaluate.response_records)."""
    cfg = source.cfg
    tokenizer = load_tokenizer(source.model_path, trust_remote_code=cfg.model.trust_remote_code)
    prompts, data = held_out_or_files(source, files, max_samples, tokenizer)
    if cfg.reward.custom_fn_path is None:  # the built-in scorers must know every data source
        check_scorers(prompts.non_tensor_batch["data_source"], "--data" if files else "data.val_files")
    reward = build_reward_manager(cfg, tokenizer)
    try:
        with loaded_actor(source) as (actor, generation_groups):
            metrics, responses = evaluate_responses(actor, prompts, reward, generation_groups,
                                                    cfg.trainer.validation)
    finally:
        reward.close()
    return EvalReport(source, data, metrics, responses)


def export_source(source: ModelSource, out_dir: str | Path) -> Path:
    """Write the checkpoint's policy as a Hugging Face model directory (LoRA merged).
    `out_dir` must not exist or be empty: nothing there is ever replaced."""
    out = Path(out_dir)
    refuse_existing_dir(out)
    if source.checkpoint is None:
        raise ValueError(f"{str(source.path)!r} is already a Hugging Face model directory; export takes a run "
                         "directory or a checkpoint directory")
    with loaded_actor(source) as (actor, _):
        refuse_existing_dir(out)  # again: the actor took a while to start
        actor.export_hf(str(out))
        write_model_presets(out, source.cfg, f"checkpoint {source.checkpoint} (step {source.step})")
    return out


def refuse_existing_dir(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{str(path)!r} exists and is not an empty directory; nothing is overwritten. "
                              "Pick a new --out directory")


def write_json_once(path: str | Path, data: dict[str, Any]) -> Path:
    """Write `data` to a new file (exclusive create: an existing file is never replaced)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    return path


@contextmanager
def loaded_actor(source: ModelSource) -> Iterator[tuple[WorkerGroup, int]]:
    """(actor group, generation groups): Ray joined or started, the actor built from the
    source's model with the checkpoint's weights; everything stopped on exit."""
    cfg = source.cfg
    layout = validate_run_config(cfg)
    ray_hold = RayHold(cfg.resources.ray_address, layout.world_size * rank_cpus(cfg.resources, layout),
                       cfg.resources.nodes)
    ray_hold.use()
    groups: dict[str, WorkerGroup] = {}
    try:
        # Only the policy: no reference model, no critic (they do not change its answers).
        config = dataclasses.replace(actor_config(cfg, source.model_path), use_reference=False)
        groups = build_groups(cfg, layout, {"actor": RoleSpec(ActorRolloutRefWorker, (config,))})
        if source.checkpoint is not None:
            groups["actor"].load_checkpoint(actor_checkpoint_path(source.checkpoint))
        yield groups["actor"], layout.rollout_groups
    finally:
        shutdown_role_groups(groups)
        ray_hold.close()
