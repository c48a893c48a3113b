"""hybridflow: RL post-training of language models with the HybridFlow programming model.

Heavy submodules are imported lazily so that `import hybridflow` (and the CLI's help)
stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "DataProto": "hybridflow.protocol",
    "RLTrainer": "hybridflow.trainer.entry",  # the one trainer: language-model runs and environment tasks
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hybridflow' has no attribute {name!r}")


__all__ = ["DataProto", "RLTrainer", "__version__"]
