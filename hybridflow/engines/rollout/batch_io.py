"""What every rollout backend does at its edges, so all of them read and write the same way.

- `params_per_row`: one `SamplingParams` per prompt row (given, or from meta_info);
- `unpad_prompts`: the token ids of LEFT-padded prompts, with clear errors on bad input;
- `check_ready` / `check_model_len`: refuse to generate without weights, or past max_model_len;
- `stop_ids_for` / `hits_stop_string` / `cut_at_stop`: when a response is finished;
- `sample_seed`: the seed of one sample's random stream;
- `Sample` / `pack_output`: a finished sequence, and the output DataProto (layout documented
  in engine.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.protocol import DataProto


class FinishedSample(Protocol):
    """One generated sequence as `pack_output` reads it."""

    prompt_row: int
    tokens: list[int]
    log_probs: list[float]
    finish_reason: str | None


@dataclass
class Sample:
    """A finished sequence of a backend that generates whole responses (hf, vllm, sglang)."""

    prompt_row: int
    sample_index: int
    tokens: list[int]
    log_probs: list[float]
    finish_reason: str


def params_per_row(prompts: DataProto, sp: SamplingParams | Sequence[SamplingParams] | None) -> list[SamplingParams]:
    """One SamplingParams per prompt row; None takes them from prompts.meta_info."""
    rows = len(prompts)
    if sp is None:
        sp = SamplingParams.from_meta_info(prompts.meta_info)
    if isinstance(sp, SamplingParams):
        return [sp] * rows
    sp = list(sp)
    if len(sp) != rows:
        raise ValueError(f"got {len(sp)} SamplingParams for {rows} prompts; give one or one per prompt")
    return sp


def unpad_prompts(prompts: DataProto) -> list[list[int]]:
    """Token ids where attention_mask is 1, per row; rejects right padding and empty prompts."""
    for key in ("input_ids", "attention_mask"):
        if key not in prompts.batch:
            raise KeyError(f"generate() needs {key!r} in the DataProto batch (left-padded prompts)")
    ids, mask = prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].cpu().bool()
    out = [ids[i][mask[i]].tolist() for i in range(ids.shape[0])]
    if ids.shape[1] and not bool(mask[:, -1].all()):
        raise ValueError("prompts must be LEFT-padded: every row's last attention_mask entry must be 1")
    empty = [i for i, p in enumerate(out) if not p]
    if empty:
        raise ValueError(f"prompt rows {empty[:5]} have no tokens (attention_mask all zero)")
    return out


def check_model_len(prompt_ids: list[list[int]], params: list[SamplingParams], max_len: int) -> None:
    """Raise when some prompt plus its max_new_tokens does not fit max_len positions."""
    worst = max(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]) + params[i].max_new_tokens)
    if len(prompt_ids[worst]) + params[worst].max_new_tokens > max_len:
        raise ValueError(
            f"prompt ({len(prompt_ids[worst])} tokens) + max_new_tokens ({params[worst].max_new_tokens}) exceeds "
            f"max_model_len={max_len}; lower rollout.response_length or data.prompt.max_prompt_length, or raise "
            "rollout.max_model_len (up to the model's max_position_embeddings)"
        )


def check_ready(*, released: bool, missing: Collection[str], params: list[SamplingParams], tokenizer) -> None:
    """Raise unless the engine holds every weight and can honour `params`."""
    if released:
        raise RuntimeError("engine memory is released; call resume_memory() (and load_weights) first")
    if missing:
        raise RuntimeError(f"{len(missing)} parameters were never loaded, e.g. {sorted(missing)[:3]}")
    if tokenizer is None and any(p.stop for p in params):
        raise ValueError("stop strings need a tokenizer: pass tokenizer= (anything with .decode(ids))")


def id_tuple(value: int | Iterable[int] | None) -> tuple[int, ...]:
    """A config's token id field (None, one id or a list, like eos_token_id) as a tuple."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def stop_ids_for(params: SamplingParams, eos_ids: Iterable[int]) -> frozenset[int]:
    """Token ids that end a response: the request's stop ids, plus eos unless ignore_eos."""
    return frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(eos_ids))


def hits_stop_string(tokenizer, tokens: list[int], stops: tuple[str, ...]) -> bool:
    """True when the decoded tail of `tokens` contains one of `stops`."""
    # Decoding only a tail keeps the check O(1) per step; a stop string of c characters
    # spans at most c tokens unless tokens decode to nothing, hence the slack.
    window = 8 * max(len(s) for s in stops) + 16
    text = tokenizer.decode(tokens[-window:])
    return any(s in text for s in stops)


def cut_at_stop(tokens: list[int], params: SamplingParams, stop_ids: frozenset[int], tokenizer) -> tuple[int, str]:
    """(kept length, finish reason) of a response generated past its end: the same decision
    a token-by-token engine takes, applied afterwards (the stopping token is kept)."""
    budget = min(len(tokens), params.max_new_tokens)
    for i in range(budget):
        if tokens[i] in stop_ids or (params.stop and hits_stop_string(tokenizer, tokens[: i + 1], params.stop)):
            return i + 1, "stop"
    return budget, "length"


def sample_seed(entropy: list[int]) -> int:
    """A 63-bit torch seed drawn from `entropy` (e.g. [seed, prompt row, sample index])."""
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return (int(state[0]) & 0x7FFFFFFF) << 32 | int(state[1])


def pack_output(prompts: DataProto, samples: Sequence[FinishedSample], params: list[SamplingParams],
                pad_id: int) -> DataProto:
    """The output DataProto; `samples` in output order (a prompt's samples adjacent)."""
    rows = torch.tensor([s.prompt_row for s in samples], dtype=torch.long)
    width = max(p.max_new_tokens for p in params)
    n_out = len(samples)
    responses = torch.full((n_out, width), pad_id, dtype=torch.long)
    response_mask = torch.zeros(n_out, width, dtype=torch.long)
    log_probs = torch.zeros(n_out, width, dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.tokens)
        responses[i, :n] = torch.tensor(s.tokens, dtype=torch.long)
        response_mask[i, :n] = 1
        log_probs[i, :n] = torch.tensor(s.log_probs, dtype=torch.float32)
    prompt_ids = prompts.batch["input_ids"].cpu().index_select(0, rows)
    prompt_mask = prompts.batch["attention_mask"].cpu().index_select(0, rows).to(torch.long)
    if "position_ids" in prompts.batch:
        prompt_pos = prompts.batch["position_ids"].cpu().index_select(0, rows)
    else:
        prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    steps = torch.arange(1, width + 1, dtype=prompt_pos.dtype)
    response_pos = prompt_pos[:, -1:] + steps
    counts = np.bincount(rows.numpy(), minlength=len(prompts))
    non_tensors = {k: np.repeat(v, counts, axis=0) for k, v in prompts.non_tensor_batch.items()}
    finish = np.empty(n_out, dtype=object)
    finish[:] = [s.finish_reason for s in samples]
    non_tensors["finish_reason"] = finish
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "position_ids": torch.cat([prompt_pos, response_pos], dim=1),
            "rollout_log_probs": log_probs,
        },
        non_tensors=non_tensors,
        meta_info=dict(prompts.meta_info),
    )


def left_pad_ids(sequences: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask of `sequences`, left-padded to the longest."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[i, width - len(seq):] = 1
    return ids.to(device), mask.to(device)


PROMPT_SIDE_KEYS = ("prompts", "input_ids", "attention_mask", "position_ids")


def left_pad_prompts(batch: DataProto, width: int) -> DataProto:
    """A generated batch with its prompt side left-padded to `width` tokens, so batches of
    different prompt widths (generation rounds, ranks) concatenate. Padding is masked out
    (attention_mask 0), so its token ids and positions (0) are never read."""
    extra = width - batch.batch["prompts"].shape[1]
    if extra < 0:
        raise ValueError(f"cannot left-pad prompts of width {batch.batch['prompts'].shape[1]} to {width}")
    if extra == 0:
        return batch
    padded = {key: torch.nn.functional.pad(value, (extra, 0)) if key in PROMPT_SIDE_KEYS else value
              for key, value in batch.batch.items()}
    return DataProto(batch=padded, non_tensor_batch=batch.non_tensor_batch, meta_info=batch.meta_info)

