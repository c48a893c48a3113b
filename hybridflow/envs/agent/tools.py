"""Tools an agent environment offers: a schema for the chat template and a function to call.

    CALCULATOR.schema      # {"type": "function", "function": {"name": "calculator", ...}}
    CALCULATOR.call({"expression": "123*456"})  -> "56088"
"""

from __future__ import annotations

import ast
import inspect
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridflow.envs.agent.sandbox import SandboxLimits, run_python
from hybridflow.registry import Registry

TOOLS: Registry[Callable[..., Any]] = Registry("tool", "env_kwargs.tools")  # register_tool
BUILTIN_TOOLS = ("calculator", "python")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    fn: Callable[[dict[str, Any]], str]

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI / Hugging Face function-tool form that `apply_chat_template(tools=...)` reads."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    @property
    def first_param(self) -> str:
        return next(iter(self.parameters["properties"]))

    def call(self, arguments: dict[str, Any]) -> str:
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        if missing:
            return f"error: {self.name} needs argument(s) {missing}"
        try:
            return self.fn(arguments)
        except Exception as err:  # a tool's failure is the model's observation
            return f"error: {type(err).__name__}: {err}"


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_MAX_EXPONENT = 64  # 10**64 is plenty; 9**9**9 would hang the process


def evaluate(expression: str) -> int | float:
    """Value of an arithmetic expression; ValueError on anything else."""
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"cannot parse {expression!r}") from err
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, found {type(node).__name__}")


def _calculate(arguments: dict[str, Any]) -> str:
    value = evaluate(str(arguments["expression"]))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


CALCULATOR = Tool(
    "calculator", "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
    {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 123*456"}},
     "required": ["expression"]},
    _calculate,
)


def python_tool(limits: SandboxLimits = SandboxLimits()) -> Tool:
    """A tool that runs Python in the sandbox and answers with stdout (and the error, if any)."""

    def run(arguments: dict[str, Any]) -> str:
        result = run_python(str(arguments["code"]), limits)
        if result.status == "ok":
            return result.stdout
        if result.status == "timeout":
            return result.stdout + f"error: timed out after {limits.time_s} s"
        tail = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.returncode}"]
        return result.stdout + f"error: {tail[0]}"

    return Tool("python", "Run Python code in a sandbox (no network, no files outside a temp dir); "
                "answers with what it prints.",
                {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}, run)


def resolve_tools(names: list[str], python_limits: SandboxLimits = SandboxLimits()) -> dict[str, Tool]:
    """Tools by name: a built-in ("calculator", "python"), a name given to `register_tool`,
    or an import path "package.module:function" (the module is imported, which registers
    what it registers). Keyed by the tool's name, the one the model calls."""
    out = {}
    for entry in names:
        if entry == "calculator":
            tool = CALCULATOR
        elif entry == "python":
            tool = python_tool(python_limits)
        else:
            fn = TOOLS.resolve(entry, TOOLS.config_key, f"built-in tools: {list(BUILTIN_TOOLS)}; register yours with "
                               "@register_tool or give an import path 'package.module:function'")
            tool = tool_from_function(fn, _registered_name(fn))
        out[tool.name] = tool
    return out


def register_tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
                  override: bool = False) -> Any:
    """Register a function as a tool (module docstring): ``@register_tool``,
    ``@register_tool(name="lookup")``; `override=True` replaces another function under a
    taken name. Returns the function unchanged."""
    def add(function: Callable[..., Any]) -> Callable[..., Any]:
        tool_name = name or function.__name__
        if tool_name in BUILTIN_TOOLS:
            raise ValueError(f"tool {tool_name!r} is a built-in; pick another name")
        tool_from_function(function, tool_name)  # a bad signature fails here, not in a rollout worker
        function.__tool_name__ = tool_name  # type: ignore[attr-defined]
        return TOOLS.add(tool_name, function, override=override)

    return add(fn) if fn is not None else add


def _registered_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__tool_name__", fn.__name__)


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def tool_from_function(fn: Callable[..., Any], name: str) -> Tool:
    """A Tool whose schema is `fn`'s signature and docstring and whose call is fn(**arguments)."""
    if not callable(fn):
        raise TypeError(f"tool {name!r}: {fn!r} is not a function")
    signature = inspect.signature(fn)
    hints = inspect.get_annotations(fn, eval_str=True) if inspect.isfunction(fn) else {}
    properties, required, types = {}, [], {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args / **kwargs cannot be described to the model; name each parameter")
        kind = hints.get(param.name, str)
        types[param.name] = kind
        properties[param.name] = {"type": _JSON_TYPES.get(kind, "string")}
        if param.default is param.empty:
            required.append(param.name)
    if not properties:
        raise TypeError(f"tool {name!r}: a tool takes at least one parameter (the model's argument)")
    description = (inspect.getdoc(fn) or name).split("\n\n")[0].replace("\n", " ")

    def call(arguments: dict[str, Any]) -> str:
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            raise TypeError(f"unknown argument(s) {unknown}; {name} takes {list(properties)}")
        return str(fn(**{key: _coerce(value, types[key]) for key, value in arguments.items()}))

    schema = {"type": "object", "properties": properties, "required": required}
    return Tool(name, description, schema, call)


def _coerce(value: Any, kind: Any) -> Any:
    """A text argument (the compact call form passes text) as the parameter's number or bool."""
    if isinstance(value, str) and kind in (int, float):
        return kind(value.strip())
    if isinstance(value, str) and kind is bool:
        return value.strip().lower() in ("1", "true", "yes")
    return value
