"""Model shapes the cost and memory models read: layers, widths, heads, vocabulary.

`ModelShape.from_hf(config)` reads a Hugging Face config (model.path, reward_model.path,
the built-in model's sizes); `LLAMA` holds the paper-scale shapes (Llama-2 7B/13B/70B,
CodeLlama 34B: their published config.json values) for simulated clusters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridflow.engines.reshard.formulas import ModelSizes


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer; `head` "lm" (vocabulary logits) or "value" (one score)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = False
    head: str = "lm"

    @classmethod
    def from_hf(cls, config: Any, head: str = "lm") -> ModelShape:
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size,
                   config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                   config.vocab_size, bool(getattr(config, "tie_word_embeddings", False)), head)

    def with_head(self, head: str) -> ModelShape:
        return ModelShape(self.layers, self.hidden, self.intermediate, self.heads, self.kv_heads, self.vocab,
                          self.tied and head == "lm", head)

    @property
    def kv_dim(self) -> int:
        return self.hidden * self.kv_heads // self.heads

    @property
    def layer_matmul(self) -> int:
        d = self.hidden
        return 2 * d * d + 2 * d * self.kv_dim + 3 * d * self.intermediate

    @property
    def out_features(self) -> int:
        return self.vocab if self.head == "lm" else 1

    @property
    def matmul_params(self) -> int:
        """N of engines/train/flops.py: every weight matmul, the output head included."""
        return self.layers * self.layer_matmul + self.hidden * self.out_features

    @property
    def params(self) -> int:
        """All parameters: matmuls, the embedding table (unless tied), the norms."""
        embed = 0 if self.tied else self.vocab * self.hidden
        return self.matmul_params + embed + (2 * self.layers + 1) * self.hidden

    @property
    def split_tensors(self) -> int:
        """Weight tensors the generation layout splits over t_g: q, k, v, o, gate, up, down
        per layer, the embedding and (untied) lm_head."""
        return 7 * self.layers + (1 if self.tied else 2)

    @property
    def replicated_tensors(self) -> int:
        """Weight tensors every generation rank holds whole: the norms."""
        return 2 * self.layers + 1

    def reshard_sizes(self) -> ModelSizes:
        """Split / replicated element counts of the generation layout (norms replicate)."""
        d, embed = self.hidden, self.vocab * self.hidden
        largest = max(embed, d * self.intermediate)
        split = self.layers * self.layer_matmul + embed * (1 if self.tied else 2)
        return ModelSizes(split, (2 * self.layers + 1) * d, largest, d)


def _llama(layers: int, hidden: int, inter: int, heads: int, kv: int, vocab: int = 32000) -> ModelShape:
    return ModelShape(layers, hidden, inter, heads, kv, vocab)


# Published config.json values (Llama-2 7B/13B/70B; CodeLlama-34B, the paper's 34B).
LLAMA: dict[str, ModelShape] = {
    "llama-7b": _llama(32, 4096, 11008, 32, 32),
    "llama-13b": _llama(40, 5120, 13824, 40, 40),
    "llama-34b": _llama(48, 8192, 22016, 64, 8),
    "llama-70b": _llama(80, 8192, 28672, 64, 8),
}
