"""What the planner plans for: the step's phases, each role's model and batch settings,
the cluster, and what the runtime can do (`Problem`).

`problem_from_config(cfg, cluster)` reads a RunConfig: the dataflow from its algorithm's
registry row (`AlgorithmSpec.phases`), filtered by the run's settings (reward model,
reference policy, fused old log-probs); the model shapes from model.* / critic.* /
reward_model.*; batch sizes from data, rollout and the roles' micro_batch sections.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from hybridflow.config.dataflow import FlowPhase
from hybridflow.config.schema import RunConfig
from hybridflow.planner.devices import DeviceSpec, Efficiency, load_device
from hybridflow.planner.model import ModelShape
from hybridflow.rewards.templates import model_weight


@dataclass(frozen=True)
class Cluster:
    """nodes x devices_per_node devices of one type, with its efficiency factors."""

    nodes: int
    devices_per_node: int
    device: DeviceSpec
    efficiency: Efficiency

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @classmethod
    def of(cls, nodes: int, devices_per_node: int, device: str) -> Cluster:
        if nodes < 1 or devices_per_node < 1:
            raise ValueError(f"a cluster needs nodes >= 1 and devices_per_node >= 1, got {nodes} x {devices_per_node}")
        spec, eff = load_device(device)
        return cls(nodes, devices_per_node, spec, eff)


@dataclass(frozen=True)
class Capabilities:
    """What the runtime that will run the mapping supports.

    together: groups of roles that must share one pool (here: the reference policy, reward
        and cost models live on the actor's ranks; the critics share the critic pool).
    shares_engine: role -> the role whose engine (and so parallel sizes) it runs in (here the
        reference policy is a second model inside the actor's worker).
    pipeline: pipeline-parallel training (the engine here has none).
    overlap: phases of one stage on different pools run at the same time (the paper's
        runtime), whatever the program's blocks.
    blocks: phases of one `concurrently` block of the program (FlowPhase.block) on different
        pools run at the same time, each with its call's dispatch and collection
        (Efficiency.call_s); everything else one after another (this trainer with
        trainer.concurrent_phases: true; trainer/programs/concurrent.py). With neither, every
        phase runs after the one before (trainer.concurrent_phases: false).
    A pool is one set of processes: its phases run one after another in any case.
    """

    together: tuple[tuple[str, ...], ...] = ()
    shares_engine: tuple[tuple[str, str], ...] = ()
    pipeline: bool = True
    overlap: bool = True
    blocks: bool = False

    def __post_init__(self) -> None:
        if self.overlap and self.blocks:
            raise ValueError("Capabilities: overlap (every stage's pools at once) already covers blocks; "
                             "set one of them")

    @classmethod
    def here(cls, concurrent_phases: bool) -> Capabilities:
        """What hybridflow's trainer runs (resources.placement colocated / split), with
        `concurrent_phases` the run's trainer.concurrent_phases (`for_run` reads it)."""
        return cls(together=(("actor", "reference", "reward_model", "cost_model"), ("critic", "cost_critic")),
                   shares_engine=(("reference", "actor"),), pipeline=False, overlap=False,
                   blocks=concurrent_phases)

    @classmethod
    def for_run(cls, cfg: RunConfig) -> Capabilities:
        """`here` for the run config `cfg`: its trainer.concurrent_phases decides the blocks."""
        return cls.here(concurrent_phases=cfg.trainer.concurrent_phases)


@dataclass(frozen=True)
class RoleLoad:
    """A role's model and how it is batched.

    dtype_bytes: bytes per element of weights / activations in compute; trainable roles keep
    fp32 master weights, fp32 gradients and two fp32 Adam moments (16 bytes per parameter).
    """

    shape: ModelShape
    trainable: bool
    dtype_bytes: int
    micro_batch: int  # update micro-batch per device (trainable roles)
    forward_micro_batch: int  # scoring micro-batch per device
    mini_batch: int  # sequences per optimizer step over all dp ranks
    epochs: int = 1
    gradient_checkpointing: bool = False


@dataclass(frozen=True)
class Workload:
    prompts: int
    samples: int  # rollout.n
    prompt_len: int
    response_len: int
    max_num_seqs: int = 256  # sequences one generation replica decodes at once
    gen_dtype_bytes: int = 2

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len


@dataclass(frozen=True)
class Problem:
    phases: tuple[FlowPhase, ...]
    roles: dict[str, RoleLoad]
    workload: Workload
    cluster: Cluster
    caps: Capabilities = field(default_factory=Capabilities)

    @property
    def model_roles(self) -> tuple[str, ...]:
        """Roles that need devices, actor first."""
        return tuple(r for r in self.roles)

    @functools.cached_property
    def overlapped_blocks(self) -> tuple[str, ...]:
        """The `concurrently` blocks whose pools the simulator overlaps (Capabilities.blocks),
        in program order: those whose active phases run on roles that can sit in different
        pools (not all of one Capabilities.together group; e.g. PPO's log-probs and values,
        not GRPO's old and reference log-probs, which share the actor's processes). None
        without the capability."""
        if not self.caps.blocks:
            return ()
        group = {role: i for i, roles in enumerate(self.caps.together) for role in roles}
        roles_of: dict[str, set] = {}
        for p in self.phases:
            if p.block is not None:
                roles_of.setdefault(p.block, set()).add(group.get(p.role, p.role))
        return tuple(block for block, groups in roles_of.items() if len(groups) > 1)


def active_phases(phases: tuple[FlowPhase, ...], settings: dict[str, bool]) -> tuple[FlowPhase, ...]:
    """The phases whose `when` holds in `settings` (condition -> bool, "always" implied)."""
    return tuple(p for p in phases if p.when == "always" or settings[p.when])


def run_settings(cfg: RunConfig) -> dict[str, bool]:
    """The conditions of hybridflow/config/dataflow.py for a run config."""
    return {"reward_model": cfg.reward_model.path is not None, "cost_model": cfg.cost_model.path is not None,
            "reference": cfg.use_reference, "old_log_probs": not cfg.fuses_old_log_probs,
            "rule_reward": (cfg.reward_model.path is None or cfg.reward_model.add_rule_reward
                            or model_weight(cfg.reward.templates) is not None),
            "rule_cost": cfg.cost_model.custom_fn_path is not None}


def _dtype_bytes(name: str, use_gpu: bool) -> int:
    # "auto" is bf16 on GPUs. On CPUs a run measures it (config/dtypes.py); the plan counts
    # fp32 there, the precision the CPU efficiency factors were fitted in (devices.py).
    return 4 if name == "fp32" or (name == "auto" and not use_gpu) else 2


def policy_shape(cfg: RunConfig) -> ModelShape:
    """The actor's model: model.path's config, or the built-in model's sizes."""
    from hybridflow.engines.models import load_hf_config

    if cfg.model.path is not None:
        return ModelShape.from_hf(load_hf_config(cfg.model.path, trust_remote_code=cfg.model.trust_remote_code))
    if cfg.model.pretrained is not None:
        from hybridflow.engines.pretrained import pretrained_model_dir  # converts on first use

        return ModelShape.from_hf(load_hf_config(pretrained_model_dir(cfg.model.pretrained), trust_remote_code=False))
    from hybridflow.data.tokenizer import build_char_tokenizer

    b = cfg.model.builtin
    vocab = len(build_char_tokenizer(b.max_position_embeddings))
    return ModelShape(b.num_hidden_layers, b.hidden_size, b.intermediate_size, b.num_attention_heads,
                      b.num_key_value_heads, vocab)


def problem_from_config(cfg: RunConfig, cluster: Cluster, caps: Capabilities | None = None,
                        model: ModelShape | None = None) -> Problem:
    """The planning problem of a run config on `cluster` (`model`: replace every role's
    model with this shape, e.g. a paper-scale Llama)."""
    from hybridflow.engines.models import load_hf_config

    gpu = cluster.device.name != "cpu"
    policy = model or policy_shape(cfg)
    trust = cfg.model.trust_remote_code
    phases = active_phases(cfg.algorithm.spec.phases, run_settings(cfg))

    def load(section, shape: ModelShape, trainable: bool) -> RoleLoad:
        mb = section.micro_batch
        return RoleLoad(shape, trainable, _dtype_bytes(section.dtype, gpu),
                        micro_batch=getattr(mb, "micro_batch_size_per_device", 0),
                        forward_micro_batch=mb.forward_micro_batch_size_per_device,
                        mini_batch=getattr(mb, "mini_batch_size", 0), epochs=getattr(mb, "epochs", 1),
                        gradient_checkpointing=bool(getattr(section, "gradient_checkpointing", False)))

    roles: dict[str, RoleLoad] = {"actor": load(cfg.actor, policy, True)}
    needed = {p.role for p in phases}
    if "reference" in needed:
        roles["reference"] = load(cfg.actor, policy, False)
    for critic in cfg.algorithm.spec.critics:
        shape = policy if model or cfg.critic.model_path is None else ModelShape.from_hf(
            load_hf_config(cfg.critic.model_path, trust_remote_code=trust))
        roles[critic] = load(cfg.critic, shape.with_head("value"), True)
    for key in ("reward_model", "cost_model"):
        if key in needed:
            section = getattr(cfg, key)
            shape = model or ModelShape.from_hf(load_hf_config(section.path, trust_remote_code=trust))
            roles[key] = load(section, shape.with_head("value"), False)
    workload = Workload(cfg.data.train_batch_size, cfg.rollout.n, cfg.data.prompt.max_prompt_length,
                        cfg.rollout.response_length, cfg.rollout.max_num_seqs, _dtype_bytes(cfg.rollout.dtype, gpu))
    return Problem(phases, roles, workload, cluster, caps or Capabilities())
