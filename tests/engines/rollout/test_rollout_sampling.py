"""Sampling: frequencies match the softmax, truncation, independence and reproducibility.

The statistical tests use fixed seeds (deterministic) and thresholds a correct sampler
passes with probability > 0.999; a sampler that ignores temperature, top-k/top-p, or
shares randomness between samples fails them by a wide margin.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from rollout_helpers import left_padded, load_hf, save_model

from hybridflow.engines.rollout import NativeRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.engines.rollout.sampling import RowSettings, _inverse_cdf, _truncated_candidates, sample_tokens

VOCAB = 8


@pytest.fixture(scope="module")
def tiny_vocab_model(tmp_path_factory):
    path = save_model(tmp_path_factory.mktemp("v8") / "m", "llama", seed=11, vocab_size=VOCAB, logit_scale=5.0)
    return path, load_hf(path)


def _next_token_probs(hf, batch, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = hf(**{k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids")}).logits
    return (logits[0, -1].float() / temperature).softmax(-1)


def _chi2_pvalue(counts: torch.Tensor, expected: torch.Tensor) -> float:
    stat = ((counts - expected) ** 2 / expected).sum()
    dof = counts.numel() - 1
    # survival function of chi-square(dof) = regularised upper incomplete gamma
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), stat / 2.0))


def _first_tokens(engine, batch, params) -> torch.Tensor:
    out = engine.generate(batch, params)
    return out.batch["responses"][:, 0]


def test_sampled_frequencies_match_tempered_softmax(tiny_vocab_model):
    path, hf = tiny_vocab_model
    batch = left_padded([5], vocab=VOCAB, seed=1)
    temperature, n = 0.6, 4000
    probs = _next_token_probs(hf, batch, temperature).double()
    assert probs.max() < 0.6 and (probs * n).min() > 5, probs  # the test is only informative if spread
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32))
    toks = _first_tokens(engine, batch, SamplingParams(temperature=temperature, max_new_tokens=1, n=n, seed=3))
    counts = torch.bincount(toks, minlength=VOCAB).double()
    assert _chi2_pvalue(counts, probs * n) > 1e-3, (counts / n, probs)


def test_top_k_top_p_sample_the_renormalised_survivors(tiny_vocab_model):
    path, hf = tiny_vocab_model
    batch = left_padded([5], vocab=VOCAB, seed=1)
    n, top_k, top_p = 4000, 5, 0.7
    probs = _next_token_probs(hf, batch, 1.0).double()
    order = probs.argsort(descending=True)[:top_k]
    kept = probs[order] / probs[order].sum()
    support = order[: int((kept.cumsum(0) - kept < top_p).sum())]
    assert 1 < len(support) < top_k  # both truncations bite
    expected = torch.zeros(VOCAB, dtype=torch.float64)
    expected[support] = probs[support] / probs[support].sum()
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32))
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, max_new_tokens=1, n=n, seed=4)
    counts = torch.bincount(_first_tokens(engine, batch, params), minlength=VOCAB).double()
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[support] = False
    assert counts[outside].sum() == 0
    assert _chi2_pvalue(counts[support], expected[support] * n) > 1e-3, (counts / n, expected)


def test_samples_of_one_prompt_are_independent(tiny_vocab_model):
    """Pairs (sample 0, sample 1) agree with probability sum p_i^2, not more."""
    path, hf = tiny_vocab_model
    batch = left_padded([5], vocab=VOCAB, seed=1)
    pairs = 3000
    q = float((_next_token_probs(hf, batch, 1.0).double() ** 2).sum())
    engine = NativeRolloutEngine.from_pretrained(path, RolloutConfig(dtype=torch.float32))
    toks = _first_tokens(engine, batch, SamplingParams(temperature=1.0, max_new_tokens=1, n=2 * pairs, seed=5))
    equal = (toks[0::2] == toks[1::2]).sum().item()
    z = (equal - pairs * q) / math.sqrt(pairs * q * (1 - q))
    assert abs(z) < 4.0, (equal / pairs, q)


def test_seeded_sampling_is_independent_of_batching(tiny_llama_dir):
    """Same seed -> same tokens whatever the slot count (continuous batching reorders work)."""
    batch = left_padded([3, 8, 1, 6, 4], vocab=256, seed=6)
    params = [SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=m, n=2, seed=9, ignore_eos=True)
              for m in (9, 2, 12, 5, 7)]
    outs = []
    for slots in (1, 3, 16):
        config = RolloutConfig(dtype=torch.float32, max_num_seqs=slots)
        engine = NativeRolloutEngine.from_pretrained(tiny_llama_dir, config)
        outs.append(engine.generate(batch, params))
    for other in outs[1:]:
        assert torch.equal(outs[0].batch["responses"], other.batch["responses"])
        assert torch.allclose(outs[0].batch["rollout_log_probs"], other.batch["rollout_log_probs"], atol=1e-5)
    resp = outs[0].batch["responses"]
    assert not torch.equal(resp[0], resp[1])  # the two samples of prompt 0 differ
    reseeded = [dataclasses.replace(p, seed=10) for p in params]
    assert not torch.equal(engine.generate(batch, reseeded).batch["responses"], resp)


def test_unseeded_calls_differ_but_engines_repeat(tiny_llama_dir):
    batch = left_padded([4, 4], vocab=256, seed=7)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True)
    first = NativeRolloutEngine.from_pretrained(tiny_llama_dir, RolloutConfig(dtype=torch.float32))
    second = NativeRolloutEngine.from_pretrained(tiny_llama_dir, RolloutConfig(dtype=torch.float32))
    a1, a2 = first.generate(batch, params), first.generate(batch, params)
    b1 = second.generate(batch, params)
    assert not torch.equal(a1.batch["responses"], a2.batch["responses"])
    assert torch.equal(a1.batch["responses"], b1.batch["responses"])


def test_invalid_sampling_params_are_refused():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1.*n must be >= 1"):
        SamplingParams(n=0, max_new_tokens=0)


def test_sample_tokens_rows_follow_their_own_settings():
    """Mixed batch: greedy row -> argmax; top_k=1 row -> argmax; top-k rows stay in their top-k."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(400, 50, generator=gen) * 3
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=1), SamplingParams(top_k=4, temperature=2.0),
              SamplingParams(top_p=0.3)] * 100
    rows = RowSettings.build(params, vocab=50, device="cpu")
    uniforms = torch.rand(400, generator=gen, dtype=torch.float64)
    uniforms[:8] = torch.tensor([0.0, 1.0 - 1e-12] * 4, dtype=torch.float64)  # extremes of the range
    tokens, log_probs = sample_tokens(logits, rows, uniforms, "scaled")
    argmax = logits.argmax(-1)
    assert torch.equal(tokens[0::4], argmax[0::4]) and torch.equal(tokens[1::4], argmax[1::4])
    top4 = logits[2::4].topk(4, dim=-1).indices
    assert (top4 == tokens[2::4, None]).any(-1).all()
    probs = logits[3::4].softmax(-1)
    chosen = probs.gather(-1, tokens[3::4, None]).squeeze(-1)
    mass_above = (probs * (probs > chosen[:, None])).sum(-1)
    assert (mass_above < 0.3).all()  # only tokens inside the top-p nucleus are ever picked
    expected = (logits[2::4] / 2.0).log_softmax(-1).gather(-1, tokens[2::4, None]).squeeze(-1)
    assert torch.allclose(log_probs[2::4], expected, atol=1e-6)


def test_inverse_cdf_is_exact_over_many_blocks():
    """A fine grid of uniforms maps onto tokens in proportion to their probability."""
    gen = torch.Generator().manual_seed(1)
    vocab, grid = 600, 20000  # 600 is not a multiple of the 256-token block
    probs = torch.rand(vocab, generator=gen) * (torch.rand(vocab, generator=gen) > 0.3)  # ~30% zeros
    uniforms = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    uniforms[:2] = torch.tensor([0.0, 1.0 - 1e-15], dtype=torch.float64)
    picks = _inverse_cdf(probs.expand(grid, vocab), uniforms)
    counts = torch.bincount(picks, minlength=vocab).double()
    assert counts[probs == 0].sum() == 0
    assert torch.allclose(counts / grid, (probs / probs.sum()).double(), atol=3.0 / grid)


def _reference_truncation(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Dense [V] renormalised top-k-then-top-p distribution of one row, by full sort."""
    vals, ids = scaled.sort(descending=True)
    k = top_k if top_k > 0 else len(vals)
    probs = vals[:k].softmax(-1)
    n_keep = max(1, int((probs.cumsum(0) - probs < top_p).sum()))
    dense = torch.zeros_like(scaled)
    dense[ids[:n_keep]] = probs[:n_keep] / probs[:n_keep].sum()
    return dense


@pytest.mark.parametrize("host_sync", [True, False])
def test_truncation_matches_a_full_sort_including_the_wide_nucleus_fallback(host_sync):
    """host_sync=False (the device loop) sorts the whole vocabulary at once: the same distribution."""
    gen = torch.Generator().manual_seed(2)
    vocab = 3000  # flat logits: a 0.9 nucleus holds far more than the 1024 first candidates
    scaled = torch.randn(6, vocab, generator=gen) * torch.tensor([[0.3], [0.3], [8.0], [8.0], [1.0], [1.0]])
    settings = [(-1, 0.9), (20, 0.9), (-1, 0.5), (5, 1.0), (-1, 0.99), (300, 0.95)]
    params = [SamplingParams(top_k=k, top_p=p) for k, p in settings]
    rows = RowSettings.build(params, vocab=vocab, device="cpu")
    ids, probs = _truncated_candidates(scaled, torch.logsumexp(scaled, -1, keepdim=True), rows, host_sync)
    dense = torch.zeros(6, vocab).scatter_(1, ids, probs)
    for i, (k, p) in enumerate(settings):
        assert torch.allclose(dense[i], _reference_truncation(scaled[i], k, p), atol=1e-6), i


@pytest.mark.parametrize("host_sync", [True, False])
def test_a_rows_token_does_not_depend_on_its_neighbours_settings(host_sync):
    """An untruncated row samples the same token alone and beside top-k/top-p/greedy rows."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 2000, generator=gen)
    uniforms = torch.rand(4, generator=gen, dtype=torch.float64)
    params = [SamplingParams(), SamplingParams(top_p=0.8), SamplingParams(temperature=0.0), SamplingParams(top_k=7)]
    together, lp_together = sample_tokens(logits, RowSettings.build(params, 2000, "cpu"), uniforms, "processed",
                                          host_sync=host_sync)
    for i, p in enumerate(params):
        alone, lp_alone = sample_tokens(logits[i : i + 1], RowSettings.build([p], 2000, "cpu"), uniforms[i : i + 1],
                                        "processed", host_sync=host_sync)
        assert int(alone) == int(together[i]), i
        assert torch.allclose(lp_alone, lp_together[i : i + 1], atol=1e-5), i
