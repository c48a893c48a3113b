"""The torch-free settings of the rollout engines: what config validation checks.

`SamplingParams` (one request's sampling, sampling.py samples with it), the log-prob
modes, the GEMM modes (gemm.py) and the decode loops (device_loop.py). The run config's
`rollout` section (workers/config.py) checks its values against these before torch is
imported; sampling.py and gemm.py re-export them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridflow.errors import ConfigError

MATMUL_MODES = ("auto", "native", "fp32_panels")  # see gemm.py

LOG_PROB_MODES = ("scaled", "processed")

# How the native engine's decode loop runs (config.py): "host" reads every token back,
# "device" keeps decoding, sampling and stops on the device (device_loop.py), "auto" picks.
DECODE_LOOPS = ("auto", "host", "device")


def checked_decode_loop(mode: str, device_type: str, *, compile_decode: bool, cuda_graphs: bool) -> str:
    """The concrete decode loop of `mode` on `device_type`; ConfigError (keyed as in
    RolloutConfig) where compile_decode or cuda_graphs cannot run with it."""
    loop = resolve_decode_loop(mode, device_type)
    if (cuda_graphs or compile_decode) and loop != "device":
        key = "cuda_graphs" if cuda_graphs else "compile_decode"
        raise ConfigError(f"applies to the device decode loop only, and decode_loop is {loop} here: set "
                          "decode_loop to device (auto is device on a GPU only) or this to false", key)
    if cuda_graphs and device_type != "cuda":
        raise ConfigError(f"needs a CUDA device, got {device_type}: set it to false", "cuda_graphs")
    return loop


def resolve_decode_loop(mode: str, device_type: str) -> str:
    """The concrete decode loop for config value `mode` on `device_type`."""
    if mode not in DECODE_LOOPS:
        raise ConfigError(f"must be one of {DECODE_LOOPS}, got {mode!r}", "decode_loop")
    if mode != "auto":
        return mode
    return "device" if device_type == "cuda" else "host"


class InvalidSampling(ValueError):
    """Bad SamplingParams: `problems` lists (argument, what is wrong), the first one first."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("invalid SamplingParams: " + "; ".join(f"{arg} {text}" for arg, text in problems))
        self.problems = problems


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one prompt. temperature == 0 means greedy (argmax, no randomness)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        problems = []  # (argument, what is wrong)
        if self.temperature < 0:
            problems.append(("temperature", f"must be >= 0 (0 = greedy), got {self.temperature}"))
        if not 0.0 < self.top_p <= 1.0:
            problems.append(("top_p", f"must be in (0, 1], got {self.top_p}"))
        if self.max_new_tokens < 1:
            problems.append(("max_new_tokens", f"must be >= 1, got {self.max_new_tokens}"))
        if self.n < 1:
            problems.append(("n", f"must be >= 1, got {self.n}"))
        if self.seed is not None and self.seed < 0:
            problems.append(("seed", f"must be >= 0 or None, got {self.seed}"))
        if any(not s for s in self.stop):
            problems.append(("stop", "must be non-empty strings"))
        if problems:
            raise InvalidSampling(problems)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_meta_info(cls, meta: Mapping[str, Any], **defaults: Any) -> "SamplingParams":
        """Build from DataProto.meta_info keys (verl-style): do_sample=False selects greedy."""
        known = {"temperature", "top_p", "top_k", "max_new_tokens", "stop_token_ids", "stop", "ignore_eos", "n", "seed"}
        kwargs = dict(defaults)
        kwargs.update({k: v for k, v in meta.items() if k in known})
        if "max_new_tokens" not in meta and "response_length" in meta:
            kwargs["max_new_tokens"] = int(meta["response_length"])
        if meta.get("do_sample", True) is False:
            kwargs["temperature"] = 0.0
        return cls(**kwargs)
