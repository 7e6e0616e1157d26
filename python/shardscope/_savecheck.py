"""`shardscope-check --save-check` (docs/check.md): the script's own saves, run once on the
check's CPU ranks after its last step, so that a save the K steps never reach (every 1000
steps, at the end of an epoch) is checked as if it had run: the agent watches it as it watches
every save (partitioned_save, issue 54) and names the script's line.

A save is a call the script makes, as written in its source: ``torch.save(OBJ, FILE)``,
``X.save_pretrained(DIR)``, ``X.save_checkpoint(DIR)``, ``X.save_16bit_model(DIR)``,
``X.save_model(DIR)`` (the Trainer's), ``dcp.save(OBJ, checkpoint_id=DIR)``. Those in the function
the training loop runs in (the frame the last step returned to) are run there, in source
order, with that frame's variables; a call there to a function of the script that saves runs
that function's saves with its arguments bound, those its `if` branches lead to with these
arguments (the loop's own condition, `if step % 1000 == 0`, is what is bypassed; a save
function's `if how == "dcp"` is the script's choice, kept). Loops around a save that the
frame has not entered bind their variable to the first item of a list, tuple or range they
go over. Where the call writes (FILE, DIR) becomes a
folder of the check's own: nothing is written where the script would write. A save that
cannot be evaluated there (a name it needs is made later) is reported, not guessed at.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from types import FrameType
from typing import Any, Optional

# method name -> (the position of its destination argument, the keywords that can name it)
_METHODS = {
    "save_pretrained": (0, ("save_directory",)),
    "save_checkpoint": (0, ("save_dir",)),
    "save_16bit_model": (0, ("save_dir",)),
    "save_model": (0, ("output_dir",)),
}
_DESTINATION = "__shardscope_save_to"


@dataclass
class Save:
    line: int
    text: str  # the call as the source writes it
    node: ast.Call
    kind: str  # "torch.save", "dcp.save" or the method's name


def _save_of(call: ast.Call) -> Optional[str]:
    f = call.func
    if isinstance(f, ast.Attribute):
        if f.attr == "save" and isinstance(f.value, ast.Name) and f.value.id == "torch":
            return "torch.save"
        if f.attr == "save" and ((isinstance(f.value, ast.Name) and f.value.id in ("dcp", "checkpoint"))
                                 or ast.unparse(f.value) == "torch.distributed.checkpoint"):
            return "dcp.save"
        if f.attr in _METHODS:
            return f.attr
    return None


def _own_calls(body: list) -> list:
    """The calls in statements of body, not those inside nested functions and classes."""
    out = []
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return sorted(out, key=lambda c: (c.lineno, c.col_offset))


def saves_in(source: str, filename: str = "<script>") -> list[Save]:
    """Every save call in the script, in source order (what the report names when
    --save-check is not given)."""
    tree = ast.parse(source, filename)
    found = [Save(c.lineno, ast.get_source_segment(source, c) or ast.unparse(c), c, kind)
             for c in ast.walk(tree) if isinstance(c, ast.Call) and (kind := _save_of(c))]
    return sorted(found, key=lambda s: s.line)


def _function_at(tree: ast.Module, line: int) -> Optional[ast.AST]:
    """The innermost function of tree whose lines hold line; None: module level."""
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first <= line <= (node.end_lineno or node.lineno):
                if best is None or first >= best[0]:
                    best = (first, node)
    return best[1] if best is not None else None


def _redirected(call: ast.Call, kind: str) -> Optional[ast.Call]:
    """The call with its destination replaced by the check's own; None: no destination."""
    copy = ast.fix_missing_locations(ast.parse(ast.unparse(call), mode="eval").body)
    assert isinstance(copy, ast.Call)
    call = copy
    to = ast.Name(id=_DESTINATION, ctx=ast.Load())
    keywords: tuple[str, ...]
    if kind == "torch.save":
        position, keywords = 1, ("f",)
    elif kind == "dcp.save":
        position, keywords = -1, ("checkpoint_id", "storage_writer")
    else:
        position, keywords = _METHODS[kind]
    for k in call.keywords:
        if k.arg in keywords:
            k.value = to
            if k.arg == "storage_writer":
                k.arg = "checkpoint_id"
            return call
    if 0 <= position < len(call.args):
        call.args[position] = to
        return call
    if kind == "dcp.save":
        call.keywords.append(ast.keyword(arg="checkpoint_id", value=to))
        return call
    return None


def _evaluate(call: ast.Call, line: int, filename: str, function: str, scope_globals: dict,
              scope_locals: dict, destination: str) -> None:
    expression = ast.Expression(body=call)
    for node in ast.walk(expression):  # the script's line, as the agent names it
        if hasattr(node, "lineno"):
            node.lineno = node.end_lineno = line  # type: ignore[attr-defined]
    code = compile(ast.fix_missing_locations(expression), filename, "eval")
    code = code.replace(co_name=function.rsplit(".", 1)[-1], co_qualname=function)  # as the script's
    local = dict(scope_locals)
    local[_DESTINATION] = destination
    eval(code, scope_globals, local)


def _loop_bindings(call: ast.Call, parents: dict, scope_globals: dict, scope_locals: dict) -> dict:
    """The locals a save needs from loops around it that the stopped frame has not entered
    (`for how in args.save_how: save(..., how)`): each such loop's variable bound to the first
    item of what it loops over, when that is a list, tuple, range, string or dict (never an
    iterator, which taking an item from would consume: a data loader)."""
    loops = []
    node = parents.get(id(call))
    while node is not None:
        if isinstance(node, ast.For):
            loops.append(node)
        node = parents.get(id(node))
    local = dict(scope_locals)
    for loop in reversed(loops):  # outermost first
        names = [n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)]
        if not names or any(name in local for name in names):
            continue
        try:
            items = eval(compile(ast.Expression(loop.iter), "<loop>", "eval"), scope_globals, local)
            if not isinstance(items, (list, tuple, range, str, dict)) or len(items) == 0:
                continue
            first = next(iter(items))
            if isinstance(loop.target, ast.Name):
                local[loop.target.id] = first
            elif isinstance(loop.target, ast.Tuple) and all(isinstance(e, ast.Name)
                                                            for e in loop.target.elts):
                for e, v in zip(loop.target.elts, first, strict=True):
                    local[e.id] = v  # type: ignore[attr-defined]
        except Exception:
            continue
    return local


def _branch_taken(call: ast.Call, parents: dict, scope_globals: dict, scope_locals: dict) -> bool:
    """Whether the `if` branches around call (inside a save function of the script: the ones
    its arguments choose, `if how == "dcp"`) lead to it with these arguments; a test that
    cannot be evaluated counts as taken."""
    child: ast.AST = call
    node = parents.get(id(call))
    while node is not None:
        if isinstance(node, ast.If):
            try:
                test = bool(eval(compile(ast.Expression(node.test), "<if>", "eval"), scope_globals,
                                 dict(scope_locals)))
            except Exception:
                test = None
            if test is not None and (test if any(child is b for b in node.orelse) else not test):
                return False
        child, node = node, parents.get(id(node))
    return True


def run_saves(frame: Optional[FrameType], script: str, into: str) -> list[dict[str, Any]]:
    """Runs the saves of the script's function frame (or a caller of it) is in, each into its
    own folder under into; what ran or could not, one dict per save."""
    path = os.path.abspath(script)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) != path:
        frame = frame.f_back
    if frame is None:
        return [{"line": 0, "call": "", "ran": False,
                 "error": "the last step was not called from the script's own code"}]
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, path)
    scope = _function_at(tree, frame.f_lineno)
    body = scope.body if scope is not None else tree.body  # type: ignore[attr-defined]
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    out: list[dict[str, Any]] = []
    n = 0

    def one(call, kind, g, loc, where, function):
        nonlocal n
        n += 1
        destination = os.path.join(into, f"save-{n}")
        os.makedirs(destination, exist_ok=True)
        if kind == "torch.save":
            destination = os.path.join(destination, "saved.pt")
        entry = {"line": call.lineno, "call": ast.get_source_segment(source, call) or ast.unparse(call),
                 "ran": False, "error": None, "via": where}
        redirected = _redirected(call, kind)
        if redirected is None:
            entry["error"] = "it names no destination the check can replace"
        else:
            try:
                _evaluate(redirected, call.lineno, path, function, g, loc, destination)
                entry["ran"] = True
            except Exception as e:  # the script's own error, or a name made later
                entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)

    parents = {id(child): node for node in ast.walk(scope or tree) for child in ast.iter_child_nodes(node)}
    for call in _own_calls(body):
        kind = _save_of(call)
        if kind is None and not (isinstance(call.func, ast.Name) and call.func.id in functions):
            continue
        frame_locals = _loop_bindings(call, parents, frame.f_globals, dict(frame.f_locals))
        if kind is not None:
            one(call, kind, frame.f_globals, frame_locals, None, frame.f_code.co_qualname)
            continue
        # a function of the script that saves, called here: its saves with its arguments
        callee = functions.get(call.func.id) if isinstance(call.func, ast.Name) else None
        inner = [(c, k) for c in _own_calls(callee.body) if (k := _save_of(c))] if callee else []
        if not inner:
            continue
        fn: Any = frame.f_globals.get(callee.name)  # type: ignore[union-attr]
        try:
            import inspect

            args = [eval(compile(ast.Expression(a), path, "eval"), frame.f_globals, frame_locals)
                    for a in call.args]
            kwargs = {k.arg: eval(compile(ast.Expression(k.value), path, "eval"), frame.f_globals,
                                  frame_locals) for k in call.keywords if k.arg}
            bound = inspect.signature(fn).bind(*args, **kwargs)
            bound.apply_defaults()
        except Exception as e:
            out.append({"line": call.lineno, "call": ast.get_source_segment(source, call) or "",
                        "ran": False, "error": f"its arguments: {type(e).__name__}: {e}", "via": None})
            continue
        inside = {id(child): node for node in ast.walk(callee)  # type: ignore[arg-type]
                  for child in ast.iter_child_nodes(node)}
        for c, k in inner:
            if _branch_taken(c, inside, fn.__globals__, bound.arguments):
                one(c, k, fn.__globals__, dict(bound.arguments), call.lineno, fn.__qualname__)
    return out
