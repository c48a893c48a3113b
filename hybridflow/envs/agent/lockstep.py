"""Keeps the ranks of a tensor-parallel generation group in lockstep through the agent loop.

    sync = Lockstep(engine.tp_group)                  # None or a group of size 1: no messages
    notes, pending = sync.share(lambda: decide())     # decide() runs on group rank 0 only
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

STOPS = ("done", "max_turns", "max_total_tokens", "max_obs_tokens", "turn_length", "env_error", "env_timeout",
         "env_bad_result", "render_error")
_FIELDS = 8
_ABORT = -1


@dataclass
class Note:
    """What rank 0 decided about one trajectory; every rank of the group applies it alike."""

    key: int
    stop: str | None = None  # why the trajectory ended (a STOPS entry); None: it goes on
    error: str | None = None
    reward: float = 0.0
    tool_calls: int = 0
    malformed: int = 0
    tokens: list[int] = field(default_factory=list)  # the observation, or (at start) the rendered prompt
    single_turn: bool = False  # at start: the trajectory has no environment


class LockstepAbort(RuntimeError):
    """Rank 0 of the generation group failed inside the agent loop; the others stop too."""


class Lockstep:
    """Broadcasts rank 0's notes over a generation group (a no-op for one rank)."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.size = 1 if group is None else dist.get_world_size(group)
        self.leader = self.size == 1 or dist.get_rank(group) == 0
        self.src = dist.get_global_rank(group, 0) if self.size > 1 else 0
        nccl = self.size > 1 and dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        # seconds inside the broadcasts: on rank 0 the collectives themselves, on the others
        # also the wait for rank 0's environment work
        self.stats = {"lockstep_exchanges": 0, "lockstep_bytes": 0, "lockstep_s": 0.0}

    def share(self, decide: Callable[[], tuple[list[Note], bool]]) -> tuple[list[Note], bool]:
        """Rank 0 runs `decide`; every rank returns its notes and flag."""
        if self.size == 1:
            return decide()
        if not self.leader:
            return self._receive()
        try:
            notes, flag = decide()
        except BaseException as err:
            self._send_abort(f"{type(err).__name__}: {err}")
            raise
        self._send(notes, flag)
        return notes, flag

    # ----------------------------------------------------------------- wire
    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(self.device)
        start = time.perf_counter()
        dist.broadcast(tensor, src=self.src, group=self.group)
        tensor = tensor.cpu()  # on NCCL this waits for the broadcast
        self.stats["lockstep_s"] += time.perf_counter() - start
        self.stats["lockstep_bytes"] += tensor.numel() * tensor.element_size()
        return tensor

    def _send(self, notes: list[Note], flag: bool) -> None:
        payload = encode(notes)
        self.stats["lockstep_exchanges"] += 1
        self._broadcast(torch.tensor([len(notes), payload.numel(), int(flag)], dtype=torch.int64))
        if notes:
            self._broadcast(payload)

    def _send_abort(self, message: str) -> None:
        text = torch.tensor(list(message.encode()), dtype=torch.int64)
        self._broadcast(torch.tensor([_ABORT, text.numel(), 0], dtype=torch.int64))
        if text.numel():
            self._broadcast(text)

    def _receive(self) -> tuple[list[Note], bool]:
        self.stats["lockstep_exchanges"] += 1
        count, length, flag = self._broadcast(torch.zeros(3, dtype=torch.int64)).tolist()
        payload = self._broadcast(torch.zeros(length, dtype=torch.int64)) if length else torch.zeros(0, dtype=torch.int64)
        if count == _ABORT:
            raise LockstepAbort(f"rank 0 of the generation group failed in the agent loop: {_text(payload.tolist())}")
        return decode(payload, count), bool(flag)


def encode(notes: list[Note]) -> torch.Tensor:
    """Notes as one int64 tensor (see the module docstring)."""
    values: list[int] = []
    for n in notes:
        error = list(n.error.encode()) if n.error is not None else []
        reward_bits = int(torch.tensor([n.reward], dtype=torch.float64).view(torch.int64).item())
        values += [n.key, -1 if n.stop is None else STOPS.index(n.stop), n.tool_calls, n.malformed,
                   int(n.single_turn), len(n.tokens), -1 if n.error is None else len(error), reward_bits]
        values += [int(t) for t in n.tokens] + error
    return torch.tensor(values, dtype=torch.int64)


def decode(payload: torch.Tensor, count: int) -> list[Note]:
    """The inverse of `encode`."""
    values, notes, at = payload.tolist(), [], 0
    for _ in range(count):
        key, stop, tools, malformed, single, n_tokens, n_error, bits = values[at:at + _FIELDS]
        at += _FIELDS
        tokens = values[at:at + n_tokens]
        at += n_tokens
        error = None if n_error < 0 else _text(values[at:at + n_error])
        at += max(n_error, 0)
        reward = float(torch.tensor([bits], dtype=torch.int64).view(torch.float64).item())
        notes.append(Note(key, None if stop < 0 else STOPS[stop], error, reward, tools, malformed, tokens,
                          bool(single)))
    if at != len(values):
        raise RuntimeError(f"lockstep payload of {len(values)} values decoded {at}: the ranks disagree on the format")
    return notes


def _text(values: list[int]) -> str:
    return bytes(values).decode()
