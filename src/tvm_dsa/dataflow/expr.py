"""Quasi-affine expressions of loop variables, written in Python syntax, translated to isl.

The dataflow notation (seed 003) writes stamps as affine combinations of loop indices, with
floor-division and modulo by constants when the iteration space exceeds the PE array:
``i % 8``, ``i // 8`` or the seed's ``fl(i / 8)``. Parsing them with Python's ``ast`` instead of
handing the text to isl gives errors that name the problem (an unknown loop, a product of two
loops) and a fully parenthesised isl text whatever isl's own precedence rules are.
"""

from __future__ import annotations

import ast


class NotationError(ValueError):
    """A tensor operation, dataflow or interconnect that the notation cannot express."""


def to_isl(text: str, loops: tuple[str, ...]) -> str:
    """The isl text of the quasi-affine expression ``text`` over the variables ``loops``."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise NotationError(f"cannot parse the expression {text!r}") from None
    return _Translator(text, loops).visit(tree.body)


def constraint_to_isl(text: str, loops: tuple[str, ...]) -> str:
    """The isl text of ``text``, comparisons of quasi-affine expressions joined by and / or
    (chains such as ``0 <= i - j < 4`` allowed)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise NotationError(f"cannot parse the constraint {text!r}") from None
    return _Translator(text, loops).constraint(tree.body)


def _constant(node: ast.AST) -> int | None:
    """The integer value of a constant (possibly negated) node, or None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant(node.operand)
        return None if inner is None else -inner
    return None


_COMPARISONS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "="}


class _Translator:
    def __init__(self, text: str, loops: tuple[str, ...]):
        self.text, self.loops = text, loops

    def fail(self, why: str) -> NotationError:
        return NotationError(f"{self.text!r} is not quasi-affine in ({', '.join(self.loops)}): {why}")

    def divisor(self, node: ast.AST, op: str) -> int:
        value = _constant(node)
        if value is None or value <= 0:
            raise self.fail(f"{op} needs a positive integer constant on its right")
        return value

    def constraint(self, node: ast.AST) -> str:
        if isinstance(node, ast.BoolOp):
            joiner = " and " if isinstance(node.op, ast.And) else " or "
            return "(" + joiner.join(self.constraint(v) for v in node.values) + ")"
        if isinstance(node, ast.Compare):
            parts = [self.visit(node.left)]
            for op, right in zip(node.ops, node.comparators):
                if type(op) not in _COMPARISONS:
                    raise NotationError(f"{self.text!r}: unsupported comparison {type(op).__name__}")
                parts += [_COMPARISONS[type(op)], self.visit(right)]
            return "(" + " ".join(parts) + ")"
        raise NotationError(f"{self.text!r} is not a constraint: expected comparisons joined by and / or")

    def visit(self, node: ast.AST) -> str:
        value = _constant(node)
        if value is not None:
            return str(value)
        if isinstance(node, ast.Name):
            if node.id not in self.loops:
                raise self.fail(f"unknown loop variable {node.id!r}")
            return node.id
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            sign = "-" if isinstance(node.op, ast.USub) else ""
            return f"{sign}({self.visit(node.operand)})"
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, (ast.Add, ast.Sub)):
                op = "+" if isinstance(node.op, ast.Add) else "-"
                return f"({self.visit(node.left)} {op} {self.visit(node.right)})"
            if isinstance(node.op, ast.Mult):
                left, right = _constant(node.left), _constant(node.right)
                if left is None and right is None:
                    raise self.fail(f"{ast.unparse(node)} multiplies two non-constant terms")
                factor, term = (left, node.right) if left is not None else (right, node.left)
                return f"{factor}*({self.visit(term)})"
            if isinstance(node.op, ast.FloorDiv):
                return f"floor(({self.visit(node.left)})/{self.divisor(node.right, '//')})"
            if isinstance(node.op, ast.Mod):
                return f"(({self.visit(node.left)}) mod {self.divisor(node.right, '%')})"
            if isinstance(node.op, ast.Div):
                raise self.fail("'/' is only allowed inside fl(...) or floor(...); use //")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("fl", "floor")
                and len(node.args) == 1 and not node.keywords):
            arg = node.args[0]
            if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Div):
                return f"floor(({self.visit(arg.left)})/{self.divisor(arg.right, '/')})"
            return self.visit(arg)
        raise self.fail(f"unsupported term {ast.unparse(node)!r}")


def linear_form(text: str, loops: tuple[str, ...]) -> tuple[dict[str, int], int]:
    """``text`` as integer coefficients of the loops and a constant, for an affine expression
    (``ox + rx - 1`` -> ``({"ox": 1, "rx": 1}, -1)``); floor-division and modulo are refused."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise NotationError(f"cannot parse the expression {text!r}") from None
    coefs: dict[str, int] = {}
    const = 0

    def walk(node: ast.AST, sign: int) -> None:
        nonlocal const
        value = _constant(node)
        if value is not None:
            const += sign * value
        elif isinstance(node, ast.Name) and node.id in loops:
            coefs[node.id] = coefs.get(node.id, 0) + sign
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            walk(node.operand, -sign if isinstance(node.op, ast.USub) else sign)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            walk(node.left, sign)
            walk(node.right, sign if isinstance(node.op, ast.Add) else -sign)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and (
                _constant(node.left) is not None or _constant(node.right) is not None):
            factor, term = ((_constant(node.left), node.right) if _constant(node.left) is not None
                            else (_constant(node.right), node.left))
            walk(term, sign * factor)
        else:
            raise NotationError(f"{text!r} is not affine in ({', '.join(loops)}): {ast.unparse(node)!r}")

    walk(tree.body, 1)
    return {v: c for v, c in coefs.items() if c}, const
