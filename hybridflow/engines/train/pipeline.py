"""Pipeline parallelism for the training engine: stages of a Hugging Face causal LM (or of a
critic: the same decoder with a value head) run by torch.distributed.pipelining's 1F1B schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from hybridflow.algorithms import entropy_from_logits, logprobs_from_logits
from hybridflow.engines.models import model_family
from hybridflow.engines.train.batching import merge_micro_metrics

Tensor = torch.Tensor
# Loss of one micro-batch on the last stage: (log_probs, entropy or None, micro-batch tensors)
# -> (loss to backpropagate, summed metrics, averaged metrics).
StageLoss = Callable[[Tensor, Tensor | None, dict[str, Tensor]], tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]]


def stage_layer_ranges(num_layers: int, pp_size: int) -> list[range]:
    """Contiguous decoder-layer runs of near-equal length, one per stage (earlier stages get
    the extra layer: the last stage also runs lm_head and the loss)."""
    if not 1 <= pp_size <= num_layers:
        raise ValueError(f"pp_size={pp_size} must be between 1 and the model's {num_layers} decoder layers")
    base, extra = divmod(num_layers, pp_size)
    ranges, start = [], 0
    for stage in range(pp_size):
        end = start + base + (1 if stage < extra else 0)
        ranges.append(range(start, end))
        start = end
    return ranges


class SkippedLayer(nn.Module):
    """Stands for a decoder layer held by another stage: returns the hidden state unchanged.

    It has no parameters, so the kept layers keep their indices (and HF names); it copies
    the attributes the decoder forward reads by layer (`attention_type`)."""

    def __init__(self, index: int, attention_type: str | None) -> None:
        super().__init__()
        self.index = index
        if attention_type is not None:
            self.attention_type = attention_type

    def forward(self, hidden_states: Tensor, *args: object, **kwargs: object) -> Tensor:
        return hidden_states


class ModelStage(nn.Module):
    """One pipeline stage of a HF causal LM, or of a critic (`TokenScoreModel`: decoder +
    `score` head); its parameter names are the whole model's (see the module docstring).
    Call `set_call` before a schedule runs it."""

    def __init__(self, full_model: nn.Module, stage: int, num_stages: int) -> None:
        super().__init__()
        self.stage, self.num_stages = stage, num_stages
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        self.config = full_model.config
        # The head keeps the attribute name it has in the HF model (lm_head / score).
        self.head_name = "lm_head" if hasattr(full_model, "lm_head") else "score"
        decoder = full_model.model
        layers = decoder.layers
        self.layer_range = stage_layer_ranges(len(layers), num_stages)[stage]
        for i in range(len(layers)):
            if i not in self.layer_range:
                layers[i] = SkippedLayer(i, getattr(layers[i], "attention_type", None))
        if not self.is_first:
            decoder.embed_tokens = None
        if not self.is_last:
            decoder.norm = nn.Identity()
        self.model = decoder
        setattr(self, self.head_name, getattr(full_model, self.head_name) if self.is_last else None)
        self.family = model_family(full_model)
        self.response_len = 0
        self.temperature = 1.0
        self.chunk_size = 1024
        self.with_entropy = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute this stage's decoder layers in backward (the HF decoder's own switch)."""
        self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def set_call(self, *, response_len: int, temperature: float, chunk_size: int, with_entropy: bool) -> None:
        """What the last stage computes for the next schedule call (the same on every stage)."""
        self.response_len, self.temperature = response_len, temperature
        self.chunk_size, self.with_entropy = chunk_size, with_entropy

    def forward(self, x: Tensor, *, input_ids: Tensor, attention_mask: Tensor,
                position_ids: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """x: token ids [mb, S] on stage 0, else the previous stage's hidden state [mb, S, H]."""
        inputs = {"input_ids": x} if self.is_first else {"inputs_embeds": x}
        hidden = self.model(**inputs, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False).last_hidden_state
        if not self.is_last:
            return hidden
        r = self.response_len
        if self.head_name == "score":  # a critic: values [mb, R], fp32
            return self.score(hidden[:, -r - 1 : -1]).squeeze(-1).float()
        logits = self.lm_head(hidden[:, -r - 1 : -1])
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is not None:  # Gemma: the HF causal LM applies it after lm_head
            logits = torch.tanh(logits / cap) * cap
        log_probs = logprobs_from_logits(logits, input_ids[:, -r:], self.temperature, self.chunk_size)
        if not self.with_entropy:
            return log_probs
        return log_probs, entropy_from_logits(logits, self.chunk_size, self.temperature)


def check_pipeline_model(model: nn.Module) -> None:
    """Raise where this pipeline cannot cut `model` (what is refused and why)."""
    head = getattr(model, "lm_head", None)
    if head is not None and head.weight is model.model.embed_tokens.weight:
        raise ValueError(
            "pipeline parallelism with tied input/output embeddings is not supported (the embedding lives on the "
            "first stage and lm_head on the last; one shared weight would need its gradient summed across stages): "
            "use pp_size=1 (tensor parallelism handles tied embeddings)"
        )


def build_stage(model: nn.Module, stage: int, num_stages: int) -> ModelStage:
    """This rank's stage of `model`, a HF causal LM or a critic `TokenScoreModel` (the model is
    consumed: the other stages' layers are dropped)."""
    check_pipeline_model(model)
    return ModelStage(model, stage, num_stages)


FORWARD_KWARGS = ("input_ids", "attention_mask", "position_ids")


def pad_rows(batch: Mapping[str, Tensor], micro_size: int, n_micro: int) -> tuple[dict[str, Tensor], int]:
    """Repeat the last row until the batch fills `n_micro` micro-batches of `micro_size` rows
    (every micro-batch of a pipeline call has one shape); returns it and the true row count."""
    n = next(iter(batch.values())).shape[0]
    extra = micro_size * n_micro - n
    if not extra:
        return dict(batch), n
    return {k: torch.cat([v, v[-1:].expand(extra, *v.shape[1:])]) for k, v in batch.items()}, n


class PipelineRunner:
    """Runs one stage module with a fresh 1F1B schedule per call (see module docstring)."""

    def __init__(self, module: nn.Module, stage: ModelStage, group: dist.ProcessGroup,
                 device: torch.device) -> None:
        """module: the stage as trained (possibly FSDP-wrapped; `stage` is the same object)."""
        self.module, self.stage, self.group, self.device = module, stage, group, device

    def _schedule(self, n_micro: int, loss_fn: Callable | None) -> Schedule1F1B:
        pipe_stage = PipelineStage(self.module, self.stage.stage, self.stage.num_stages, self.device, group=self.group)
        return Schedule1F1B(pipe_stage, n_micro, loss_fn=loss_fn, scale_grads=False)

    def _args(self, batch: Mapping[str, Tensor]) -> tuple[tuple, dict[str, Tensor]]:
        kwargs = {k: batch[k] for k in FORWARD_KWARGS}
        return ((batch["input_ids"],) if self.stage.is_first else ()), kwargs

    def forward(self, batch: Mapping[str, Tensor], *, micro_size: int, temperature: float, chunk_size: int,
                with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """Log-probs [B, R] (and entropy) of `batch`, or a critic's values, without gradients,
        on every stage (the last stage computes them and broadcasts them over the pipeline)."""
        # 1F1B needs at least one micro-batch per stage: smaller ones when the batch is short.
        rows = next(iter(batch.values())).shape[0]
        n_micro = max(self.stage.num_stages, math.ceil(rows / micro_size))
        padded, n = pad_rows(batch, math.ceil(rows / n_micro), n_micro)
        r = batch["responses"].shape[1]
        self.stage.set_call(response_len=r, temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy)
        args, kwargs = self._args(padded)
        with torch.no_grad():
            out = self._schedule(n_micro, None).eval(*args, **kwargs)
        shape = (2 if with_entropy else 1, padded["input_ids"].shape[0], r)
        result = torch.empty(shape, dtype=torch.float32, device=self.device)
        if self.stage.is_last:
            result.copy_(torch.stack(out) if with_entropy else out.unsqueeze(0))
        dist.broadcast(result, group=self.group, group_src=self.stage.num_stages - 1)
        return result[0, :n], (result[1, :n] if with_entropy else None)

    def train_mini_batch(self, micro: Sequence[dict[str, Tensor]], target_keys: Sequence[str], loss: StageLoss, *,
                         temperature: float, chunk_size: int, with_entropy: bool
                         ) -> tuple[dict[str, float], dict[str, float]]:
        """Forward and backward over the micro-batches of one mini-batch (gradients accumulate;
        the caller steps the optimizer). Returns (summed, averaged) metrics, equal on every stage."""
        batch = {k: torch.cat([m[k] for m in micro]) for k in micro[0]}
        r = batch["responses"].shape[1]
        self.stage.set_call(response_len=r, temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy)
        # The schedule also calls the loss once while it infers the backward shapes (on
        # placeholder outputs); the real calls are the last len(micro), one per micro-batch.
        calls: list[tuple[dict[str, Tensor], dict[str, Tensor]]] = []

        def loss_fn(output: Tensor | tuple[Tensor, Tensor], target: Tensor) -> Tensor:
            log_probs, entropy = output if with_entropy else (output, None)
            tensors = {k: target[..., i] for i, k in enumerate(target_keys)}
            value, sums, means = loss(log_probs, entropy, tensors)
            calls.append((sums, means))
            return value

        target = torch.stack([batch[k].to(torch.float32) for k in target_keys], dim=-1)
        args, kwargs = self._args(batch)
        self._schedule(len(micro), loss_fn).step(*args, target=target if self.stage.is_last else None, **kwargs)
        shared = list(merge_micro_metrics(calls[len(calls) - len(micro):]))
        dist.broadcast_object_list(shared, group=self.group, group_src=self.stage.num_stages - 1)
        return shared[0], shared[1]
