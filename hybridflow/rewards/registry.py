"""Which scorer checks which data set, and loading a user's reward function from a file.

    default_compute_score("openai/gsm8k", "... #### 72", "72")     # -> 1.0
    fn = load_reward_fn("my_reward.py", "compute_score")          # verl-style signature
    fn = load_reward_fn("my_pkg.rewards", "compute_score")        # or an importable module
    reward_fn_reference(compute_score)                            # -> ("my_pkg.rewards", "compute_score")

A reward function has verl's signature
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybridflow.registry import Registry, import_file
from hybridflow.rewards import arithmetic, gsm8k, math_answer
from hybridflow.rewards.shapes import SAMPLE_ARGS, RewardFunctions, check_shape, is_batched, sample_arguments

ScoreFn = Callable[..., "float | dict[str, Any]"]
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
        return import_beside(path)
    except (Exception, SystemExit) as err:  # a file that calls exit() at import is a broken file too
        raise ImportError(f"importing reward file {str(path)!r} failed: {_import_failure(err)}; fix the file "
                          "(it is imported in every reward worker)") from err


def import_beside(path: Path) -> Any:
    """The reward file `path` imported once per process as a module of a package whose folder
    is the file's (so `from . import helpers` works), with that folder on sys.path (so
    `import helpers` does, as when the file is run as a script)."""
    path = path.resolve()
    folder = str(path.parent)
    package = f"{USER_REWARD_PREFIX}{hashlib.sha1(folder.encode()).hexdigest()[:10]}"
    if folder not in sys.path:
        sys.path.append(folder)  # after the installed packages: a helpers.py never hides one of theirs
    if package not in sys.modules:
        parent = types.ModuleType(package)
        parent.__path__ = [folder]
        sys.modules[package] = parent
    return import_file(path, USER_REWARD_PREFIX, name=f"{package}.{path.stem}")


def _declared_batched(path: Path, name: str) -> bool | None:
    """Whether the file's `def name(...)` takes a batch (names `completions`, or sets
    `name.batched = ...` at top level), read with ast without running the file; None when
    the source does not say (then the function is imported to find out)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    found: bool | None = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            args = node.args
            found = "completions" in {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "batched" and isinstance(t.value, ast.Name)
                and t.value.id == name for t in node.targets):
            if not isinstance(node.value, ast.Constant):
                return None
            found = bool(node.value.value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom, ast.ClassDef)) and name in {
                getattr(t, "id", None) for t in getattr(node, "targets", [getattr(node, "target", None)])}:
            return None  # bound by other means than a def: not readable from the source
    return found


def _import_failure(err: BaseException) -> str:
    if isinstance(err, SystemExit):
        return f"it called exit({err.code!r}) while being imported"
    if isinstance(err, SyntaxError):
        return f"SyntaxError at line {err.lineno}: {err.msg}"
    return f"{type(err).__name__}: {err}"


class FileRewardFn:
    """A reward function by where it is defined: a .py file or an importable module (dotted
    name), picklable by (path, name). A worker process that unpickles it imports the file or
    module itself, so user functions work in spawn/forkserver process pools without being
    installed as a package. Called per sample with the arguments the function names, or, when
    `batched` (TRL's shape), with a batch."""

    def __init__(self, path: str | Path, name: str) -> None:
        self.module = str(path) if is_module_path(path) else None
        self.path = Path(path).resolve() if self.module is None else str(path)
        self.name = name
        self._fn: ScoreFn | None = None

    def resolve(self) -> ScoreFn:
        """Import the file or module (once) and return the function, with errors that name the fix."""
        if self._fn is None:
            module = self._import()
            where = repr(str(self.path)) if self.module is None else f"module {self.module!r}"
            fn = getattr(module, self.name, None)
            if fn is None:
                defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
                raise AttributeError(
                    f"{where} defines no {self.name!r}; functions there: {defined}. Set the reward "
                    "function name to one of these"
                )
            if not callable(fn):
                raise TypeError(f"{self.name!r} in {where} is a {type(fn).__name__}, not a function")
            check_shape(fn, f"{self.name} in {Path(str(self.path)).name}")
            self._fn = fn
        return self._fn

    def _import(self) -> Any:
        if self.module is not None:
            try:
                return importlib.import_module(self.module)
            except (Exception, SystemExit) as err:
                raise ImportError(f"importing reward module {self.module!r} failed: {_import_failure(err)}") from err
        if not self.path.is_file():
            raise FileNotFoundError(f"reward function file {str(self.path)!r} does not exist")
        return _import_file(self.path)

    @property
    def batched(self) -> bool:
        if self._fn is None and self.module is None:
            declared = _declared_batched(self.path, self.name)
            if declared is not None:  # read from the file's source: it is not run here (confined workers run it)
                return declared
        return is_batched(self.resolve())

    def __call__(self, **kwargs: Any) -> Any:
        fn = self.resolve()
        return fn(**kwargs) if is_batched(fn) else fn(**sample_arguments(fn, kwargs))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fn": None}

    def __repr__(self) -> str:
        return f"FileRewardFn({str(self.path)!r}, {self.name!r})"


def load_reward_fn(path: str | Path, name: str | list[str] = "compute_score",
                   weights: list[float] | None = None, *, resolve: bool = True) -> ScoreFn:
    """Load `name` from `path`: a Python file (a FileRewardFn, picklable by path) or the dotted
    import path of a module (`my_pkg.rewards`: installed code, imported here; the function
    itself, picklable by reference, or a FileRewardFn when it takes only some of the
    arguments). A file is imported here only when `resolve`: a run passes resolve=False so
    that it is imported only in the confined reward workers (manager.py
    `check_reward_function`). Several names: their weighted sum (`RewardFunctions`)."""
    if isinstance(name, str):
        if weights is not None:
            raise ValueError("weights are for several reward functions; give names as a list")
        fn = FileRewardFn(path, name)
        if fn.module is None:
            if resolve:
                fn.resolve()
            return fn
        resolved = fn.resolve()
        # A module's function travels by reference as it is, unless it must be called with
        # only some of the arguments (a scorer's shape).
        takes_all = is_batched(resolved) or len(sample_arguments(resolved, dict.fromkeys(SAMPLE_ARGS))) == 4
        return resolved if takes_all else fn
    fns = [load_reward_fn(path, n, resolve=resolve) for n in name]
    return RewardFunctions(fns, list(name), weights)


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
