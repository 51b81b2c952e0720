"""Safe evaluation of the small Python expressions a Definition carries.

Constraints (``"len_indptr == batch_size + 1"``), byte and FLOP formulas
(``"2*batch_size*hidden_size*dtype_size"``) and value-domain bounds are Python expressions over
names. They are evaluated by walking the parsed syntax tree, never with ``eval``: only numbers,
names given by the caller, arithmetic, comparisons, boolean logic, conditional expressions,
subscripts, a few math functions (``FUNCTIONS``) and the tensor attributes ``shape``, ``ndim``,
``item`` and ``numel`` are allowed. There are no builtins, no strings, no other attributes, so
``__import__('os')`` or ``().__class__`` are refused before anything runs.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Iterable, Mapping, Optional

from .errors import ExpressionError


def _cdiv(a, b):
    return -(-a // b)


#: Functions an expression may call.
FUNCTIONS = {
    "abs": abs,
    "min": min,
    "max": max,
    "int": int,
    "float": float,
    "ceil": math.ceil,
    "floor": math.floor,
    "sqrt": math.sqrt,
    "log": math.log,
    "log2": math.log2,
    "exp": math.exp,
    "cdiv": _cdiv,
}

#: Constants an expression may use.
CONSTANTS = {"pi": math.pi}

#: Attributes an expression may read (on tensor-valued names of data-dependent constraints).
ATTRIBUTES = frozenset({"shape", "ndim", "item", "numel"})

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Not: operator.not_}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_MAX_EXPONENT = 4096


def parse(expr: str) -> ast.Expression:
    """Parse and check an expression; raise ExpressionError if it is malformed or unsafe."""
    if not isinstance(expr, str) or not expr.strip():
        raise ExpressionError("expression must be a non-empty string")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"malformed expression {expr!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        _check_node(node, expr)
    return tree


def names(expr: str) -> set[str]:
    """The free names an expression reads (functions and constants excluded)."""
    tree = parse(expr)
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree)
            if isinstance(n, ast.Name) and id(n) not in called and n.id not in CONSTANTS}


def check_names(expr: str, allowed: Iterable[str]) -> None:
    """Raise ExpressionError if the expression reads a name outside ``allowed``."""
    allowed = set(allowed)
    unknown = sorted(names(expr) - allowed)
    if unknown:
        raise ExpressionError(
            f"{expr!r} uses unknown name{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"(known: {', '.join(sorted(allowed)) or 'none'})")


def evaluate(expr: str, env: Mapping[str, Any]) -> Any:
    """Evaluate an expression with the names in ``env``."""
    tree = parse(expr)
    try:
        return _Evaluator(env, expr).visit(tree.body)
    except ExpressionError:
        raise
    except (ArithmeticError, ValueError, TypeError, IndexError) as exc:
        raise ExpressionError(f"{expr!r} failed: {type(exc).__name__}: {exc}") from None


def _check_node(node: ast.AST, expr: str) -> None:
    allowed = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp, ast.Compare,
               ast.IfExp, ast.Call, ast.Name, ast.Load, ast.Constant, ast.Subscript, ast.Slice,
               ast.Tuple, ast.Attribute, *_BINOPS, *_UNARY, *_COMPARE)
    if not isinstance(node, allowed):
        raise ExpressionError(f"{expr!r}: {type(node).__name__} is not allowed in an expression")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool)):
        raise ExpressionError(f"{expr!r}: only numeric constants are allowed, not {node.value!r}")
    if isinstance(node, ast.Name) and node.id.startswith("__"):
        raise ExpressionError(f"{expr!r}: name {node.id!r} is not allowed")
    if isinstance(node, ast.Attribute) and node.attr not in ATTRIBUTES:
        raise ExpressionError(
            f"{expr!r}: attribute {node.attr!r} is not allowed (only {', '.join(sorted(ATTRIBUTES))})")
    if isinstance(node, ast.Call):
        if node.keywords:
            raise ExpressionError(f"{expr!r}: keyword arguments are not allowed")
        func = node.func
        if isinstance(func, ast.Name):
            if func.id not in FUNCTIONS:
                raise ExpressionError(
                    f"{expr!r}: calling {func.id!r} is not allowed (allowed: {', '.join(sorted(FUNCTIONS))})")
        elif not (isinstance(func, ast.Attribute) and func.attr in ("item", "numel")):
            raise ExpressionError(f"{expr!r}: calling {ast.unparse(func)!r} is not allowed "
                                  f"(allowed: {', '.join(sorted(FUNCTIONS))}, .item(), .numel())")


class _Evaluator:
    def __init__(self, env: Mapping[str, Any], expr: str):
        self.env = env
        self.expr = expr

    def visit(self, node: ast.AST) -> Any:
        return getattr(self, "visit_" + type(node).__name__)(node)

    def visit_Constant(self, node):
        return node.value

    def visit_Name(self, node):
        if node.id in self.env:
            return self.env[node.id]
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        raise ExpressionError(f"{self.expr!r}: no value for {node.id!r}")

    def visit_BinOp(self, node):
        left, right = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)) and abs(right) > _MAX_EXPONENT:
            raise ExpressionError(f"{self.expr!r}: exponent {right} is too large")
        return _BINOPS[type(node.op)](left, right)

    def visit_UnaryOp(self, node):
        return _UNARY[type(node.op)](self.visit(node.operand))

    def visit_BoolOp(self, node):
        is_and = isinstance(node.op, ast.And)
        value: Any = is_and
        for operand in node.values:
            value = self.visit(operand)
            if bool(value) != is_and:
                return value
        return value

    def visit_Compare(self, node):
        left = self.visit(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = self.visit(comparator)
            if not bool(_COMPARE[type(op)](left, right)):
                return False
            left = right
        return True

    def visit_IfExp(self, node):
        return self.visit(node.body) if bool(self.visit(node.test)) else self.visit(node.orelse)

    def visit_Call(self, node):
        args = [self.visit(a) for a in node.args]
        if isinstance(node.func, ast.Name):
            return FUNCTIONS[node.func.id](*args)
        return getattr(self.visit(node.func.value), node.func.attr)(*args)

    def visit_Attribute(self, node):
        return getattr(self.visit(node.value), node.attr)

    def visit_Subscript(self, node):
        return self.visit(node.value)[self.visit(node.slice)]

    def visit_Slice(self, node):
        part = lambda n: None if n is None else self.visit(n)  # noqa: E731
        return slice(part(node.lower), part(node.upper), part(node.step))

    def visit_Tuple(self, node):
        return tuple(self.visit(e) for e in node.elts)


def is_number(value: Optional[Any]) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
