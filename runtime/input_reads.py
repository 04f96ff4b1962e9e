"""Which input values a workflow's steps read, told from their code (for the fork editor).

A step reads its run's inputs as ``ctx.inputs["name"]`` or ``ctx.inputs.get("name")``.
``inputs_read`` parses each step function (and each function of its module that a step
hands ``ctx`` to) and collects those names. Any other use (``ctx.inputs`` passed on, looped
over, indexed by a variable; ``ctx`` handed to code it cannot find) means any key may be
read, and it answers None: "cannot tell" is said as such, never guessed. A workflow without
code in this process (an external driver's) is None too.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from runtime.registry import workflow_code

_MAX_DEPTH = 4


class _Unknown(Exception):
    """The code uses the inputs (or the context) in a way that is not a named read."""


def _first_parameter(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    params = [*node.args.posonlyargs, *node.args.args]
    return params[0].arg if params else None


def _keys_of(fn: Callable[..., Any], depth: int, seen: set[Any]) -> set[str]:
    if fn in seen:
        return set()
    seen.add(fn)
    if depth > _MAX_DEPTH:
        raise _Unknown
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise _Unknown
    tree = ast.parse(source)
    node = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)), None
    )
    name = node and _first_parameter(node)
    if name is None:
        return set()
    parents = {child: parent for parent in ast.walk(node) for child in ast.iter_child_nodes(parent)}
    keys: set[str] = set()
    for use in ast.walk(node):
        if not (isinstance(use, ast.Name) and use.id == name and use is not node):
            continue
        parent = parents.get(use)
        if isinstance(parent, ast.Attribute):
            if parent.attr != "inputs":
                continue  # ctx.model, ctx.artifact_text(...): not the inputs
            keys.add(_named_read(parent, parents))
        elif isinstance(parent, ast.Call) and use in parent.args:
            # ctx handed on: follow it into a function of the same module, or give up.
            callee = _resolve(parent.func, fn)
            if callee is None:
                raise _Unknown
            if not _module_reads_inputs(callee):
                continue  # e.g. runtime.effects.effect_perform: no ".inputs" in its module
            if not inspect.isfunction(callee):
                raise _Unknown
            keys |= _keys_of(callee, depth + 1, seen)
        elif isinstance(parent, ast.keyword | ast.Starred):
            raise _Unknown
    return keys


def _named_read(attribute: ast.Attribute, parents: dict[ast.AST, ast.AST]) -> str:
    """The key of ``ctx.inputs["k"]`` or ``ctx.inputs.get("k"...)``, else _Unknown."""
    parent = parents.get(attribute)
    if isinstance(parent, ast.Subscript) and parent.value is attribute:
        if isinstance(parent.slice, ast.Constant) and isinstance(parent.slice.value, str):
            return parent.slice.value
    if isinstance(parent, ast.Attribute) and parent.attr == "get":
        call = parents.get(parent)
        if (
            isinstance(call, ast.Call)
            and call.args
            and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, str)
        ):
            return call.args[0].value
    raise _Unknown


def _resolve(func: ast.expr, fn: Callable[..., Any]) -> Callable[..., Any] | None:
    target = getattr(fn, "__globals__", {}).get(func.id) if isinstance(func, ast.Name) else None
    return target if inspect.isfunction(target) or inspect.isclass(target) else None


def _module_reads_inputs(callee: Callable[..., Any]) -> bool:
    """Whether the module defining ``callee`` mentions ``.inputs`` at all (if not, nothing
    it defines can read a context's inputs)."""
    module = inspect.getmodule(callee)
    try:
        return ".inputs" in inspect.getsource(module) if module else True
    except (OSError, TypeError):
        return True


def inputs_read(workflow_type: str, version: str) -> frozenset[str] | None:
    """The input names the workflow's steps read, or None when that cannot be told."""
    workflow = workflow_code(workflow_type, version)
    if workflow is None:
        return None
    keys: set[str] = set()
    try:
        for spec in workflow.steps.values():
            keys |= _keys_of(spec.fn, 0, set())
    except (_Unknown, SyntaxError):
        return None
    return frozenset(keys)
