"""Generation-side weight storage, addressed by Hugging Face parameter name.

The generation model keeps fused buffers (q/k/v in one matrix, gate/up in one) because one
large matmul is faster than three small ones, and stores layer matrices transposed,
[in, out], because MKL's sgemm runs the small-batch decode shapes up to ~2x faster that
way (measured on the dev CPU; no difference in bf16 or on GPU). Every HF parameter name
still maps 1:1 onto a view of those buffers. Loading is therefore `view.copy_(tensor)`: in place, no
reallocation, dtype converted on the way (fp32 training weights -> bf16 decode weights).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from hybridflow.engines.models import ModelLoadError
from hybridflow.engines.rollout.spec import DecoderSpec
from hybridflow.engines.rollout.storage import ReleasableStorage

_COLUMN = re.compile(r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$|(embed_tokens|lm_head)\.weight$")
_ROW = re.compile(r"(o_proj|down_proj)\.weight$")
_VOCAB_NAMES = ("model.embed_tokens.weight", "lm_head.weight")
# buffers some older checkpoints carry that are recomputed here, never loaded
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")


def ignored_weight(name: str) -> bool:
    """True for checkpoint tensors no backend loads (buffers recomputed from the config)."""
    return _IGNORED.search(name) is not None


def tp_shard_dim(name: str) -> int | None:
    """Dimension along which HF parameter `name` is split under tensor parallelism (None: replicated)."""
    if _COLUMN.search(name):
        return 0
    if _ROW.search(name):
        return 1
    return None


def tp_piece(size: int, rank: int, world: int) -> tuple[int, int]:
    """(start, length) of `rank`'s piece of a dim of `size` split over `world` ranks: pieces
    of ceil(size / world), the last shorter (or empty) when `world` does not divide `size`."""
    part = -(-size // world)
    start = min(rank * part, size)
    return start, min(part, size - start)


def shard_for_rank(tensor: torch.Tensor, name: str, rank: int, world: int) -> torch.Tensor:
    """This rank's contiguous piece of a full tensor, per `tp_shard_dim` and `tp_piece`."""
    dim = tp_shard_dim(name)
    if dim is None or world == 1:
        return tensor
    start, length = tp_piece(tensor.shape[dim], rank, world)
    return tensor.narrow(dim, start, length)


def check_tp_divisibility(spec: DecoderSpec, world: int) -> None:
    """Raise a clear error when a model cannot be split evenly over `world` ranks."""
    sizes = {
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "intermediate_size": spec.intermediate_size,
    }
    bad = {k: v for k, v in sizes.items() if v % world}
    if bad:
        raise ValueError(f"tensor-parallel size {world} must divide {bad}; pick a divisor of these sizes")


@dataclass
class LayerWeights:
    """One decoder layer's (local, possibly TP-sharded) tensors in fused layout."""

    ln_in: torch.Tensor
    wqkv: torch.Tensor  # [hidden, (q + 2 kv) local heads * head_dim]: q, then k, then v columns
    bqkv: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    wo: torch.Tensor  # [local q heads * head_dim, hidden]
    bo: torch.Tensor | None
    ln_post: torch.Tensor
    wgu: torch.Tensor  # [hidden, 2 * local intermediate]: gate columns then up columns
    bgu: torch.Tensor | None
    wd: torch.Tensor  # [local intermediate, hidden]
    bd: torch.Tensor | None


class DecoderWeights:
    """All tensors of the generation model plus the HF-name -> view table used for loading."""

    def __init__(self, spec: DecoderSpec, tp_rank: int, tp_size: int, dtype: torch.dtype, device) -> None:
        check_tp_divisibility(spec, tp_size)
        self.spec, self.tp_rank, self.tp_size = spec, tp_rank, tp_size
        self.n_q = spec.num_heads // tp_size
        self.n_kv = spec.num_kv_heads // tp_size
        self.inter = spec.intermediate_size // tp_size
        self.vocab = -(-spec.vocab_size // tp_size)  # rows stored per rank (see module docstring)
        self.vocab_rows = tp_piece(spec.vocab_size, tp_rank, tp_size)[1]  # rows of them that exist
        new = lambda *shape: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        h, d = spec.hidden_size, spec.head_dim
        self.embed = new(self.vocab, h)
        self.norm = new(h)
        self.lm_head = self.embed if spec.tie_word_embeddings else new(self.vocab, h)
        self.layers = [self._new_layer(new) for _ in range(spec.num_layers)]
        self.views: dict[str, torch.Tensor] = self._name_table()
        self.loaded: set[str] = set()
        self.storage = ReleasableStorage(self.base_tensors())

    @property
    def released(self) -> bool:
        return self.storage.released

    def _new_layer(self, new) -> LayerWeights:
        s, h, d = self.spec, self.spec.hidden_size, self.spec.head_dim
        qkv_rows = (self.n_q + 2 * self.n_kv) * d
        return LayerWeights(
            ln_in=new(h),
            wqkv=new(h, qkv_rows),
            bqkv=new(qkv_rows) if s.qkv_bias else None,
            q_norm=new(d) if s.qk_norm else None,
            k_norm=new(d) if s.qk_norm else None,
            wo=new(self.n_q * d, h),
            bo=new(h) if s.o_bias else None,
            ln_post=new(h),
            wgu=new(h, 2 * self.inter),
            bgu=new(2 * self.inter) if s.mlp_bias else None,
            wd=new(self.inter, h),
            bd=new(h) if s.mlp_bias else None,
        )

    def _name_table(self) -> dict[str, torch.Tensor]:
        d = self.spec.head_dim
        q, kv = self.n_q * d, self.n_kv * d
        table = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm}
        table["lm_head.weight"] = self.lm_head
        for i, lw in enumerate(self.layers):
            p = f"model.layers.{i}."
            table[p + "input_layernorm.weight"] = lw.ln_in
            table[p + "post_attention_layernorm.weight"] = lw.ln_post
            # matrices are stored [in, out]; .t() gives the HF [out, in] view to copy into
            for kind, t in (("weight", lw.wqkv.t()), ("bias", lw.bqkv)):
                if t is not None:
                    table[p + f"self_attn.q_proj.{kind}"] = t[:q]
                    table[p + f"self_attn.k_proj.{kind}"] = t[q : q + kv]
                    table[p + f"self_attn.v_proj.{kind}"] = t[q + kv :]
            for kind, t in (("weight", lw.wgu.t()), ("bias", lw.bgu)):
                if t is not None:
                    table[p + f"mlp.gate_proj.{kind}"] = t[: self.inter]
                    table[p + f"mlp.up_proj.{kind}"] = t[self.inter :]
            optional = {
                "self_attn.o_proj.weight": lw.wo.t(),
                "self_attn.o_proj.bias": lw.bo,
                "self_attn.q_norm.weight": lw.q_norm,
                "self_attn.k_norm.weight": lw.k_norm,
                "mlp.down_proj.weight": lw.wd.t(),
                "mlp.down_proj.bias": lw.bd,
            }
            table.update({p + k: v for k, v in optional.items() if v is not None})
        return table

    def required_names(self) -> set[str]:
        """Names that must be loaded before generating (lm_head is optional when tied)."""
        names = set(self.views)
        if self.spec.tie_word_embeddings:
            names.discard("lm_head.weight")
        return names

    def missing_names(self) -> set[str]:
        """Parameters never loaded so far; the model must not generate while any remain."""
        names = self.required_names() - self.loaded
        return names

    @torch.no_grad()
    def load(self, weights: Iterable[tuple[str, torch.Tensor]], *, sharded: bool) -> list[str]:
        """Copy tensors into place by HF name; `sharded` says they are already this rank's TP piece."""
        if self.released:
            raise RuntimeError("weights are released; call resume_memory() before load_weights()")
        done = []
        for name, tensor in weights:
            if ignored_weight(name):
                continue
            dest = self.views.get(name)
            if dest is None:
                raise KeyError(
                    f"unknown parameter {name!r} for a {self.spec.family} model with "
                    f"{self.spec.num_layers} layers; expected Hugging Face names such as "
                    "'model.layers.0.self_attn.q_proj.weight'"
                )
            piece = tensor if sharded else shard_for_rank(tensor, name, self.tp_rank, self.tp_size)
            if name in _VOCAB_NAMES:
                dest[self.vocab_rows:].zero_()  # padding rows of an uneven vocabulary split
                dest = dest[: self.vocab_rows]
            if tuple(piece.shape) != tuple(dest.shape):
                how = "a tensor-parallel shard" if sharded else "the full tensor"
                raise ValueError(
                    f"{name}: got shape {tuple(piece.shape)} as {how}, expected "
                    f"{tuple(dest.shape)} on rank {self.tp_rank} of {self.tp_size}"
                )
            dest.copy_(piece)
            done.append(name)
        self.loaded.update(done)
        return done

    def base_tensors(self) -> list[torch.Tensor]:
        """Every distinct storage-owning tensor (tied lm_head counted once)."""
        seen, out = set(), []
        for t in [self.embed, self.norm, self.lm_head]:
            if id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        for lw in self.layers:
            out.extend(t for t in vars(lw).values() if t is not None)
        return out

    def release(self, *, keep_values: bool) -> None:
        """Free device storage. keep_values: copy to host first so `resume` restores them."""
        # Shrinking the storage (not replacing the tensors) keeps every name-table view valid.
        if self.storage.release(keep_values=keep_values):
            self.loaded.clear()

    def resume(self) -> None:
        """Re-allocate storage; values come back if they were offloaded, else must be reloaded."""
        self.storage.resume()


def iter_safetensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor) from every safetensors file of a local model directory."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {str(model_dir)!r}")
    for fname in files:
        with safe_open(str(model_dir / fname), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)
