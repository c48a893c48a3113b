"""Peak memory per device of a role: what stays resident and what one phase adds."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.dataflow import FlowPhase
from hybridflow.planner.cost import Parallel, reshard_costs
from hybridflow.planner.problem import RoleLoad, Workload

ADAM_TRAIN_BYTES = 16  # per parameter: fp32 master + fp32 grad + 2 fp32 moments
PREFILL_TOKENS = 8192  # rollout.prefill_token_budget default: tokens per prefill forward


@dataclass(frozen=True)
class RoleMemory:
    """Bytes per device: resident, and the addition of each of the role's phases."""

    resident: float
    transient: dict[str, float]
    parts: dict[str, float]

    @property
    def peak_transient(self) -> float:
        return max(self.transient.values(), default=0.0)


def resident_bytes(load: RoleLoad, par: Parallel) -> float:
    per_param = ADAM_TRAIN_BYTES if load.trainable else load.dtype_bytes
    return per_param * load.shape.params / par.devices


def _layer_bytes(load: RoleLoad, par: Parallel) -> float:
    return load.dtype_bytes * load.shape.layer_matmul / par.tp


def _activation_elements_per_token(load: RoleLoad) -> int:
    s = load.shape
    return 6 * s.hidden + 2 * s.kv_dim + 4 * s.intermediate


def _head_bytes(load: RoleLoad, tokens: float, par: Parallel, backward: bool) -> float:
    # logits in the compute dtype, their fp32 upcast and log-softmax, and (training) the fp32 gradient
    extra = 12 if backward else 8
    return tokens * load.shape.out_features * (load.dtype_bytes + extra) / par.tp


def train_bytes(load: RoleLoad, par: Parallel, work: Workload) -> float:
    tokens = load.micro_batch * work.seq_len
    per_token = _activation_elements_per_token(load)
    layers = load.shape.layers / par.pp
    if load.gradient_checkpointing:
        acts = tokens * (layers * load.shape.hidden + per_token) * load.dtype_bytes / par.tp
    else:
        acts = tokens * layers * per_token * load.dtype_bytes / par.tp
    return _layer_bytes(load, par) + acts + _head_bytes(load, tokens, par, backward=True)


def forward_bytes(load: RoleLoad, par: Parallel, work: Workload) -> float:
    tokens = load.forward_micro_batch * work.seq_len
    acts = tokens * _activation_elements_per_token(load) * load.dtype_bytes / par.tp
    return _layer_bytes(load, par) + acts + _head_bytes(load, tokens, par, backward=False)


def generate_bytes(load: RoleLoad, par: Parallel, work: Workload, samples_per_prompt: int | None) -> float:
    shape, t_g = load.shape, par.gen_tp
    c = reshard_costs(shape.reshard_sizes(), par, work.gen_dtype_bytes, load.dtype_bytes)
    replicas = par.devices // t_g
    per_prompt = work.samples if samples_per_prompt is None else samples_per_prompt
    wave = min(work.max_num_seqs, -(-work.prompts * per_prompt // replicas))
    kv = wave * work.seq_len * 2 * shape.layers * shape.kv_dim * work.gen_dtype_bytes / t_g
    logits = min(PREFILL_TOKENS, wave * work.prompt_len) * shape.vocab * 4 / t_g
    return c.generation_bytes + c.buffer_bytes + kv + logits


def role_memory(load: RoleLoad, par: Parallel, work: Workload, phases: list[FlowPhase]) -> RoleMemory:
    """Resident bytes and each of `phases`' addition for the role (module docstring)."""
    transient: dict[str, float] = {}
    for phase in phases:
        if phase.kind == "train":
            transient[phase.name] = train_bytes(load, par, work)
        elif phase.kind == "forward":
            transient[phase.name] = forward_bytes(load, par, work)
        elif phase.kind == "generate":
            transient[phase.name] = generate_bytes(load, par, work, phase.samples_per_prompt)
    resident = resident_bytes(load, par)
    return RoleMemory(resident, transient, {"resident": resident})
