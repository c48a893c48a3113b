"""LoRA adapters (peft) on the actor, and merging them for export.

With LoRA only the adapter weights train. The reference policy is the same module
with the adapters switched off (`adapters_disabled`), so no second copy of the base
model is kept in memory. Parameter names of a peft model carry a prefix
(`base_model.model.`) and LoRA layers rename their weight to `base_layer.weight`;
`merged_hf_state_dict` turns a full state dict back into plain Hugging Face names with
W + (alpha / r) B A folded into each adapted weight.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator

import torch
from torch import nn

from hybridflow.engines.train.config import LoraConfig

_PEFT_PREFIX = "base_model.model."
_ADAPTER = "default"


def apply_lora(model: nn.Module, config: LoraConfig) -> nn.Module:
    """Wrap a HF causal LM with LoRA adapters; base weights are frozen."""
    import peft  # 1 s to import: only runs that use LoRA pay for it

    peft_config = peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        wrapped = peft.get_peft_model(model, peft_config)
    except ValueError as err:
        raise ValueError(f"could not apply LoRA with target_modules={config.target_modules}: {err}") from err
    # peft also adapts fused 3-D parameters (the experts of Qwen3-MoE / DeepSeek-V3) whose
    # adapters are not one B A per weight: neither merging for generation nor export can fold them.
    fused = sorted(hf_name(name) for name, module in wrapped.named_modules()
                   if hasattr(module, "lora_A") and not isinstance(getattr(module, "base_layer", None), nn.Linear)
                   and ".base_layer" not in name)
    if fused:
        raise ValueError(
            f"LoRA on {fused[0]} (a fused mixture-of-experts tensor, not a Linear layer) is not supported: its "
            "adapters cannot be merged for generation or export; set lora.target_modules to the attention "
            "projections, e.g. [q_proj, k_proj, v_proj, o_proj]"
        )
    return wrapped


def is_lora(model: nn.Module) -> bool:
    # peft is imported lazily (apply_lora): while it is not loaded, no model can be a PeftModel.
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def hf_model_of(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a peft wrapper (or `model` itself)."""
    return model.get_base_model() if is_lora(model) else model


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run `model` as its base model (the reference policy) inside this block."""
    if not is_lora(model):
        raise ValueError("adapters_disabled needs a LoRA model; this engine has no adapters (lora.rank = 0)")
    with model.disable_adapter():
        yield


def hf_name(name: str) -> str:
    """Peft parameter name -> the Hugging Face name of the (base) weight it belongs to."""
    if name.startswith(_PEFT_PREFIX):
        name = name[len(_PEFT_PREFIX):]
    return name.replace(".base_layer.", ".")


_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\." + _ADAPTER + r"\.weight$")


def merged_hf_state_dict(state_dict: dict[str, torch.Tensor], config: LoraConfig) -> dict[str, torch.Tensor]:
    """A full peft state dict -> Hugging Face keys with the adapters merged into the weights."""
    scale = config.alpha / config.rank
    out: dict[str, torch.Tensor] = {}
    adapters: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        match = _LORA_KEY.match(key)
        if match:
            adapters.setdefault(hf_name(match["module"]), {})[match["ab"]] = value
        elif ".lora_" in key:
            raise ValueError(f"unexpected LoRA tensor {key!r} (only adapter {_ADAPTER!r} with A/B weights is supported)")
        else:
            out[hf_name(key)] = value
    for module, ab in adapters.items():
        weight_key = f"{module}.weight"
        base = out[weight_key]
        delta = (ab["B"].float() @ ab["A"].float()) * scale
        out[weight_key] = (base.float() + delta).to(base.dtype)
    return out
