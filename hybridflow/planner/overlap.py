"""Predicted step time of the trainer modes (sync | one_step_off | async) at cluster scale.

The placement simulator (simulate.py) plays one synchronous step. This module adds the
overlap of the asynchronous modes (docs/async.md): generation of step k+1 runs on its own
rollout pool while step k trains on the training pool, so
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hybridflow.planner.cost import Parallel, link_bw, phase_cost
from hybridflow.planner.problem import Cluster, Problem
from hybridflow.planner.simulate import USABLE_MEMORY

TRAINED_BYTES_PER_PARAM = 16  # fp32 master weights, gradients and two Adam moments (memory.py)

MODES = ("sync", "one_step_off", "async")


@dataclass(frozen=True)
class Lengths:
    """Response lengths of a long-tailed batch: the mean and the longest sample."""

    mean: int
    longest: int

    def __post_init__(self) -> None:
        if not 1 <= self.mean <= self.longest:
            raise ValueError(f"need 1 <= mean <= longest, got mean={self.mean}, longest={self.longest}")


@dataclass(frozen=True)
class ModeStep:
    """One mode's predicted step: its parts, the split, and trained samples per second."""

    mode: str
    gen_devices: int
    train_devices: int
    generate_s: float
    train_s: float
    sync_s: float
    step_s: float
    samples_per_s: float


def overlapped_step(mode: str, generate_s: float, train_s: float, sync_s: float) -> float:
    """The step time of `mode` from its phases (module docstring): sync runs generation
    then training; the asynchronous modes overlap them and add the weight sync."""
    if mode == "sync":
        return generate_s + train_s
    if mode in ("one_step_off", "async"):
        return max(generate_s, train_s) + sync_s
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _par(devices: int, tp: int, gen_tp: int = 0) -> Parallel:
    return Parallel(dp=devices // tp, tp=tp, gen_tp=gen_tp)


def batch_length(problem: Problem, devices: int, gen_tp: int, lengths: Lengths) -> int:
    """Decode steps per wave of a batch that ends with its longest sample (module docstring)."""
    work = problem.workload
    per_replica = math.ceil(work.sequences / (devices // gen_tp))
    waves = math.ceil(per_replica / work.max_num_seqs)
    return math.ceil(((waves - 1) * lengths.mean + lengths.longest) / waves)


def generate_s(problem: Problem, devices: int, response_len: int, gen_tp: int, in_place_reshard: bool) -> float:
    """Generation of one step's batch on `devices` with every sample `response_len` long."""
    work = replace(problem.workload, response_len=response_len)
    seconds = 0.0
    for phase in problem.phases:
        if phase.kind == "generate":
            cost = phase_cost(phase, problem.roles[phase.role], _par(devices, gen_tp, gen_tp), work, problem.cluster)
            seconds += cost.seconds - (0.0 if in_place_reshard else cost.parts["reshard_s"])
    return seconds


def train_s(problem: Problem, devices: int, response_len: int, tp: int) -> float:
    """Scoring, controller and update phases of one step on `devices` (one after another)."""
    work = replace(problem.workload, response_len=response_len)
    seconds = 0.0
    for phase in problem.phases:
        if phase.kind == "generate":
            continue
        load = problem.roles.get(phase.role)
        par = None if phase.kind == "controller" else _par(devices, tp)
        seconds += phase_cost(phase, load, par, work, problem.cluster).seconds
    return seconds


def weight_sync_s(problem: Problem, train_devices: int, total: int) -> float:
    """The actor's parameters (training dtype) from the training pool to the rollout pool."""
    actor = problem.roles["actor"]
    return bytes_between_pools_s(actor.shape.params * actor.dtype_bytes, total if total > train_devices else 1,
                                 problem.cluster)


def bytes_between_pools_s(nbytes: float, span: int, cluster: Cluster) -> float:
    """`nbytes` from one pool to the other over pools spanning `span` devices, with its call."""
    return nbytes / link_bw(2, span, cluster) + cluster.efficiency.call_s


def mode_step(problem: Problem, mode: str, lengths: Lengths, gen_devices: int, tp: int = 1, gen_tp: int = 1) -> ModeStep:
    """`mode`'s step with `gen_devices` on the rollout pool (sync: all devices, colocated)."""
    total = problem.cluster.devices
    if mode == "sync":
        gen = generate_s(problem, total, batch_length(problem, total, gen_tp, lengths), gen_tp, in_place_reshard=True)
        train, sync, gen_devices, train_devices = train_s(problem, total, lengths.mean, tp), 0.0, total, total
    else:
        train_devices = total - gen_devices
        if not 0 < gen_devices < total:
            raise ValueError(f"{mode} needs devices on both pools, got {gen_devices} of {total} for generation")
        length = batch_length(problem, gen_devices, gen_tp, lengths) if mode == "one_step_off" else lengths.mean
        gen = generate_s(problem, gen_devices, length, gen_tp, in_place_reshard=False)
        train = train_s(problem, train_devices, lengths.mean, tp)
        sync = weight_sync_s(problem, train_devices, total)
    step = overlapped_step(mode, gen, train, sync)
    return ModeStep(mode, gen_devices, train_devices, gen, train, sync, step, problem.workload.sequences / step)


def min_train_devices(problem: Problem) -> int:
    """Fewest devices whose memory holds the training pool's resident state (trained roles
    16 B/param, frozen ones their dtype), fully sharded; activations are not counted, so
    this is a lower bound that keeps the split search away from pools that cannot work."""
    nbytes = sum(r.shape.params * (TRAINED_BYTES_PER_PARAM if r.trainable else r.dtype_bytes)
                 for r in problem.roles.values())
    return math.ceil(nbytes / (problem.cluster.device.memory_bytes * USABLE_MEMORY))


def compare_modes(problem: Problem, lengths: Lengths, tp: int = 1, gen_tp: int = 1) -> list[ModeStep]:
    """Each mode at its best rollout-pool size (multiples of max(tp, gen_tp) devices, the
    training pool at least `min_train_devices`)."""
    total, unit = problem.cluster.devices, max(tp, gen_tp)
    rows = [mode_step(problem, "sync", lengths, total, tp, gen_tp)]
    least = min_train_devices(problem)
    for mode in MODES[1:]:
        splits = [g for g in range(unit, total - least + 1, unit) if (total - g) % tp == 0]
        if not splits:
            raise ValueError(f"{total} devices cannot hold a rollout pool and a training pool of >= {least} devices")
        rows.append(min((mode_step(problem, mode, lengths, g, tp, gen_tp) for g in splits), key=lambda r: r.step_s))
    return rows
