"""Multi-turn generation on a backend that cannot keep a KV cache: regenerate from the prefix.

    turns = RegenTurnEngine(engine, slots=64)      # engine: e.g. HFRolloutEngine
    turns.open("a", prompt_ids, SamplingParams(max_new_tokens=32, seed=0))
    while turns.busy:
        for done in turns.step():                 # every open turn runs to its end
            turns.extend(done.key, observation_ids, max_new_tokens=32)   # or turns.close(key)
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace

from hybridflow.engines.rollout.batch_io import id_tuple, left_pad_ids
from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.engines.rollout.turns import TurnOutput
from hybridflow.protocol import DataProto


@dataclass
class _Context:
    key: Hashable
    tokens: list[int]  # the whole sequence so far
    params: SamplingParams
    budget: int  # max_new_tokens of its next turn
    row: int


class RegenTurnEngine:
    """Pause / extend by regenerating from the prefix (module docstring)."""

    def __init__(self, engine, slots: int) -> None:
        self.engine, self.slots = engine, max(1, slots)
        self.max_len = engine.max_len
        self.eos_token_ids = id_tuple(engine.eos_ids)
        self.ready: list[_Context] = []  # a turn to run
        self.paused: dict[Hashable, _Context] = {}
        self.stats = {"generate_calls": 0, "prefill_tokens": 0, "generated_tokens": 0}

    @property
    def busy(self) -> bool:
        return bool(self.ready)

    def open(self, key: Hashable, prompt: list[int], params: SamplingParams, row: int = 0, sample: int = 0) -> None:
        if not prompt:
            raise ValueError(f"sequence {key!r}: empty prompt")
        self.ready.append(_Context(key, list(prompt), replace(params, n=1), params.max_new_tokens, row))

    def extend(self, key: Hashable, tokens: list[int], max_new_tokens: int) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"sequence {key!r}: max_new_tokens must be >= 1, got {max_new_tokens}")
        seq = self.paused[key]
        if len(seq.tokens) + len(tokens) + 1 > self.max_len:
            raise ValueError(f"sequence {key!r} would exceed max_len={self.max_len}")
        del self.paused[key]
        seq.tokens += list(tokens)
        seq.budget = max_new_tokens
        self.ready.append(seq)

    def close(self, key: Hashable) -> list[int]:
        return self.paused.pop(key).tokens

    def room(self, key: Hashable) -> int:
        return self.max_len - len(self.paused[key].tokens)

    def step(self) -> list[TurnOutput]:
        """One generate call: up to `slots` waiting turns run to their end."""
        rows, self.ready = self.ready[: self.slots], self.ready[self.slots :]
        if not rows:
            return []
        budgets = [min(s.budget, self.max_len - len(s.tokens)) for s in rows]
        out = self.engine.generate(_prompt_batch([s.tokens for s in rows], self.engine.pad_id),
                                   [replace(s.params, max_new_tokens=b) for s, b in zip(rows, budgets)])
        self.stats["generate_calls"] += 1
        self.stats["prefill_tokens"] += sum(len(s.tokens) for s in rows)
        done = []
        for i, s in enumerate(rows):
            n = int(out.batch["response_mask"][i].sum())
            tokens = out.batch["responses"][i, :n].tolist()
            log_probs = out.batch["rollout_log_probs"][i, :n].tolist()
            s.tokens += tokens
            self.stats["generated_tokens"] += n
            self.paused[s.key] = s
            done.append(TurnOutput(s.key, tokens, log_probs, str(out.non_tensor_batch["finish_reason"][i])))
        return done



def _prompt_batch(contexts: list[list[int]], pad_id: int) -> DataProto:
    """Left-padded input_ids / attention_mask of `contexts` (what `generate` reads)."""
    ids, mask = left_pad_ids(contexts, pad_id)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask})
