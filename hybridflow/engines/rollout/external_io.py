"""Translation between hybridflow's rollout contract and the external engines (vLLM, SGLang).

Pure functions on plain data, so they are tested without either package
(tests/engines/rollout/test_external_backends.py); the adapters (vllm_backend.py,
sglang_backend.py) only call the engines with what these produce.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.engines.rollout.batch_io import Sample, cut_at_stop, sample_seed
from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.engines.rollout.weights import ignored_weight, tp_piece


@dataclass(frozen=True)
class EngineRequest:
    """One sequence to generate: sample `sample_index` of prompt row `prompt_row`."""

    prompt_row: int
    sample_index: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int | None  # None for greedy rows (no randomness)


def expand_requests(prompt_ids: Sequence[list[int]], params: Sequence[SamplingParams], *, base_seed: int,
                    call: int) -> list[EngineRequest]:
    """Requests in output order (a prompt's samples adjacent). A request's seed comes from
    its SamplingParams.seed, else from (base_seed, call number): unseeded calls draw afresh."""
    out = []
    for row, (ids, p) in enumerate(zip(prompt_ids, params)):
        for k in range(p.n):
            if p.greedy:
                seed = None
            elif p.seed is not None:
                seed = sample_seed([p.seed, row, k])
            else:
                seed = sample_seed([base_seed, 1 << 31, call, row, k])
            out.append(EngineRequest(row, k, list(ids), p, seed))
    return out


def _top_k(p: SamplingParams) -> int:
    return p.top_k if p.top_k > 0 else -1  # both engines read -1 as "off"


def vllm_sampling_kwargs(req: EngineRequest, stop_ids: Iterable[int]) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one request (vLLM 0.32.0).

    ignore_eos=True switches vLLM's own eos (read from the model directory) off; our stop
    ids, eos included unless the request ignores it, end the sequence instead and are kept
    in the output (vLLM keeps a stop token id in `token_ids`). logprobs=0: only the sampled
    token's log-prob, in the engine's logprobs_mode (external.py). No penalties, no
    detokenisation (the adapter builds the engine with skip_tokenizer_init).
    """
    p = req.params
    return {
        "n": 1,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": _top_k(p),
        "max_tokens": p.max_new_tokens,
        "stop_token_ids": sorted(stop_ids),
        "ignore_eos": True,
        "seed": req.seed,
        "logprobs": 0,
        "detokenize": False,
        "skip_special_tokens": False,
    }


def sglang_sampling_dict(req: EngineRequest, stop_ids: Iterable[int]) -> dict[str, Any]:
    """SGLang's `sampling_params` dict for one request (SGLang 0.5.21).

    SGLang's ignore_eos also disables stop_token_ids, so: a request that stops on eos gets
    ignore_eos=False and our stop ids (SGLang adds the model's eos, the same ids as ours when
    both read the model directory); a request that ignores eos decodes to its budget and
    is cut at its stop ids afterwards (`finish`), which costs the tokens after the stop.
    """
    p = req.params
    ids = sorted(stop_ids)
    out: dict[str, Any] = {
        "n": 1,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": _top_k(p),
        "max_new_tokens": p.max_new_tokens,
        "ignore_eos": p.ignore_eos,
        "stop_token_ids": [] if p.ignore_eos else ids,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if req.seed is not None:
        out["sampling_seed"] = req.seed
    return out


def vllm_completion_tokens(completion: Any) -> tuple[list[int], list[float]]:
    """(token ids, sampled-token log-probs) of a vLLM `CompletionOutput`.

    `completion.logprobs` holds, per generated token, a mapping token id -> Logprob (with
    logprobs=0: the sampled token only, and at most one more when ranks tie);
    `stop_reason` is the stop token id the request ended on (None: eos, budget or a string).
    """
    tokens = [int(t) for t in completion.token_ids]
    steps = completion.logprobs
    if steps is None or len(steps) != len(tokens):
        got = None if steps is None else len(steps)
        raise RuntimeError(f"vLLM returned {got} log-prob entries for {len(tokens)} tokens; the request must set "
                           "logprobs=0 (vllm_sampling_kwargs)")
    _check_stop_kept("vLLM", tokens, getattr(completion, "stop_reason", None))
    return tokens, [float(_logprob_value(step[t])) for step, t in zip(steps, tokens)]


def _check_stop_kept(engine: str, tokens: list[int], stopped_on: Any) -> None:
    """An engine that ended on a stop token id must have kept it in the output: `finish`
    finds the end by that token, and our responses keep it (engine.py)."""
    if isinstance(stopped_on, int) and not isinstance(stopped_on, bool) and (not tokens or tokens[-1] != stopped_on):
        raise RuntimeError(f"{engine} stopped on token {stopped_on} but left it out of the output ids "
                           f"(last: {tokens[-1:]}); the adapter relies on it being kept")


def _logprob_value(entry: Any) -> float:
    return entry.logprob if hasattr(entry, "logprob") else entry


def sglang_output_tokens(output: Mapping[str, Any]) -> tuple[list[int], list[float]]:
    """(token ids, log-probs) of one SGLang `Engine.generate` result dict (return_logprob=True):
    `output_ids` and meta_info `output_token_logprobs`, a list of (logprob, token id, text);
    meta_info `finish_reason` {"type": "stop" | "length", "matched": the stop id or string}."""
    tokens = [int(t) for t in output["output_ids"]]
    meta = output["meta_info"]
    entries = meta["output_token_logprobs"]
    if len(entries) != len(tokens) or any(int(e[1]) != t for e, t in zip(entries, tokens)):
        raise RuntimeError("SGLang's output_token_logprobs do not match its output_ids; the request must set "
                           "return_logprob=True and skip_tokenizer_init")
    _check_stop_kept("SGLang", tokens, (meta.get("finish_reason") or {}).get("matched"))
    return tokens, [float(e[0]) for e in entries]


def finish(req: EngineRequest, tokens: list[int], log_probs: list[float], stop_ids: frozenset[int],
           tokenizer) -> Sample:
    """The finished sample: cut at the first stop id or stop string (kept), else at the budget."""
    n, reason = cut_at_stop(tokens, req.params, stop_ids, tokenizer)
    return Sample(req.prompt_row, req.sample_index, tokens[:n], log_probs[:n], reason)


def vllm_parallel_kwargs(tp_size: int, *, rank: int | None, world_size: int | None, visible_gpus: int
                         ) -> tuple[dict[str, Any], dict[str, str]]:
    """(vllm.LLM keyword arguments, environment variables) for this rank's engine.

    Inside a torch.distributed world (`rank`/`world_size` given) vLLM must join that world
    rather than start its own: distributed_executor_backend="external_launcher" with
    tensor_parallel_size = t_g and data_parallel_size = 1. vLLM 0.32 lays the world out as
    [external dp, dp, pp, pcp, tp] (vllm/distributed/parallel_state.py,
    initialize_model_parallel), so with data_parallel_size 1 the world / t_g engines are
    independent "external" replicas whose TP groups are t_g consecutive ranks. A
    data_parallel_size > 1 would make them one engine that all-reduces "unfinished
    requests?" every step and runs dummy batches on idle ranks (vllm/v1/engine/
    llm_engine.py, has_unfinished_requests_dp). The launcher reads RANK and LOCAL_RANK
    from the environment and puts the engine on cuda:LOCAL_RANK; LOCAL_RANK is 0, which is
    this worker's GPU only when it sees exactly one (Ray's num_gpus=1 actors do), so that
    is checked. Outside a world (None): a single-process engine.
    """
    if world_size is None or rank is None:
        if tp_size != 1:
            raise ValueError("tensor-parallel vLLM engines run inside a torch.distributed world")
        return {"tensor_parallel_size": 1}, {}
    if world_size % tp_size:
        raise ValueError(f"tensor_parallel_size={tp_size} does not divide the world of {world_size} ranks")
    if visible_gpus != 1:
        raise ValueError(f"rank {rank} sees {visible_gpus} GPUs; a vLLM rollout worker must see exactly one (vLLM's "
                         "external launcher puts the engine on cuda:LOCAL_RANK = cuda:0): run the workers as Ray actors "
                         "with one GPU each (resources.use_gpu=true), or set CUDA_VISIBLE_DEVICES per process")
    kwargs = {"tensor_parallel_size": tp_size, "data_parallel_size": 1,
              "distributed_executor_backend": "external_launcher"}
    return kwargs, {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size)}


def check_reply(engine: str, call: str, reply: Any) -> None:
    """Raise unless an engine control call's reply says it succeeded.

    SGLang's Engine answers its weight-update calls with (success, message) and loads
    nothing on failure (e.g. 0.5.21's `update_weights_from_tensor` outside a
    `begin_weight_update()` / `end_weight_update()` session), so a reply left unread means
    generating from the old (or dummy) weights.
    """
    if not isinstance(reply, (tuple, list)) or len(reply) != 2 or not isinstance(reply[0], bool):
        raise RuntimeError(f"{engine} {call} answered {reply!r}; the adapter expects (success, message)")
    success, message = reply
    if not success:
        raise RuntimeError(f"{engine} {call} failed: {message}")


# ------------------------------------------------------------------------------ weights
def expected_weights(hf_config, trust_remote_code: bool = False) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> full shape of every parameter the model has (built on the meta
    device: no memory), tied weights under both names."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=trust_remote_code)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def engine_weight_names(expected: Mapping[str, tuple[int, ...]], tied: bool) -> set[str]:
    """The checkpoint names an engine must receive: a tied lm_head is the embedding (sent once)."""
    return {n for n in checkpoint_shapes(expected)
            if not ignored_weight(n) and not (tied and n == "lm_head.weight")}


_FUSED_EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def to_checkpoint(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) pairs the engines load for one parameter of the module.

    transformers 5 holds a mixture-of-experts layer's experts fused, `mlp.experts.gate_up_proj`
    [E, 2I, H] (gate rows, then up rows) and `mlp.experts.down_proj` [E, H, I], and converts
    the per-expert checkpoint tensors into them when it loads; the training engine's names
    are the module's. vLLM and SGLang read checkpoint names (`mlp.experts.{e}.gate_proj.weight`
    [I, H], `up_proj` [I, H], `down_proj` [H, I]), so fused tensors are split back into views.
    Every other parameter is its own checkpoint tensor.
    """
    match = _FUSED_EXPERTS.match(name)
    if match is None:
        return [(name, tensor)]
    prefix, kind = match.groups()
    if kind == "down_proj":
        return [(f"{prefix}.{e}.down_proj.weight", tensor[e]) for e in range(tensor.shape[0])]
    gate, up = tensor.chunk(2, dim=1)
    return [pair for e in range(tensor.shape[0])
            for pair in ((f"{prefix}.{e}.gate_proj.weight", gate[e]), (f"{prefix}.{e}.up_proj.weight", up[e]))]


def checkpoint_shapes(expected: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of every parameter in `expected` (module names), per `to_checkpoint`."""
    return {n: tuple(t.shape) for name, shape in expected.items()
            for n, t in to_checkpoint(name, torch.empty(shape, device="meta"))}


def shard_shape(full: tuple[int, ...], dim: int | None, rank: int, world: int) -> tuple[int, ...]:
    """Shape of `rank`'s piece of a tensor of shape `full` split on `dim` (weights.tp_piece)."""
    if dim is None or world == 1:
        return full
    shape = list(full)
    shape[dim] = tp_piece(full[dim], rank, world)[1]
    return tuple(shape)


def check_weight(expected: Mapping[str, tuple[int, ...]], name: str, tensor: torch.Tensor, *, dim: int | None,
                 rank: int, world: int, sharded: bool) -> None:
    """KeyError for a name the model lacks, ValueError for a wrong shape (of the full tensor,
    or of this rank's piece when `sharded`)."""
    full = expected.get(name)
    if full is None:
        raise KeyError(f"unknown parameter {name!r} for this model; expected its Hugging Face names, e.g. "
                       f"{next(iter(expected))!r}")
    want = shard_shape(full, dim, rank, world) if sharded else full
    if tuple(tensor.shape) != want:
        raise ValueError(f"{name}: got shape {tuple(tensor.shape)}, expected {want}"
                         + (f" (tensor-parallel piece {rank} of {world})" if sharded and world > 1 else ""))


def gather_tp_piece(piece: torch.Tensor, dim: int, size: int, group) -> torch.Tensor:
    """The whole tensor (`size` along `dim`) from every rank's `tp_piece` of it, all-gathered
    over `group` (collective). Pieces are padded to the longest for one all_gather."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    width = tp_piece(size, 0, world)[1]
    moved = piece.movedim(dim, 0)
    padded = torch.zeros((width, *moved.shape[1:]), dtype=piece.dtype, device=piece.device)
    padded[: moved.shape[0]].copy_(moved)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    lengths = [tp_piece(size, r, world)[1] for r in range(world)]
    return torch.cat([p[:n] for p, n in zip(parts, lengths)]).movedim(0, dim)


def weight_buckets(weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                   ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of (name, tensor) of at most `bucket_bytes` each (a larger tensor
    travels alone), in the given order: bounded transfers, and few engine calls."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        n = tensor.numel() * tensor.element_size()
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += n
    if bucket:
        yield bucket
