"""Tools an agent environment offers: a schema for the chat template and a function to call.

    CALCULATOR.schema      # {"type": "function", "function": {"name": "calculator", ...}}
    CALCULATOR.call({"expression": "123*456"})  -> "56088"

Built-ins: `calculator` (arithmetic on numbers: + - * / // % ** and parentheses, evaluated
on the parsed expression tree, never with eval) and `python` (runs code in the sandbox,
sandbox.py, and answers with its output). A tool answers with text; a tool that fails
answers with an "error: ..." text, which the model reads as the observation.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridflow.envs.agent.sandbox import SandboxLimits, run_python
from hybridflow.registry import Registry


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


# name -> factory(python_limits) -> Tool: the tools an environment may list by name.
TOOLS: Registry[Callable[[SandboxLimits], Tool]] = Registry("tool")


def register_tool(name: str, *, override: bool = False) -> Callable[[Callable[[SandboxLimits], Tool]], Callable]:
    """``@register_tool("name")`` on a `factory(python_limits) -> Tool`."""
    return TOOLS.register(name, override=override)


register_tool("calculator")(lambda limits: CALCULATOR)
register_tool("python")(python_tool)


def builtin_tools(names: list[str], python_limits: SandboxLimits = SandboxLimits()) -> dict[str, Tool]:
    """Registered tools by name ("calculator", "python", or one of `register_tool`)."""
    return {name: TOOLS.get(name)(python_limits) for name in names}
