"""docs/extending.md, "Add a rollout backend": its code block runs and works as described.

The block is executed as written, registered in process and imported as `module:name`
(the way a run config names a backend outside hybridflow); the backend it defines must
generate what the native engine does and honour release/resume.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from rollout_helpers import build_engine, left_padded

from hybridflow.engines.rollout import SamplingParams, rollout_backends
from hybridflow.engines.rollout.weights import iter_safetensors
from hybridflow.workers.config import RolloutWorkerConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "extending.md"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)


def doc_example() -> str:
    """The first python block of the rollout backend section."""
    text = DOC.read_text()
    section = text.split("## Add a rollout backend", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the rollout backend section of docs/extending.md has no python example"
    return blocks[0]


def test_doc_backend_registers_and_generates(isolated_backend_registry, tiny_llama_dir):
    namespace: dict = {"__name__": "doc_rollout_backend"}
    exec(compile(doc_example(), str(DOC), "exec"), namespace)
    assert "counting" in rollout_backends()
    batch = left_padded([4, 7, 2], vocab=256, seed=3)
    engine = build_engine("counting", tiny_llama_dir)
    out = engine.generate(batch, GREEDY)
    native = build_engine("native", tiny_llama_dir).generate(batch, GREEDY)
    assert torch.equal(out.batch["responses"], native.batch["responses"])
    assert engine.generated_tokens == 3 * 8
    full = engine.weight_storage_bytes()
    engine.release_memory()
    assert engine.weight_storage_bytes() == 0 < full
    engine.resume_memory()
    engine.load_weights(iter_safetensors(tiny_llama_dir))
    assert torch.equal(engine.generate(batch, GREEDY).batch["responses"], native.batch["responses"])


def test_doc_backend_as_module_colon_name(tmp_path, monkeypatch, isolated_backend_registry, tiny_llama_dir):
    (tmp_path / "my_backends.py").write_text(doc_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    name = RolloutWorkerConfig(name="my_backends:counting", tensor_model_parallel_size=2).name
    engine = build_engine(name, tiny_llama_dir)
    assert type(engine).__name__ == "CountingRolloutEngine"
    engine.generate(left_padded([3], vocab=256), GREEDY)
    assert engine.generated_tokens == 8
