"""What the external rollout engines (vLLM, SGLang) need before they are built: torch-free checks.

    problem = check_external_backend("vllm", tp_size=2, reshard_method="plain", log_prob_mode="processed",
                                     temperature=1.0, top_k=-1, top_p=0.9)   # None, or the key and why
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class ExternalEngine:
    """One external engine: its package, the versions the adapter was written for, its module."""

    name: str
    package: str
    targeted: str  # the versions whose API the adapter follows (docs/rollout_backends.md)
    module: str  # the adapter's module in hybridflow
    tensor_parallel: bool
    install: str  # how to get it


# The two pins need different transformers (vLLM 0.32.0: >=5.16.1,<5.20; SGLang 0.5.21:
# ==5.12.1), so each engine goes into its own environment (pyproject's extras).
_SEPARATE = "; vllm and sglang pin different transformers versions, so install each in its own environment"
EXTERNAL_ENGINES = {
    "vllm": ExternalEngine("vllm", "vllm", "0.32.0 (V1 engine; torch 2.13; layer-wise reload, sleep mode, "
                           "collective_rpc)", "hybridflow.engines.rollout.vllm_backend", True,
                           "pip install 'hybridflow[vllm]', which pins vllm==0.32.0 (CUDA torch 2.13)" + _SEPARATE),
    "sglang": ExternalEngine("sglang", "sglang", "0.5.21 (Engine.begin/end_weight_update, update_weights_from_tensor, "
                             "release/resume_memory_occupation; torch 2.13)", "hybridflow.engines.rollout.sglang_backend",
                             False, "pip install 'hybridflow[sglang]', which pins sglang==0.5.21 (CUDA torch 2.13)"
                             + _SEPARATE),
}


def is_installed(package: str) -> bool:
    """Whether `package` can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def missing_package_message(name: str) -> str:
    engine = EXTERNAL_ENGINES[name]
    return (f"rollout backend {name!r} needs the {engine.package!r} package, which is not installed in this Python "
            f"environment. Install it ({engine.install}; the adapter targets {engine.package} {engine.targeted}), "
            "or use rollout.name=native or hf")


def log_prob_mismatch(name: str, log_prob_mode: str, *, greedy: bool, top_k: int, top_p: float) -> str | None:
    """Why engine `name` cannot return `log_prob_mode` log-probs for these settings (None: it can).

    The rules are the table in the module docstring. Greedy rows report log_softmax(logits)
    in every engine and every mode.
    """
    if greedy:
        return None
    top_k_on, top_p_on = top_k > 0, top_p < 1.0
    if name == "vllm":
        if log_prob_mode == "scaled" and (top_k_on or top_p_on):
            return ("vLLM returns log-probs of the top-k/top-p truncated distribution (logprobs_mode="
                    "processed_logprobs), not of the full softmax(logits / T) that log_prob_mode=scaled means; set "
                    "rollout.log_prob_mode=processed, or top_k=-1 and top_p=1.0")
        return None
    if name == "sglang":
        if log_prob_mode == "processed" and (top_k_on or top_p_on):
            return ("SGLang returns log-probs of the full softmax(logits / T), not of the top-k/top-p truncated "
                    "distribution that log_prob_mode=processed means; set rollout.log_prob_mode=scaled, or "
                    "top_k=-1 and top_p=1.0")
        return None
    raise KeyError(f"{name!r} is not an external engine ({sorted(EXTERNAL_ENGINES)})")


@dataclass(frozen=True)
class BackendProblem:
    """A setting the external engine cannot run: the key (under `rollout.`) and why."""

    key: str
    message: str


def check_external_backend(name: str, *, tp_size: int, reshard_method: str, log_prob_mode: str,
                           temperature: float, top_k: int, top_p: float) -> BackendProblem | None:
    """The first problem with running the `rollout` settings on engine `name`, or None.

    Whether the package is installed, and whether the engine runs tensor parallel at all
    (SGLang's adapter does not), are registry.check_rollout_backend's checks, made first.
    """
    if name not in EXTERNAL_ENGINES:
        raise KeyError(f"{name!r} is not an external engine ({sorted(EXTERNAL_ENGINES)})")
    if tp_size > 1 and reshard_method == "hybrid":
        # vLLM's external launcher forms tensor-parallel groups of consecutive global ranks;
        # the HybridFlow grouping forms them at strides (engines/reshard/grouping.py).
        return BackendProblem("reshard_method", (
            f"vLLM forms its tensor-parallel groups from consecutive ranks, the hybrid grouping from ranks at "
            f"strides; with rollout.tensor_model_parallel_size={tp_size} set rollout.reshard_method=plain "
            "(consecutive groups; its transition gathers the whole model on every rank, docs/reshard.md), or "
            "tensor_model_parallel_size=1 (vLLM's data-parallel engines, weights streamed one parameter at a time)"))
    why = log_prob_mismatch(name, log_prob_mode, greedy=temperature == 0.0, top_k=top_k, top_p=top_p)
    if why is not None:
        return BackendProblem("log_prob_mode", why)
    return None


def require_gpu(name: str, use_gpu: bool) -> str | None:
    """Why `resources.use_gpu` must be true for engine `name` (None when it is)."""
    if use_gpu:
        return None
    return (f"rollout.name={name} generates with {EXTERNAL_ENGINES[name].package} on CUDA devices only; set "
            "resources.use_gpu=true on a machine with NVIDIA GPUs, or use rollout.name=native or hf on CPU")
