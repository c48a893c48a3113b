"""Every transformers loader call in hybridflow, its benchmarks and examples passes
`trust_remote_code` explicitly: left out, transformers asks "Do you wish to run the custom
code? [y/N]" on standard input for a directory that names code of its own (auto_map), and a
piped "y" ran it. The value is False, or the run's model.trust_remote_code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOADERS = ("from_pretrained", "from_config")


def _transformers_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "transformers":
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _is_transformers_loader(call: ast.Call, imported: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "pipeline" and "pipeline" in imported
    if not (isinstance(func, ast.Attribute) and func.attr in LOADERS):
        return False
    owner = func.value
    name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
    from_module = isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "transformers"
    # an Auto* class, a class imported from transformers, or a variable holding one (auto_cls)
    return from_module or name in imported or "auto" in name.lower()


def loader_calls_without_the_flag(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = _transformers_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _is_transformers_loader(node, imported) and not any(
                    keyword.arg == "trust_remote_code" for keyword in node.keywords):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


@pytest.mark.parametrize("tree", ["hybridflow", "benchmarks", "examples"])
def test_every_loader_call_passes_trust_remote_code(tree):
    assert loader_calls_without_the_flag(ROOT / tree) == []


def test_the_check_finds_a_call_without_it(tmp_path):
    (tmp_path / "loads.py").write_text("import transformers\nfrom transformers import AutoTokenizer\n"
                                       "AutoTokenizer.from_pretrained('x')\n"
                                       "transformers.AutoModelForCausalLM.from_config(c, trust_remote_code=False)\n"
                                       "auto_cls.from_pretrained('x')\n")
    assert loader_calls_without_the_flag(tmp_path) == ["loads.py:3", "loads.py:5"]
