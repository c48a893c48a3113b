"""Compact decoder for generation: RMSNorm, RoPE, GQA attention over a KV cache, SwiGLU."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hybridflow.engines.rollout.gemm import PanelMatmul, native_matmul, resolve_matmul
from hybridflow.engines.rollout.kv_cache import KVCache
from hybridflow.engines.rollout.spec import DecoderSpec, rope_tables
from hybridflow.engines.rollout.weights import DecoderWeights, LayerWeights


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves (the HF `rotate_half` convention); cos/sin are [..., head_dim/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class DecoderModel:
    """Weights + forward passes of one (possibly TP-sharded) decoder."""

    def __init__(
        self,
        spec: DecoderSpec,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        max_positions: int,
        process_group: dist.ProcessGroup | None = None,
        matmul: str = "auto",
    ) -> None:
        self.spec, self.dtype, self.device = spec, dtype, torch.device(device)
        # x [m, in] @ w [in, out] (+ bias): layer weights are stored [in, out] (weights.py)
        use_panels = resolve_matmul(matmul, dtype, self.device.type) == "fp32_panels"
        self._mm = PanelMatmul() if use_panels else native_matmul
        self.group = process_group
        self.tp_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.tp_rank = dist.get_rank(process_group) if process_group is not None else 0
        self.weights = DecoderWeights(spec, self.tp_rank, self.tp_size, dtype, self.device)
        cos, sin = rope_tables(spec.rope, spec.head_dim, max_positions)
        # Tables are in the compute dtype, as HF casts cos/sin to the activations' dtype.
        self.cos = cos.to(device=self.device, dtype=dtype)
        self.sin = sin.to(device=self.device, dtype=dtype)
        self.max_positions = max_positions
        self.n_q, self.n_kv = self.weights.n_q, self.weights.n_kv

    def release_buffers(self) -> None:
        """Free the matmul work buffers (fp32_panels); they are re-created when next needed."""
        if isinstance(self._mm, PanelMatmul):
            self._mm.release()

    # ----------------------------------------------------------------- collectives
    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.weights.embed
        if self.tp_size == 1:
            return F.embedding(ids, table)
        # vocab-parallel: each rank owns a contiguous id range; others contribute zeros
        local = ids - self.tp_rank * table.shape[0]
        inside = (local >= 0) & (local < table.shape[0])
        out = F.embedding(local.clamp(0, table.shape[0] - 1), table) * inside.unsqueeze(-1).to(table.dtype)
        return self._all_reduce(out)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + lm_head for [n, hidden] states; full-vocabulary logits on every rank."""
        h = F.rms_norm(h, (h.shape[-1],), self.weights.norm, self.spec.rms_norm_eps)
        local = self._mm(h, self.weights.lm_head.t(), None)
        if self.tp_size == 1:
            return local
        parts = [torch.empty_like(local) for _ in range(self.tp_size)]
        dist.all_gather(parts, local.contiguous(), group=self.group)
        # An uneven vocabulary split pads every rank's piece to the same rows: drop the padding.
        return torch.cat(parts, dim=-1)[..., : self.spec.vocab_size]

    # ----------------------------------------------------------------- layer pieces
    def _qkv(self, lw: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Projected q, k (normed if qwen3, rotated) and v, each [..., heads, head_dim]."""
        d, nq, nkv = self.spec.head_dim, self.n_q, self.n_kv
        h = F.rms_norm(x, (x.shape[-1],), lw.ln_in, self.spec.rms_norm_eps)
        qkv = self._mm(h, lw.wqkv, lw.bqkv)
        lead = qkv.shape[:-1]
        q = qkv[..., : nq * d].view(*lead, nq, d)
        k = qkv[..., nq * d : (nq + nkv) * d].view(*lead, nkv, d)
        v = qkv[..., (nq + nkv) * d :].view(*lead, nkv, d)
        if lw.q_norm is not None:
            q = F.rms_norm(q, (d,), lw.q_norm, self.spec.rms_norm_eps)
            k = F.rms_norm(k, (d,), lw.k_norm, self.spec.rms_norm_eps)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def _attn_out_and_mlp(self, lw: LayerWeights, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual add of o_proj(attn), then the SwiGLU MLP block with its residual."""
        o = self._all_reduce(self._mm(attn, lw.wo, None))
        if lw.bo is not None:
            o = o + lw.bo  # row-parallel bias: added once, after the reduction
        x = x + o
        h = F.rms_norm(x, (x.shape[-1],), lw.ln_post, self.spec.rms_norm_eps)
        gate, up = self._mm(h, lw.wgu, lw.bgu).chunk(2, dim=-1)
        down = self._all_reduce(self._mm(F.silu(gate) * up, lw.wd, None))
        if lw.bd is not None:
            down = down + lw.bd
        return x + down

    # ----------------------------------------------------------------- prefill
    @torch.inference_mode()
    def prefill(
        self, prompts: list[list[int]], cache: KVCache, first_slot: int, src_rows: torch.Tensor
    ) -> torch.Tensor:
        """Run prompts; store K/V of prompt src_rows[j] in slot first_slot+j; last-token logits [U, vocab].

        Projections and the MLP run on the packed tokens (no padding computed); only
        attention uses a right-padded [U, T] layout. Several slots may share one prompt
        (n samples): it is computed once and its K/V copied.
        """
        u, t = len(prompts), max(len(p) for p in prompts)
        if t > self.max_positions:
            raise ValueError(f"prompt of {t} tokens exceeds the engine's max_model_len={self.max_positions}; lower "
                             "data.prompt.max_prompt_length or raise rollout.max_model_len")
        dev, d = self.device, self.spec.head_dim
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        tokens = torch.tensor([tok for p in prompts for tok in p], dtype=torch.long, device=dev)
        positions = torch.cat([torch.arange(n) for n in lengths.tolist()]).to(dev)
        row_of = torch.repeat_interleave(torch.arange(u), lengths).to(dev)
        flat = row_of * t + positions  # where each packed token sits in the padded [U*T] layout
        cos = self.cos.index_select(0, positions).unsqueeze(1)
        sin = self.sin.index_select(0, positions).unsqueeze(1)
        # Padded buffers reused by every layer; padding rows stay zero (finite), and with
        # right padding a real query never attends to them under the causal mask.
        qp = torch.zeros(u * t, self.n_q, d, dtype=self.dtype, device=dev)
        kp = torch.zeros(u * t, self.n_kv, d, dtype=self.dtype, device=dev)
        vp = torch.zeros_like(kp)
        slots = slice(first_slot, first_slot + src_rows.numel())
        masks = self._prefill_masks(t)
        x = self._embed(tokens)
        for i, lw in enumerate(self.weights.layers):
            q, k, v = self._qkv(lw, x, cos, sin)
            qp.index_copy_(0, flat, q)
            kp.index_copy_(0, flat, k)
            vp.index_copy_(0, flat, v)
            keys = kp.view(u, t, self.n_kv, d).transpose(1, 2)  # [U, kv_heads, T, d]
            values = vp.view(u, t, self.n_kv, d).transpose(1, 2)
            cache.k[i, slots, :, :t] = keys.index_select(0, src_rows)
            cache.v[i, slots, :, :t] = values.index_select(0, src_rows)
            mask = masks[self.spec.sliding_windows[i]]
            attn = F.scaled_dot_product_attention(
                qp.view(u, t, self.n_q, d).transpose(1, 2), keys, values,
                attn_mask=mask, is_causal=mask is None, enable_gqa=True,
            )
            attn = attn.transpose(1, 2).reshape(u * t, self.n_q * d).index_select(0, flat)
            x = self._attn_out_and_mlp(lw, x, attn)
        last = lengths.cumsum(0).to(dev) - 1
        return self._logits(x.index_select(0, last))

    def _prefill_masks(self, t: int) -> dict[int | None, torch.Tensor | None]:
        """Causal masks per distinct window; None means plain causal (use is_causal)."""
        masks: dict[int | None, torch.Tensor | None] = {None: None}
        pos = torch.arange(t, device=self.device)
        for w in set(self.spec.sliding_windows) - {None}:
            dist_ = pos[:, None] - pos[None, :]
            masks[w] = ((dist_ >= 0) & (dist_ < w)) if t > w else None
        return masks

    # ----------------------------------------------------------------- extend
    @torch.inference_mode()
    def extend(self, chunks: list[list[int]], starts: list[int], slots: list[int], cache: KVCache) -> torch.Tensor:
        """Append token chunks to sequences already in the cache; logits of each chunk's last token [U, vocab].

        Chunk j goes to cache slot slots[j] at positions starts[j].. and attends to that
        slot's cached prefix. One call covers a fresh prompt (start 0), a decode step (one
        token) and a multi-turn continuation (the last sampled token followed by an
        environment's observation tokens), for slots in any order (multi-turn sequences keep
        their slot while they wait, so live slots are not a compact prefix here).
        """
        u, width = len(chunks), max(len(c) for c in chunks)
        total = max(s + len(c) for s, c in zip(starts, chunks))
        if total > self.max_positions:
            raise ValueError(f"sequence of {total} tokens exceeds the engine's max_model_len={self.max_positions}; "
                             "lower rollout.response_length or raise rollout.max_model_len")
        dev, d = self.device, self.spec.head_dim
        lengths = torch.tensor([len(c) for c in chunks], dtype=torch.long)
        offsets = torch.cat([torch.arange(n) for n in lengths.tolist()])
        row_of = torch.repeat_interleave(torch.arange(u), lengths)
        positions = (torch.tensor(starts, dtype=torch.long)[row_of] + offsets).to(dev)
        slot_t = torch.tensor(slots, dtype=torch.long, device=dev)
        token_slot = slot_t[row_of.to(dev)]
        flat = (row_of * width + offsets).to(dev)  # where each packed token sits in the padded [U*W] layout
        tokens = torch.tensor([t for c in chunks for t in c], dtype=torch.long, device=dev)
        cos = self.cos.index_select(0, positions).unsqueeze(1)
        sin = self.sin.index_select(0, positions).unsqueeze(1)
        q_pos = torch.tensor(starts, dtype=torch.long, device=dev)[:, None] + torch.arange(width, device=dev)
        ahead = q_pos[:, :, None] - torch.arange(total, device=dev)[None, None, :]  # [U, W, total]
        masks = {w: ((ahead >= 0) if w is None else (ahead >= 0) & (ahead < w))[:, None]
                 for w in set(self.spec.sliding_windows)}
        qp = torch.zeros(u * width, self.n_q, d, dtype=self.dtype, device=dev)
        x = self._embed(tokens)
        for i, lw in enumerate(self.weights.layers):
            q, k, v = self._qkv(lw, x, cos, sin)
            cache.k[i][token_slot, :, positions] = k
            cache.v[i][token_slot, :, positions] = v
            qp.index_copy_(0, flat, q)
            attn = F.scaled_dot_product_attention(
                qp.view(u, width, self.n_q, d).transpose(1, 2),
                cache.k[i].index_select(0, slot_t)[:, :, :total],
                cache.v[i].index_select(0, slot_t)[:, :, :total],
                attn_mask=masks[self.spec.sliding_windows[i]], enable_gqa=True,
            )
            attn = attn.transpose(1, 2).reshape(u * width, self.n_q * d).index_select(0, flat)
            x = self._attn_out_and_mlp(lw, x, attn)
        last = lengths.cumsum(0).to(dev) - 1
        return self._logits(x.index_select(0, last))

    # ----------------------------------------------------------------- decode
    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, kv_len: int) -> torch.Tensor:
        """One step for slots 0..B-1: token b sits at positions[b]; returns logits [B, vocab].

        `kv_len` is at least max(positions)+1: attention reads only that prefix of the cache.
        """
        return self.decode_step(tokens, positions, cache, kv_len)

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, kv_len: int) -> torch.Tensor:
        """`decode` without entering inference mode (torch.compile cannot trace into it)."""
        b, d = tokens.shape[0], self.spec.head_dim
        group = self.n_q // self.n_kv
        cos = self.cos.index_select(0, positions).unsqueeze(1)  # [B, 1, d/2]
        sin = self.sin.index_select(0, positions).unsqueeze(1)
        rows = torch.arange(b, device=self.device)
        masks = self._decode_masks(positions, kv_len)
        x = self._embed(tokens)
        for i, lw in enumerate(self.weights.layers):
            q, k, v = self._qkv(lw, x, cos, sin)
            cache.k[i][rows, :, positions] = k
            cache.v[i][rows, :, positions] = v
            # Decode GQA without repeating K/V: the `group` query heads that share one kv
            # head act as `group` query rows against that head's keys (same mask for all).
            attn = F.scaled_dot_product_attention(
                q.view(b, self.n_kv, group, d),
                cache.k[i, :b, :, :kv_len],
                cache.v[i, :b, :, :kv_len],
                attn_mask=masks[self.spec.sliding_windows[i]],
            )
            x = self._attn_out_and_mlp(lw, x, attn.reshape(b, self.n_q * d))
        return self._logits(x)

    def _decode_masks(self, positions: torch.Tensor, kv_len: int) -> dict[int | None, torch.Tensor]:
        """[B, 1, 1, kv_len] boolean masks per distinct window (True = attend)."""
        key_pos = torch.arange(kv_len, device=self.device)
        ahead = positions[:, None] - key_pos[None, :]
        masks = {}
        for w in set(self.spec.sliding_windows):
            keep = ahead >= 0 if w is None else (ahead >= 0) & (ahead < w)
            masks[w] = keep[:, None, None, :]
        return masks
