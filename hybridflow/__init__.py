"""hybridflow: RL post-training of language models with the HybridFlow programming model.

Heavy submodules are imported lazily so that `import hybridflow` (and the CLI's help)
stays fast.
"""

from __future__ import annotations

from hybridflow.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "DataProto": "protocol",
    "RLTrainer": "trainer.entry",  # the one trainer: language-model runs and environment tasks
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, ["__version__"])


__all__ = ["DataProto", "RLTrainer", "__version__"]
