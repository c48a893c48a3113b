"""Which scorer checks which data set, and loading a user's reward function from a file.

    default_compute_score("openai/gsm8k", "... #### 72", "72")     # -> 1.0
    fn = load_reward_fn("my_reward.py", "compute_score")          # verl-style signature
    fn = load_reward_fn("my_pkg.rewards", "compute_score")        # or an importable module
    reward_fn_reference(compute_score)                            # -> ("my_pkg.rewards", "compute_score")

A reward function has verl's signature
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybridflow.registry import Registry, import_file
from hybridflow.rewards import arithmetic, gsm8k, math_answer

ScoreFn = Callable[..., "float | dict[str, Any]"]
REQUIRED_PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")
USER_REWARD_PREFIX = "hybridflow_user_reward_"  # the module names of reward files (import_file)


def _arithmetic(solution_str: str, ground_truth: Any, extra_info: dict | None) -> float:
    return arithmetic.compute_score(solution_str, ground_truth)


def _gsm8k(solution_str: str, ground_truth: Any, extra_info: dict | None) -> float:
    return gsm8k.compute_score(solution_str, ground_truth, method="strict")


def _math(solution_str: str, ground_truth: Any, extra_info: dict | None) -> float:
    return math_answer.compute_score(solution_str, str(ground_truth))


# data_source -> scorer(solution_str, ground_truth, extra_info). Names follow the Hugging
# Face data set ids verl users already have in their parquet files.
SCORERS: Registry[Callable[[str, Any, dict | None], float | dict]] = Registry("scorer", "data_source")


def register_scorer(data_source: str, fn: Callable[[str, Any, dict | None], float | dict], *,
                    override: bool = False) -> None:
    """Add a scorer for `data_source`. It must be importable by module and name (a
    module-level function) so reward worker processes can use it too. Another function
    for a data source that has one needs override=True."""
    SCORERS.add(data_source, fn, override=override)


for _source, _scorer in (("arithmetic", _arithmetic), ("openai/gsm8k", _gsm8k), ("gsm8k", _gsm8k), ("math", _math),
                         ("lighteval/MATH", _math), ("DigitalLearningGmbH/MATH-lighteval", _math),
                         ("HuggingFaceH4/MATH-500", _math)):
    register_scorer(_source, _scorer)


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float | dict[str, Any]:
    """Score one response with the built-in scorer of its data source."""
    if data_source not in SCORERS:
        raise KeyError(
            f"no built-in scorer for data_source {data_source!r} (known: {sorted(SCORERS)}); set "
            "data_source in the data files to one of these, or give your own reward function "
            "(reward.custom_fn.path / name, loaded with load_reward_fn)"
        )
    return SCORERS[data_source](solution_str, ground_truth, extra_info)


class DispatchScore:
    """A picklable `default_compute_score` over a fixed table of scorers.

    Reward worker processes start fresh, so scorers registered in the parent at run time
    would be missing there; this object carries the table (functions travel by name).
    """

    def __init__(self, scorers: dict[str, Callable] | None = None) -> None:
        self.scorers = dict(SCORERS if scorers is None else scorers)

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None):
        scorer = self.scorers.get(data_source)
        if scorer is None:
            raise KeyError(f"no scorer for data_source {data_source!r} (known: {sorted(self.scorers)})")
        return scorer(solution_str, ground_truth, extra_info)


def _import_file(path: Path) -> Any:
    try:
        return import_file(path, USER_REWARD_PREFIX)  # one module per file: two reward.py files do not clash
    except (Exception, SystemExit) as err:  # a file that calls exit() at import is a broken file too
        raise ImportError(f"importing reward file {str(path)!r} failed: {_import_failure(err)}; fix the file "
                          "(it is imported on the controller and in every reward worker)") from err


def _import_failure(err: BaseException) -> str:
    if isinstance(err, SystemExit):
        return f"it called exit({err.code!r}) while being imported"
    if isinstance(err, SyntaxError):
        return f"SyntaxError at line {err.lineno}: {err.msg}"
    return f"{type(err).__name__}: {err}"


def _check_signature(fn: Callable, where: str) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return  # builtins and some callables have no inspectable signature
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [name for name in REQUIRED_PARAMETERS if name not in params]
    if missing:
        raise TypeError(
            f"{where} is called as fn(data_source=, solution_str=, ground_truth=, extra_info=) but has no "
            f"parameter(s) {missing}; add them (or **kwargs) to its signature"
        )


class FileRewardFn:
    """A reward function defined in a .py file, picklable by (path, name).

    A worker process that unpickles it imports the file itself, so user functions work in
    spawn/forkserver process pools without being installed as a package.
    """

    def __init__(self, path: str | Path, name: str) -> None:
        self.path = Path(path).resolve()
        self.name = name
        self._fn: ScoreFn | None = None

    def resolve(self) -> ScoreFn:
        """Import the file (once) and return the function, with errors that name the fix."""
        if self._fn is None:
            if not self.path.is_file():
                raise FileNotFoundError(f"reward function file {str(self.path)!r} does not exist")
            module = _import_file(self.path)
            fn = getattr(module, self.name, None)
            if fn is None:
                defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
                raise AttributeError(
                    f"{str(self.path)!r} defines no {self.name!r}; functions there: {defined}. Set the reward "
                    "function name to one of these"
                )
            if not callable(fn):
                raise TypeError(f"{self.name!r} in {str(self.path)!r} is a {type(fn).__name__}, not a function")
            _check_signature(fn, f"{self.name} in {self.path.name}")
            self._fn = fn
        return self._fn

    def __call__(self, **kwargs: Any) -> float | dict[str, Any]:
        return self.resolve()(**kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "_fn": None}

    def __repr__(self) -> str:
        return f"FileRewardFn({str(self.path)!r}, {self.name!r})"


def load_reward_fn(path: str | Path, name: str = "compute_score") -> ScoreFn:
    """Load `name` from `path` (checked now, so mistakes surface at start-up): a Python
    file (a FileRewardFn, picklable by path), or the dotted import path of a module
    (`my_pkg.rewards`: the function itself, picklable by reference)."""
    if is_module_path(path):
        try:
            module = importlib.import_module(str(path))
        except (Exception, SystemExit) as err:
            raise ImportError(f"importing reward module {str(path)!r} failed: {_import_failure(err)}") from err
        fn = getattr(module, name, None)
        if not callable(fn):
            raise AttributeError(f"module {str(path)!r} defines no function {name!r}; set the reward function name")
        _check_signature(fn, f"{name} in {path}")
        return fn
    fn = FileRewardFn(path, name)
    fn.resolve()
    return fn


_MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_module_path(path: str | Path) -> bool:
    """A dotted module name (`my_pkg.rewards`) rather than a file (`rewards.py`, `dir/x`)."""
    text = str(path)
    return not text.endswith(".py") and _MODULE_PATH.match(text) is not None and not Path(text).is_file()


def reward_fn_reference(fn: Callable[..., Any]) -> tuple[str, str]:
    """(path, name) that `load_reward_fn` loads `fn` back from, so a config that was given a
    Python function can be saved and used by `--resume` and `hybridflow eval`: the module's
    import path, or the file of a script's (`__main__`) function. ValueError for functions
    that cannot be loaded by name (lambdas, functions defined inside functions)."""
    name = getattr(fn, "__qualname__", None) or ""
    module_name = getattr(fn, "__module__", None)
    if not name or "<" in name or "." in name or module_name is None:
        raise ValueError(f"the reward function {fn!r} cannot be loaded by name (a lambda, a method or a function "
                         "defined inside another); define it at module level, in an importable module or a "
                         "file, and pass that function")
    module = sys.modules.get(module_name)
    if getattr(module, name, None) is not fn:
        raise ValueError(f"the reward function {fn!r} is not reachable as {module_name}.{name}; define it at "
                         "module level")
    if module_name == "__main__" or module_name.startswith(USER_REWARD_PREFIX):
        file = getattr(module, "__file__", None)
        if file is None:
            raise ValueError(f"the reward function {name!r} was defined interactively; put it in a .py file and "
                             "give reward.custom_fn_path / custom_fn_name")
        return str(Path(file).resolve()), name
    return module_name, name
