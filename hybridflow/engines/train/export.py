"""Export a trained engine's model to a Hugging Face directory (safetensors + config + tokenizer)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from hybridflow.engines.models import hf_model_for_export
from hybridflow.engines.train.distributed import TP, full_tensor
from hybridflow.engines.train.engine import TrainEngine
from hybridflow.engines.train.lora import hf_model_of, is_lora, merged_hf_state_dict

# Files that travel with a model directory but are not weights or config.json.
_SIDE_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)


def export_hf(engine: TrainEngine, out_dir: str | Path, *, dtype: torch.dtype | None = None) -> Path:
    """Write the engine's model to `out_dir` in Hugging Face format (collective).

    dtype: storage dtype of the exported weights (default: the training master dtype).
    """
    out_dir = Path(out_dir)
    if engine.pipeline is not None:
        full = _pipeline_state_dict(engine)
    else:
        full = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        _write(engine, full, out_dir, dtype)
    dist.barrier()
    return out_dir


def _pipeline_state_dict(engine: TrainEngine) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0 ({} elsewhere): each stage's tensors gathered
    inside the stage (collective over its dp x tp ranks), then sent to rank 0 by the stage's
    first rank. Export is not a hot path; the object gather keeps it to one call."""
    stage = {name: full_tensor(t).detach().cpu() for name, t in engine.model.state_dict().items()}
    first_of_stage = engine.dp_rank == 0 and engine.device_mesh[TP].get_local_rank() == 0
    parts: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(stage if first_of_stage else {}, parts, dst=0)
    full: dict[str, torch.Tensor] = {}
    for part in parts or ():
        full.update(part)
    return full


def _empty_hf_model(engine: TrainEngine) -> torch.nn.Module:
    """The meta-device HF model the state dict is assigned to; a pipeline stage is not a HF
    model, but its config is the whole causal LM's."""
    trust = engine.config.trust_remote_code
    if engine.pipeline is None:
        return hf_model_for_export(hf_model_of(engine.model), trust_remote_code=trust)
    if engine.kind != "causal_lm":
        raise ValueError(f"export of a pipeline-parallel {engine.kind} model is not supported; load its checkpoint "
                         "at pp_size=1 (checkpoints move between layouts) and export from there")
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(engine.model.config, trust_remote_code=trust)


def _write(engine: TrainEngine, full: dict[str, torch.Tensor], out_dir: Path, dtype: torch.dtype | None) -> None:
    if is_lora(engine.model):
        full = merged_hf_state_dict(full, engine.config.lora)
    if dtype is not None:
        full = {k: v.to(dtype) for k, v in full.items()}
    hf_model = _empty_hf_model(engine)
    missing, unexpected = hf_model.load_state_dict(full, strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(hf_model.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"export state dict mismatch: missing {missing}, unexpected {unexpected}")
    if tied:
        hf_model.tie_weights()
    tmp = out_dir.with_name(f".tmp-{out_dir.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    hf_model.save_pretrained(tmp, safe_serialization=True)
    source = Path(engine.config.model_path)
    for name in _SIDE_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, tmp / name)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
