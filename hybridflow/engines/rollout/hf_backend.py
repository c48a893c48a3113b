"""Hugging Face `generate` as a rollout backend ("hf"): a reference, and a fallback.

    engine = HFRolloutEngine.from_pretrained(model_dir, RolloutConfig(dtype="fp32"))
    out = engine.generate(batch, SamplingParams(temperature=1.0, max_new_tokens=64, n=4))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from hybridflow.engines.models import load_hf_config
from hybridflow.engines.rollout.batch_io import (
    Sample,
    check_model_len,
    check_ready,
    cut_at_stop,
    id_tuple,
    left_pad_ids,
    pack_output,
    params_per_row,
    sample_seed,
    stop_ids_for,
    unpad_prompts,
)
from hybridflow.engines.rollout.config import RolloutConfig
from hybridflow.engines.rollout.interface import RolloutEngine
from hybridflow.engines.rollout.registry import register_rollout_backend, unsupported_tp_message
from hybridflow.engines.rollout.sampling import SamplingParams
from hybridflow.engines.rollout.storage import ReleasableStorage
from hybridflow.engines.rollout.weights import ignored_weight
from hybridflow.protocol import DataProto


@register_rollout_backend("hf")
class HFRolloutEngine(RolloutEngine):
    """`transformers` generation behind the RolloutEngine contract (see module docstring)."""

    supports_tensor_parallel = False

    def __init__(self, hf_config, config: RolloutConfig = RolloutConfig(), *, process_group=None, tokenizer=None,
                 model_path: str | None = None):
        # model_path is part of the backend signature (registry.py); weights come by load_weights.
        tp_size = 1 if process_group is None else dist.get_world_size(process_group)
        if tp_size > 1:
            raise ValueError(unsupported_tp_message("hf", tp_size))
        if config.keep_kv_cache:
            raise ValueError("the hf rollout backend allocates its KV cache inside each generate call and cannot "
                             "keep it; set keep_kv_cache=False, or use the native backend (rollout.name=native)")
        self.config = config
        self.device = torch.device(config.device)
        self.model = AutoModelForCausalLM.from_config(hf_config, dtype=config.dtype,
                                                      trust_remote_code=config.trust_remote_code).to(self.device).eval()
        self.model.requires_grad_(False)
        self.max_len = config.max_model_len or _max_positions(hf_config)
        pad = config.pad_token_id if config.pad_token_id is not None else getattr(hf_config, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        self.eos_ids = id_tuple(getattr(hf_config, "eos_token_id", None))
        # Neutral defaults: every generation setting comes from the call's SamplingParams,
        # never from a generation_config.json fallback (eos, top_k=50, penalties...).
        self.model.generation_config = GenerationConfig(pad_token_id=self.pad_id)
        self.tokenizer = tokenizer
        # Every loadable name (tied weights under both names) -> its tensor; the storage
        # of the distinct parameters is what release/resume and the accounting cover.
        self.views: dict[str, torch.Tensor] = self.model.state_dict(keep_vars=True)
        params = list(self.model.parameters())  # deduplicated: a tied weight once
        self.storage = ReleasableStorage(params)
        self._param_names = {id(p): n for n, p in self.model.named_parameters()}
        self._loaded: set[int] = set()
        self._calls = 0

    @classmethod
    def from_pretrained(cls, model_dir, config: RolloutConfig = RolloutConfig(), *, process_group=None,
                        tokenizer=None) -> "HFRolloutEngine":
        """Build from a local HF directory, its weights read by transformers' own loader.

        Checkpoints may store tensors under other names than the module uses: transformers 5
        fuses the per-expert weights of MoE families (Qwen3-MoE, DeepSeek-V3) into 3-D
        tensors at load time. Weights from the training engine already carry the module's
        names; only a directory on disk needs the conversion. Costs one transient copy.
        """
        hf_config = load_hf_config(model_dir, trust_remote_code=config.trust_remote_code)
        engine = cls(hf_config, config, process_group=process_group, tokenizer=tokenizer, model_path=str(model_dir))
        loaded = AutoModelForCausalLM.from_pretrained(model_dir, config=hf_config, dtype=config.dtype,
                                                      local_files_only=True, trust_remote_code=config.trust_remote_code)
        engine.load_weights(loaded.state_dict().items())
        return engine

    # ----------------------------------------------------------------- RolloutEngine
    @property
    def tp_size(self) -> int:
        return 1

    @property
    def tp_rank(self) -> int:
        return 0

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], *, sharded: bool = False) -> None:
        # With one rank a rank's shard is the whole tensor, so `sharded` changes nothing.
        if self.storage.released:
            raise RuntimeError("weights are released; call resume_memory() before load_weights()")
        for name, tensor in weights:
            if ignored_weight(name):
                continue
            dest = self.views.get(name)
            if dest is None:
                raise KeyError(f"unknown parameter {name!r} for this {self.model.config.model_type} model; expected "
                               f"its Hugging Face names, e.g. {next(iter(self.views))!r}")
            if tuple(tensor.shape) != tuple(dest.shape):
                raise ValueError(f"{name}: got shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
            dest.copy_(tensor)
            self._loaded.add(id(dest))

    def turn_engine(self, slots: int):
        """Multi-turn generation by regenerating from each sequence's prefix (generate keeps
        no KV cache between calls; regen_turns.py)."""
        from hybridflow.engines.rollout.regen_turns import RegenTurnEngine

        return RegenTurnEngine(self, slots=slots)

    def release_memory(self, *, keep_weights: bool = False) -> None:
        if self.storage.release(keep_values=keep_weights):
            self._loaded.clear()

    def resume_memory(self) -> None:
        self.storage.resume()

    def weight_storage_bytes(self) -> int:
        return self.storage.nbytes()

    def generate(self, prompts: DataProto,
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> DataProto:
        params = params_per_row(prompts, sampling_params)
        missing = {n for i, n in self._param_names.items() if i not in self._loaded}
        check_ready(released=self.storage.released, missing=missing, params=params, tokenizer=self.tokenizer)
        prompt_ids = unpad_prompts(prompts)
        check_model_len(prompt_ids, params, self.max_len)
        groups: dict[SamplingParams, list[int]] = {}
        for row, p in enumerate(params):
            groups.setdefault(p, []).append(row)
        samples: list[Sample] = []
        for p, rows in groups.items():
            per_call = max(1, self.config.max_num_seqs // p.n)
            for start in range(0, len(rows), per_call):
                samples += self._generate_rows(prompt_ids, rows[start : start + per_call], p)
        samples.sort(key=lambda s: (s.prompt_row, s.sample_index))
        self._calls += 1
        return pack_output(prompts, samples, params, self.pad_id)

    # ----------------------------------------------------------------- helpers
    def _generate_rows(self, prompt_ids: list[list[int]], rows: list[int], p: SamplingParams) -> list[Sample]:
        """One `generate` call: the prompts of `rows`, each repeated n times."""
        ids, mask = left_pad_ids([prompt_ids[r] for r in rows for _ in range(p.n)], self.pad_id, self.device)
        stop_ids = stop_ids_for(p, self.eos_ids)
        recorder = _LogProbRecorder(p, self.config.log_prob_mode)
        sampling = {} if p.greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}  # ours apply them
        gen_config = GenerationConfig(max_new_tokens=p.max_new_tokens, do_sample=not p.greedy,
                                      eos_token_id=sorted(stop_ids) or None, pad_token_id=self.pad_id, **sampling)
        entropy = [p.seed, rows[0]] if p.seed is not None else [self.config.seed, 1 << 31, self._calls, rows[0]]
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(sample_seed(entropy))
            sequences = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_config,
                                            logits_processor=LogitsProcessorList([recorder]))
        new = sequences[:, ids.shape[1] :]
        log_probs = recorder.chosen_log_probs(new)
        new = new.cpu().tolist()
        out = []
        for i, (row, k) in enumerate((r, k) for r in rows for k in range(p.n)):
            n, reason = cut_at_stop(new[i], p, stop_ids, self.tokenizer)
            out.append(Sample(row, k, new[i][:n], log_probs[i, :n].tolist(), reason))
        return out


class _LogProbRecorder(LogitsProcessor):
    """Applies a request's temperature / top-k / top-p and keeps each chosen token's log-prob.

    generate runs custom processors before its own warpers (switched off here), so this one
    sees the raw logits. The token chosen at step t is known only at step t + 1 (as the
    last input id) or, for the last step, from the output: one step's log-softmax is held
    until then, so memory stays [rows, vocab] whatever the response length.
    """

    def __init__(self, params: SamplingParams, log_prob_mode: str) -> None:
        self.greedy = params.greedy
        self.temperature = params.temperature
        self.warpers: list[LogitsProcessor] = []
        if not params.greedy:
            if params.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                self.warpers.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(params.top_p))
        self.processed = log_prob_mode == "processed" and not params.greedy
        self._pending: torch.Tensor | None = None
        self._chosen: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._settle(input_ids[:, -1])
        logits = scores.float()
        warped = logits
        for warper in self.warpers:
            warped = warper(input_ids, warped)
        if self.processed:
            basis = warped
        else:
            basis = logits if self.greedy else logits / self.temperature
        self._pending = basis.log_softmax(-1)
        return warped

    def _settle(self, tokens: torch.Tensor) -> None:
        if self._pending is not None:
            self._chosen.append(self._pending.gather(-1, tokens[:, None]).squeeze(-1))
            self._pending = None

    def chosen_log_probs(self, generated: torch.Tensor) -> torch.Tensor:
        """[rows, steps] fp32 on the CPU: the log-prob of every generated token."""
        self._settle(generated[:, -1])
        if len(self._chosen) != generated.shape[1]:
            raise RuntimeError(f"recorded {len(self._chosen)} steps for {generated.shape[1]} generated tokens")
        return torch.stack(self._chosen, dim=1).float().cpu()


def _max_positions(hf_config) -> int:
    value = getattr(hf_config, "max_position_embeddings", None)
    if value is None:
        raise ValueError(f"the {hf_config.model_type} config has no max_position_embeddings; set "
                         "rollout.max_model_len")
    return int(value)
