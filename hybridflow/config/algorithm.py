"""What each `algorithm.name` is, in one place: the algorithm registry (one `AlgorithmSpec`
row per algorithm holds everything its name implies) and the `algorithm` section of the run
config. Config validation, presets and `RunConfig.use_critic`, the trainer's roles,
placement, checkpointed roles and the program it runs all ask the row; no code compares
algorithm names. docs/algorithms.md lists the built-in rows, docs/extending.md says how to
add one.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from collections.abc import Callable
from operator import attrgetter
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from hybridflow.algorithms.settings import ADV_ESTIMATORS, KL_ESTIMATORS, AdvantageConfig
from hybridflow.config.algorithm_settings import (
    DAPOSection,
    ExplorationSection,
    KLControlSection,
    SafeRLHFSection,
    overlong_buffer_len,
)
from hybridflow.config.dataflow import FlowPhase, standard_dataflow
from hybridflow.config.env_algorithms import EnvAlgorithm, PolicyDefaults, check_replay_sizes, check_rollout_sizes
from hybridflow.config.loader import ConfigError
from hybridflow.registry import Registry, import_file, suggest

if TYPE_CHECKING:
    from hybridflow.config.schema import RunConfig

# Critic-free estimators that need several samples per prompt (a group baseline).
GROUP_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline")
# The value models a program can ask for (hybridflow.trainer.programs.phases.Roles has a field for
# each): CriticWorkers with the critic.* settings.
VALUE_ROLES = ("critic", "cost_critic")
# Metadata that marks a field of AlgorithmSection as a settings section an algorithm may read.
_SETTINGS = {"algorithm_settings": True}

ProgramT = TypeVar("ProgramT", bound=Callable[..., None])


@dataclass(frozen=True)
class AlgorithmSpec:
    """Everything an `algorithm.name` implies (docs/extending.md explains each field).

    name: the value of algorithm.name (lowercase letters, digits, _).
    estimators: the algorithm.adv_estimator values it accepts on language-model tasks; the
        first is its default (null). Empty: the algorithm does not run on them.
    program: the step function, `program(step, roles, cfg, state) -> None`, run once per RL
        step, or its "module:function" import path; `@register_algorithm` fills it in.
    critics: the value models it trains, from VALUE_ROLES (ppo: critic; safe_rlhf: critic and
        cost_critic); each takes the critic.* settings, goes on the critic ranks with split
        placement and into checkpoints. Empty: critic-free.
    cost: it scores a cost per response from cost_model.* (a cost model and/or a rule-based
        cost function, one of which must be set); algorithms without a cost refuse cost_model.*.
    min_samples: rollout.n at least (group baselines compare the samples of a prompt).
    presets: dotted config keys and the values the name sets, unless the YAML file or an
        override sets that key itself (`load_run_config`).
    required: preset keys the algorithm is defined by; another value is a ConfigError.
    settings: the section of `algorithm` it reads (dapo, safe_rlhf) or None; a section set in
        a run whose algorithm does not read it is a ConfigError.
    check: its own check of the run config (run by validate_run_config); raises ConfigError.
    dataflow: the phases its program runs and the `concurrently` block each runs in
        (hybridflow/config/dataflow.py), read by the auto-mapping planner; None:
        `standard_dataflow(critics, cost)`, the shape and blocks of every built-in
        generate -> score -> log-probs -> values -> update program.

    Capabilities: what the program needs from an execution mode beyond generate-and-score
    (trainer.mode sync / one_step_off / async run the same program; each mode serves these
    its own way, or refuses the run with a ConfigError naming the capability):
    greedy_baseline: one greedy response per prompt, scored, besides the sampled ones (ReMax's
        `compute_greedy_baseline` phase); the asynchronous modes generate and score it on the
        rollout pool with the prompt's group.
    dynamic_sampling: only the prompt groups whose scores differ are trained on
        (`sample_informative_groups`, with the `filter_groups` settings of its settings
        section); the asynchronous modes filter the stream of groups as they arrive.
    lagrangian: a Lagrange multiplier in the cross-step state (the `multiplier()` of its
        settings section), checkpointed with the run (Safe-RLHF).

    environment: what it implies on environment tasks (its program, config section,
        collection, network defaults, checks: config/env_algorithms.py EnvAlgorithm); None:
        the algorithm does not run on them.
    exploration: the program samples again the prompts whose group scored all alike, with
        the algorithm.exploration budget (`sample_groups` in trainer/programs/algorithms.py);
        served in trainer.mode sync only.
    """

    name: str
    estimators: tuple[str, ...] = ()
    program: Callable[..., None] | str | None = None
    critics: tuple[str, ...] = ()
    cost: bool = False
    min_samples: int = 1
    presets: tuple[tuple[str, object], ...] = ()
    required: tuple[str, ...] = ()
    settings: str | None = None
    check: Callable[[RunConfig], None] | None = None
    dataflow: tuple[FlowPhase, ...] | None = None
    greedy_baseline: bool = False
    dynamic_sampling: bool = False
    lagrangian: bool = False
    environment: EnvAlgorithm | None = None
    exploration: bool = False

    def __post_init__(self) -> None:
        where = f"AlgorithmSpec(name={self.name!r})"
        if not isinstance(self.name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"{where}: the name must be lowercase letters, digits and _, starting with a letter")
        if not self.estimators and self.environment is None:
            raise ValueError(f"{where}: it declares no task kind; list the adv_estimator names it accepts on "
                             "language-model tasks (default first) and/or its `environment` part")
        for estimator in self.estimators:
            ADV_ESTIMATORS.check(estimator)  # unknown names raise, listing the registered ones
        if any(role not in VALUE_ROLES for role in self.critics) or len(set(self.critics)) != len(self.critics):
            raise ValueError(f"{where}: critics must be distinct roles from {list(VALUE_ROLES)}, got {self.critics}")
        if self.min_samples < 1:
            raise ValueError(f"{where}: min_samples must be >= 1, got {self.min_samples}")
        unset = [key for key in self.required if key not in dict(self.presets)]
        if unset:
            raise ValueError(f"{where}: required keys {unset} have no preset value; add them to presets")
        if self.settings is not None and self.settings not in settings_sections():
            raise ValueError(f"{where}: settings={self.settings!r} is not a settings section of `algorithm`; "
                             f"use one of {list(settings_sections())} or None")
        if not (self.program is None or callable(self.program)
                or isinstance(self.program, str) and re.fullmatch(r"[\w.]+:\w+", self.program)):
            raise ValueError(f"{where}: program must be a function or a 'module:function' path, got {self.program!r}")
        for capability, needs in (("dynamic_sampling", "filter_groups"), ("lagrangian", "multiplier")):
            if getattr(self, capability) and not hasattr(_section_default(self.settings), needs):
                raise ValueError(f"{where}: {capability}=True reads `{needs}` from its settings section; "
                                 f"settings={self.settings!r} has none (name a section that has it)")
        if self.check is not None and not callable(self.check):
            raise ValueError(f"{where}: check must be a function of the run config or None, got {self.check!r}")

    @property
    def task_kinds(self) -> tuple[str, ...]:
        """The task kinds it runs on (config/tasks.py), from what the row declares."""
        return (*(("language_model",) if self.estimators else ()), *(("environment",) if self.environment else ()))

    @property
    def default_estimator(self) -> str:
        """algorithm.adv_estimator when it is null."""
        return self.estimators[0]

    @property
    def phases(self) -> tuple[FlowPhase, ...]:
        """The dataflow of its program (`dataflow`, or the standard one of its critics and cost)."""
        return self.dataflow if self.dataflow is not None else standard_dataflow(self.critics, self.cost)

    @property
    def capabilities(self) -> tuple[str, ...]:
        """The capability fields this row declares (see the class docstring)."""
        return tuple(name for name in CAPABILITIES if getattr(self, name))

    @property
    def trained_roles(self) -> tuple[str, ...]:
        """The roles RL updates and checkpoints save: the actor and the critics."""
        return ("actor", *self.critics)


# The module names of algorithm.module files (one module per file, whatever its name).
USER_MODULE_PREFIX = "hybridflow_user_algorithm_"
# The capability fields of AlgorithmSpec (what a program needs from an execution mode).
CAPABILITIES = ("greedy_baseline", "dynamic_sampling", "lagrangian", "exploration")


def _section_default(section: str | None) -> object:
    """A default instance of the settings section `section` of `algorithm` (None: none)."""
    fields = {f.name: f for f in dataclasses.fields(AlgorithmSection)}
    return None if section is None else fields[section].default_factory()


# ----------------------------------------------------------------------------- registry

def _program_id(program: Any) -> str:
    if isinstance(program, str) or program is None:
        return str(program)
    return f"{program.__module__}:{getattr(program, '__qualname__', type(program).__name__)}"


def _programs(spec: AlgorithmSpec) -> str:
    """The programs a row names (two rows are the same definition when they name the same ones)."""
    env = spec.environment.program if spec.environment is not None else None
    return "program " + " + ".join(_program_id(p) for p in (spec.program, env) if p is not None)


# The one Registry mechanism (hybridflow/registry.py), with AlgorithmSpec rows as entries:
# two rows are the same definition when they name the same program.
ALGORITHMS: Registry[AlgorithmSpec] = Registry("algorithm", "algorithm.name", rows=True, identity=_programs)


def add_algorithm(spec: AlgorithmSpec, *, override: bool = False) -> AlgorithmSpec:
    """Register `spec`, whose programs are set (a function or a 'module:function' path for
    language-model tasks; an EnvProgram or its path in its `environment` part).

    Registering a name again is allowed only with the same programs (a module imported a
    second time, e.g. reloaded in a notebook), which replaces the row, or override=True.
    """
    if (spec.estimators and spec.program is None) or (spec.environment and spec.environment.program is None):
        raise ValueError(f"algorithm {spec.name!r} has no program; decorate it with @register_algorithm(spec)")
    return ALGORITHMS.add(spec.name, spec, override=override)


def register_algorithm(spec: AlgorithmSpec, *, override: bool = False) -> Callable[[ProgramT], ProgramT]:
    """Decorator: register `spec` with the decorated function as its step program (of its
    `environment` part when the row declares only that: an EnvProgram).

        @register_algorithm(AlgorithmSpec(name="my_algo", estimators=("grpo",), min_samples=2))
        def my_algo(step, roles, cfg, state): ...
    """
    env_only = spec.environment is not None and not spec.estimators
    named = spec.environment.program if env_only else spec.program
    if named is not None:
        raise ValueError(f"AlgorithmSpec(name={spec.name!r}) already names program {_program_id(named)}; "
                         "leave program unset when decorating, or call add_algorithm(spec)")

    def decorate(program: ProgramT) -> ProgramT:
        filled = (dataclasses.replace(spec, environment=dataclasses.replace(spec.environment, program=program))
                  if env_only else dataclasses.replace(spec, program=program))
        add_algorithm(filled, override=override)
        return program

    return decorate


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The row of `name`; a ConfigError naming the registered algorithms if there is none."""
    if name in ALGORITHMS.entries:
        return ALGORITHMS.entries[name]
    close = suggest(name, list(ALGORITHMS.entries))
    raise ConfigError(f"{name!r} is not a registered algorithm" + (f"; did you mean {close[0]!r}?" if close else ".")
                      + f" Registered: {', '.join(ALGORITHMS.entries)}. An algorithm of your own is registered by its "
                      "module (@register_algorithm): name that module in algorithm.module (docs/extending.md)",
                      "algorithm.name")


def algorithm_names(task_kind: str | None = None) -> tuple[str, ...]:
    """Every registered algorithm.name (of one task kind), built-in ones first, in registration order."""
    return tuple(name for name, spec in ALGORITHMS.entries.items() if task_kind in (None, *spec.task_kinds))


def env_algorithm(cfg: Any) -> EnvAlgorithm:
    """The `environment` part of the run's algorithm; a ConfigError keyed `algorithm` when it
    has none (a language-model algorithm named in an environment task)."""
    spec = cfg.algorithm.spec
    if spec.environment is None:
        raise ConfigError(f"{spec.name!r} runs on language-model tasks only; environment tasks run "
                          f"{', '.join(algorithm_names('environment'))}", "algorithm")
    return spec.environment


def _import_algorithm_module(module: str) -> ModuleType:
    """Import algorithm.module once per process: a dotted import path (a module on the
    Python path) or the path of a .py file; importing it runs its @register_algorithm.
    ConfigErrors are keyed relative to the algorithm section (AlgorithmSection calls this)."""
    if module.endswith(".py"):
        if not Path(module).is_file():
            raise ConfigError(f"there is no such file as {module!r} ({Path(module).resolve()}); give the path of the "
                              ".py file that registers the algorithm (relative paths start from the working "
                              "directory)", "module")
        return import_file(Path(module), USER_MODULE_PREFIX)  # one module per file, whatever its name
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or not (module == err.name or module.startswith(f"{err.name}.")):
            raise  # the module exists; something it imports is missing
        raise ConfigError(f"{module!r} cannot be imported ({err}); give a module on the Python path (pip install "
                          "-e your package, or PYTHONPATH) or the path of a .py file", "module") from err


# ----------------------------------------------------------------------------- the config section


@dataclass
class AlgorithmSection(AdvantageConfig):
    """Which step program runs and its advantage / KL settings (docs/algorithms.md).

    gamma, lam, norm_adv_by_std_in_grpo, epsilon, whiten_gae_advantages, gpg_norm_by_std:
        the advantage estimators' settings, inherited from AdvantageConfig (defined once,
        there; `advantage_config()` hands them to the estimators).

    name: a registered algorithm (algorithm_names(): grpo, ppo, remax, rloo,
        reinforce_plus_plus, reinforce_plus_plus_baseline, drgrpo, dapo, safe_rlhf, and those
        of algorithm.module); the name also sets the defaults in its presets (e.g. drgrpo: no
        std normalisation, seq-mean-token-sum-norm).
    module: a module that registers more algorithms (dotted import path or .py file),
        imported before `name` is looked up; null: the built-in ones (and any your code imported).
    adv_estimator: null = the algorithm's own; grpo and dapo also accept the other group
        estimators (rloo, opo, ...).
    use_kl_in_reward / kl_penalty / kl_ctrl: r_t = score_t - beta * KL_t (needs the
        reference policy). KL as a loss instead is actor.loss.use_kl_loss.
    dapo / safe_rlhf: settings read only by the algorithms whose spec names the section.
    exploration: sampling again the prompts whose group scored all alike, within a budget
        (ExplorationSection; off by default); read by the rows with the exploration capability.
    """

    name: str = "grpo"
    module: str | None = None
    adv_estimator: str | None = None
    use_kl_in_reward: bool = False
    kl_penalty: str = "k1"
    kl_ctrl: KLControlSection = field(default_factory=KLControlSection)
    dapo: DAPOSection = field(default_factory=DAPOSection, metadata=_SETTINGS)
    safe_rlhf: SafeRLHFSection = field(default_factory=SafeRLHFSection, metadata=_SETTINGS)
    exploration: ExplorationSection = field(default_factory=ExplorationSection)

    def __post_init__(self) -> None:
        super().__post_init__()  # AdvantageConfig's checks
        # ConfigError keys are relative to this section (the loader puts "algorithm." in front).
        if self.module is not None:
            _import_algorithm_module(self.module)
        self.name = ALGORITHMS.folded(self.name)  # "GRPO" names the registered "grpo", as environment tasks' "PPO"
        try:
            self.spec
        except ConfigError as err:
            raise ConfigError(err.message, "name") from None
        if self.adv_estimator is not None:
            ADV_ESTIMATORS.check(self.adv_estimator)  # unknown names raise, listing the known ones
        if self.use_kl_in_reward:
            KL_ESTIMATORS.check(self.kl_penalty)

    @property
    def spec(self) -> AlgorithmSpec:
        """The registry row of `name`."""
        return algorithm_spec(self.name)

    @property
    def settings(self) -> object | None:
        """The settings section its algorithm reads (algorithm.dapo, algorithm.safe_rlhf, ...) or None."""
        section = self.spec.settings
        return None if section is None else getattr(self, section)

    @property
    def estimator(self) -> str:
        return self.adv_estimator if self.adv_estimator is not None else self.spec.default_estimator

    def advantage_config(self) -> AdvantageConfig:
        """The AdvantageConfig part of this section (every one of its fields)."""
        return AdvantageConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(AdvantageConfig)})


def settings_sections() -> tuple[str, ...]:
    """The sections of `algorithm` that only the algorithms declaring them read."""
    return tuple(f.name for f in dataclasses.fields(AlgorithmSection) if "algorithm_settings" in f.metadata)


def _estimator_hint(spec: AlgorithmSpec) -> str:
    what = f"algorithm.name={spec.name} " + ("trains a critic and " if spec.critics else "")
    if spec.estimators == GROUP_ESTIMATORS and not spec.critics:
        return what + f"is critic-free and needs a group estimator {list(GROUP_ESTIMATORS)}"
    if len(spec.estimators) == 1:
        return what + f"uses adv_estimator={spec.default_estimator} (leave it null)"
    return what + f"accepts adv_estimator in {list(spec.estimators)} (null: {spec.default_estimator})"


# ----------------------------------------------------------------------------- checks


def check_algorithm(cfg: RunConfig) -> None:
    """algorithm.name against the settings its row implies and reads (validate_run_config)."""
    alg, spec = cfg.algorithm, cfg.algorithm.spec
    if not spec.estimators:
        raise ConfigError(f"{alg.name!r} runs on environment tasks only (name an environment: env.id); "
                          f"language-model tasks run {', '.join(algorithm_names('language_model'))}", "algorithm.name")
    if alg.estimator not in spec.estimators:
        owners = [s.name for s in ALGORITHMS.entries.values() if s.estimators and s.default_estimator == alg.estimator]
        raise ConfigError(f"{alg.estimator!r}, but {_estimator_hint(spec)}"
                          + (f"; for {alg.estimator} use algorithm.name={owners[0]}" if owners else ""),
                          "algorithm.adv_estimator")
    if cfg.rollout.n < spec.min_samples:
        raise ConfigError(
            f"rollout.n={cfg.rollout.n}: algorithm.name={alg.name} compares the samples of one prompt with each "
            f"other and needs rollout.n >= {spec.min_samples}"
        )
    presets = dict(spec.presets)
    for key in spec.required:
        value = attrgetter(key)(cfg)
        if value != presets[key]:
            raise ConfigError(
                f"algorithm.name={alg.name} is defined by {key}={json.dumps(presets[key])}, got {json.dumps(value)}; "
                f"remove that setting (the name sets it) or choose another algorithm.name"
            )
    for section in settings_sections():
        if spec.settings != section and getattr(alg, section) != _section_default(section):
            raise ConfigError(f"algorithm.{section}.* is read only by algorithm.name="
                              f"{_readers(lambda s: s.settings == section)} (this run: {alg.name}); remove it")
    if alg.exploration.enabled and not spec.exploration:
        raise ConfigError(f"is read only by algorithm.name={_readers(lambda s: s.exploration)}, whose groups of "
                          f"samples are compared with each other (this run: {alg.name}); set it to 0",
                          "algorithm.exploration.max_extra_groups")
    if spec.cost and cfg.cost_model.path is None and cfg.cost_model.custom_fn_path is None:
        raise ConfigError(f"algorithm.name={alg.name} needs a cost: set cost_model.path (a cost model directory) "
                          "and/or cost_model.custom_fn_path (a Python file with a rule-based cost function)")
    if not spec.cost and cfg.cost_model != type(cfg.cost_model)():
        raise ConfigError(f"cost_model.* is read only by algorithm.name={_readers(lambda s: s.cost)}, the "
                          f"algorithms that score a cost (this run: {alg.name}); remove it")
    if spec.check is not None:
        spec.check(cfg)


def _readers(reads: Callable[[AlgorithmSpec], bool]) -> str:
    return " or ".join(s.name for s in ALGORITHMS.entries.values() if reads(s)) or "(none registered)"


def resolved_algorithm(cfg: RunConfig) -> AlgorithmSection:
    """cfg.algorithm with the nulls filled that stand for a value: adv_estimator, and those of
    the settings section the algorithm reads (its `resolved(cfg)`, e.g. algorithm.dapo's
    overlong_buffer.len; the sections it does not read keep their defaults, as
    check_algorithm expects)."""
    alg = cfg.algorithm
    section, resolve = alg.spec.settings, getattr(alg.settings, "resolved", None)
    filled = {section: resolve(cfg)} if resolve is not None else {}
    return dataclasses.replace(alg, adv_estimator=alg.estimator, **filled)


def _check_dapo(cfg: RunConfig) -> None:
    policy = cfg.actor.loss.policy
    if not policy.clip_ratio_high > policy.clip_ratio_low:
        raise ConfigError(
            f"algorithm.name={cfg.algorithm.name} clips higher than lower (clip-higher): "
            f"actor.loss.policy.clip_ratio_high={policy.clip_ratio_high} must be > clip_ratio_low={policy.clip_ratio_low}"
        )
    dapo = cfg.algorithm.dapo
    if dapo.filter_groups.metric == "shaped_score" and not (dapo.overlong_buffer.enable and cfg.trainer.mode == "sync"):
        raise ConfigError("algorithm.dapo.filter_groups.metric=shaped_score tells groups apart by the score with the "
                          "overlong penalty: it needs algorithm.dapo.overlong_buffer.enable=true and trainer.mode=sync "
                          "(the asynchronous modes filter the stream on the score)")
    if cfg.algorithm.dapo.overlong_buffer.enable and overlong_buffer_len(cfg) > cfg.rollout.response_length:
        raise ConfigError(
            f"algorithm.dapo.overlong_buffer.len={overlong_buffer_len(cfg)} exceeds rollout.response_length="
            f"{cfg.rollout.response_length}; the buffer is the last tokens of the allowed length"
        )


# ----------------------------------------------------------------------------- built-in algorithms

_PROGRAMS = "hybridflow.trainer.programs.algorithms"  # where the built-in programs live (see the module docstring)
_ENV_PPO = EnvAlgorithm(section="ppo", collection="rollout", policy=PolicyDefaults((64, 64), "tanh", True),
                        program=f"{_PROGRAMS}:PPO", check=check_rollout_sizes)

for _spec in (
    AlgorithmSpec("grpo", GROUP_ESTIMATORS, f"{_PROGRAMS}:critic_free", min_samples=2, exploration=True),
    AlgorithmSpec("ppo", ("gae",), f"{_PROGRAMS}:ppo", critics=("critic",), environment=_ENV_PPO),
    AlgorithmSpec("remax", ("remax",), f"{_PROGRAMS}:remax", greedy_baseline=True, dataflow=standard_dataflow(
        (), False, extra_scoring=(FlowPhase("greedy_baseline", "actor", "generate", samples_per_prompt=1),))),
    AlgorithmSpec("rloo", ("rloo",), f"{_PROGRAMS}:critic_free", min_samples=2, exploration=True),
    AlgorithmSpec("reinforce_plus_plus", ("reinforce_plus_plus",), f"{_PROGRAMS}:critic_free"),
    AlgorithmSpec("reinforce_plus_plus_baseline", ("reinforce_plus_plus_baseline",), f"{_PROGRAMS}:critic_free",
                  min_samples=2, exploration=True),
    # Dr.GRPO (Liu et al. 2025): group-centred rewards without the std, length-unbiased loss.
    AlgorithmSpec(
        "drgrpo", ("grpo",), f"{_PROGRAMS}:critic_free", min_samples=2, exploration=True,
        presets=(("algorithm.norm_adv_by_std_in_grpo", False),
                 ("actor.loss.policy.loss_agg_mode", "seq-mean-token-sum-norm")),
        required=("algorithm.norm_adv_by_std_in_grpo", "actor.loss.policy.loss_agg_mode"),
    ),
    # DAPO (Yu et al. 2025): token-level loss and clip-higher (paper: eps_high 0.28).
    AlgorithmSpec(
        "dapo", GROUP_ESTIMATORS, f"{_PROGRAMS}:dapo", min_samples=2,
        presets=(("actor.loss.policy.loss_agg_mode", "token-mean"), ("actor.loss.policy.clip_ratio_high", 0.28)),
        required=("actor.loss.policy.loss_agg_mode",), settings="dapo", check=_check_dapo, dynamic_sampling=True,
    ),
    # Safe-RLHF (Dai et al. 2023): reward and cost critics under a Lagrange multiplier.
    AlgorithmSpec("safe_rlhf", ("gae",), f"{_PROGRAMS}:safe_rlhf", critics=("critic", "cost_critic"), cost=True,
                  settings="safe_rlhf", lagrangian=True),
    # SAC (Haarnoja et al. 2018), environment tasks only.
    AlgorithmSpec("sac", environment=EnvAlgorithm(
        section="sac", collection="replay", policy=PolicyDefaults((256, 256), "relu", False), program=f"{_PROGRAMS}:SAC",
        continuous_actions=True, check=check_replay_sizes)),
):
    add_algorithm(_spec)
del _spec
