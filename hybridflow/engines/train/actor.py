"""Actor (and reference) engine: response log-probs, entropy, and the PPO-style policy update.

The reference policy is either a second `ActorEngine(config, trainable=False)` (stored
in the compute dtype, no optimizer) or, with LoRA, the actor itself with its adapters
switched off (`compute_ref_log_prob`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from hybridflow.algorithms import agg_loss, get_policy_loss, kl_loss
from hybridflow.algorithms import AggregationScale
from hybridflow.algorithms.off_policy import apply_behaviour_weights
from hybridflow.engines.train import batching
from hybridflow.engines.train.config import ActorLossConfig, TrainEngineConfig
from hybridflow.engines.train.engine import TrainEngine
from hybridflow.engines.train.forward import causal_lm_log_probs
from hybridflow.engines.train.lora import adapters_disabled
from hybridflow.engines.train.update import Update, accumulate

Tensor = torch.Tensor

FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
UPDATE_KEYS = FORWARD_KEYS + ("response_mask", "advantages")
# Read by the update unless it is "on-policy fused" (ActorEngine.update_policy).
OLD_LOG_PROBS = "old_log_probs"
# The behaviour policy's log-probs, read by the update when actor.loss.off_policy is on.
ROLLOUT_LOG_PROBS = "rollout_log_probs"


def update_keys(loss: ActorLossConfig) -> tuple[str, ...]:
    """Batch keys `update_policy` reads under `loss` (besides the optional old_log_probs)."""
    return (UPDATE_KEYS + (("ref_log_probs",) if loss.use_kl_loss else ())
            + ((ROLLOUT_LOG_PROBS,) if loss.off_policy.enabled else ()))


class ActorEngine(TrainEngine):
    """A causal LM policy over a (dp, tp) or (pp, dp, tp) mesh. Batches are this rank's dp
    shard (every pipeline stage and tp rank of a dp group gets the same one)."""

    def __init__(
        self,
        config: TrainEngineConfig,
        loss: ActorLossConfig | None = None,
        *,
        trainable: bool = True,
        fsdp_shard_dim: Callable[[str], int] | None = None,
    ) -> None:
        super().__init__(config, kind="causal_lm", trainable=trainable, fsdp_shard_dim=fsdp_shard_dim)
        self.loss_config = loss if loss is not None else ActorLossConfig()
        self._policy_loss = get_policy_loss(self.loss_config.policy.loss_mode)

    def compute_log_prob(
        self,
        batch: Mapping[str, Tensor],
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs [B, R] of the response tokens under the current policy (and entropy [B, R])."""
        batching.require_keys(batch, FORWARD_KEYS, "compute_log_prob")
        if self.pipeline is not None:
            return self.pipeline_forward(batch, temperature=temperature, with_entropy=with_entropy)
        out = self.forward_in_micro_batches(batch, lambda mb: self._log_probs(mb, temperature, with_entropy))
        return out["log_probs"], out.get("entropys")

    def compute_ref_log_prob(self, batch: Mapping[str, Tensor], *, temperature: float = 1.0) -> Tensor:
        """Log-probs [B, R] under the reference policy: this LoRA actor with adapters disabled."""
        batching.require_keys(batch, FORWARD_KEYS, "compute_ref_log_prob")
        if self.pipeline is not None:
            raise ValueError("compute_ref_log_prob disables LoRA adapters, and LoRA is not supported with pp_size > 1")
        with adapters_disabled(self.model):
            out = self.forward_in_micro_batches(batch, lambda mb: self._log_probs(mb, temperature, False))
        return out["log_probs"]

    def _log_probs(self, mb: dict[str, Tensor], temperature: float, with_entropy: bool) -> dict[str, Tensor]:
        lp, ent = causal_lm_log_probs(
            self.model,
            mb,
            temperature=temperature,
            chunk_size=self.config.logits_chunk_size,
            pack_sequences=self.config.pack_sequences,
            with_entropy=with_entropy,
        )
        return {"log_probs": lp} if ent is None else {"log_probs": lp, "entropys": ent}

    def update_policy(self, batch: Mapping[str, Tensor], *, temperature: float = 1.0,
                      fused_old_log_probs: bool = False) -> dict[str, float]:
        """One trainer step of policy optimisation on this rank's batch; metrics under "actor/".

        `fused_old_log_probs` (decided once by the run: RunConfig.fuses_old_log_probs): the
        update is on-policy fused, the batch has no `old_log_probs`. It must then make
        exactly one optimizer step over the batch (one epoch, one mini-batch), so the
        policy that sampled is the one whose forward pass the step runs, and the ratio's
        denominator is that forward's own detached log-prob (the separate old-log-prob pass
        would compute the same values, up to float summation order). The token-mean
        entropy of the batch is then reported here (actor/entropy), as that pass would have.
        """
        fused = fused_old_log_probs
        batching.require_keys(batch, update_keys(self.loss_config) + (() if fused else (OLD_LOG_PROBS,)),
                              "update_policy")
        if fused:
            self._require_single_step(batching.batch_len(batch))
        update = Update(self, batch, prefix="actor", loss_scale_factor=self.loss_config.loss_scale_factor)
        for micro, agg in update.mini_batches():
            if self.pipeline is None:  # each micro-batch: forward, the loss (_loss), backward
                update.record(*accumulate(micro, lambda mb: self._micro_step(mb, agg, temperature, fused)))
            else:  # the pipeline's schedule runs the same _loss on its last stage
                update.record(*self._pipeline_mini_step(micro, agg, temperature, fused))
        return update.finish()

    def _require_single_step(self, sequences: int) -> None:
        mb = self.config.micro_batch
        if mb.epochs != 1 or mb.mini_batch_size // self.dp_size < sequences:
            raise ValueError(
                f"update_policy fuses the old log-probs (none in the batch), which is valid only when the update makes "
                f"one optimizer step "
                f"over the batch (epochs=1 and mini_batch_size >= the batch); here epochs={mb.epochs}, "
                f"{sequences} sequences per rank, mini-batch {mb.mini_batch_size // self.dp_size} per rank: "
                "compute old_log_probs first (compute_log_prob)"
            )

    def _micro_step(
        self, mb: dict[str, Tensor], agg: AggregationScale, temperature: float, fused: bool
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        log_prob, entropy = causal_lm_log_probs(
            self.model,
            mb,
            temperature=temperature,
            chunk_size=self.config.logits_chunk_size,
            pack_sequences=self.config.pack_sequences,
            with_entropy=self._update_needs_entropy(fused),
            entropy_grad=self.loss_config.entropy_coeff > 0,  # else only the fused path's metric
        )
        return self._loss(log_prob, entropy, mb, agg, fused)

    def _update_needs_entropy(self, fused: bool) -> bool:
        return self.loss_config.entropy_coeff > 0 or fused

    def _loss(
        self, log_prob: Tensor, entropy: Tensor | None, mb: Mapping[str, Tensor], agg: AggregationScale, fused: bool
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        """The actor objective of one micro-batch from its log-probs (and entropy): the loss
        to backpropagate, summed metrics and averaged metrics (see update.Update)."""
        cfg = self.loss_config
        mode = cfg.policy.loss_agg_mode
        mask = mb["response_mask"]
        old_log_prob = log_prob.detach() if fused else mb[OLD_LOG_PROBS]
        advantages, is_metrics = mb["advantages"], {}
        if cfg.off_policy.enabled:  # decoupled PPO: proximal = old, behaviour = rollout
            advantages, is_metrics = apply_behaviour_weights(advantages, old_log_prob, mb[ROLLOUT_LOG_PROBS], mask,
                                                             cfg.off_policy)
        pg_loss, pg_metrics = self._policy_loss(
            old_log_prob, log_prob, advantages, mask, config=cfg.policy, agg=agg
        )
        pg_metrics = {**pg_metrics, **is_metrics}
        loss = pg_loss
        sums = {"pg_loss": pg_loss.detach()}
        if fused and cfg.entropy_coeff == 0:
            # actor/entropy as the skipped pass reports it: the token mean over the batch
            # (= this one mini-batch); summed over micro-batches, averaged over ranks.
            sums["entropy"] = (entropy.detach() * mask).sum() * agg.dp_size / max(agg.global_tokens, 1)
        elif cfg.entropy_coeff > 0:
            entropy_term = agg_loss(entropy, mask, mode, agg)
            loss = loss - cfg.entropy_coeff * entropy_term
            sums["entropy"] = entropy_term.detach()
        if cfg.use_kl_loss:
            kl, _ = kl_loss(log_prob, mb["ref_log_probs"], mask, kl_type=cfg.kl_loss_type, loss_agg_mode=mode, agg=agg)
            loss = loss + cfg.kl_loss_coef * kl
            sums["kl_loss"] = kl.detach()
        sums["loss"] = loss.detach()
        return loss, sums, pg_metrics

    def _pipeline_mini_step(
        self, micro: list[dict[str, Tensor]], agg: AggregationScale, temperature: float, fused: bool
    ) -> tuple[dict[str, float], dict[str, float]]:
        """One mini-batch through the pipeline's 1F1B schedule: the same `_loss` per
        micro-batch, on the last stage, from the log-probs it computes."""
        targets = [k for k in update_keys(self.loss_config) if k not in FORWARD_KEYS]
        if not fused:
            targets.append(OLD_LOG_PROBS)
        return self.pipeline.train_mini_batch(
            micro, targets, lambda lp, ent, mb: self._loss(lp, ent, mb, agg, fused),
            temperature=temperature, chunk_size=self.config.logits_chunk_size,
            with_entropy=self._update_needs_entropy(fused),
        )
