"""Why a sync site of SGLang's loop is reached by no variant: read from the source.

For each site no variant reaches, the reason comes from SGLang's own code, in this order:

1. a platform guard found by AST: the site (or the call of its function, where the function's
   own body has no guard) runs only under ``_is_npu`` / ``_is_hip`` / ``_is_xpu`` /
   ``_is_musa`` -> category ``platform``, the guard quoted;
2. no call site: the site's function is called nowhere in the sglang package (its name is
   not called in any file) -> category ``unused``;
3. an entry of :data:`CONDITIONS`, keyed by (file name, function, code piece): the SGLang
   condition that must hold for the site to run (checked: it must be one of the AST guards
   on the path to the site, else the entry is stale and the reason says so) and why no
   variant meets it -> its category (``not_driven``: a CUDA configuration SGLang has and the
   harness does not drive yet; ``harness``: driven code the harness replaces).

A site that none of these explain gets category ``unknown`` with its guards: the test that
every unreached site has a reason then fails.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PLATFORM_FLAGS = {"_is_npu": "NPU", "_is_hip": "HIP (ROCm)", "_is_xpu": "XPU",
                  "_is_musa": "MUSA"}


@dataclass(frozen=True, slots=True)
class Condition:
    """A documented reason: the site (file name, function's last name, code piece), the
    function whose guards hold ``condition`` (the site's own, or its caller's), the category
    and the text."""

    file: str
    function: str
    code: str
    guarded_in: str
    condition: str
    category: str
    reason: str


CONDITIONS: tuple[Condition, ...] = (
    Condition("scheduler.py", "run_batch", "forward_done", "run_batch",
              "self.enable_unified_memory", "not_driven",
              "unified memory's forward_done event is recorded only with "
              "--enable-unified-memory; the unified_memory variant drives it where the "
              "release has the unified pool's allocator package "
              "(sglang.srt.mem_cache.allocator.unified_sub_pool) and its page-copy kernel "
              "(sglang.kernels.ops.kvcache.copy_pages), and is not applicable to a release "
              "without them (release_features.py)"),
    Condition("multi_layer_eagle_worker_v2.py", "_draft_extend_for_decode", "record",
              "_draft_extend_for_decode", "boundary_kv_locs is not None", "not_driven",
              "the multi-layer worker records its boundary-KV event only when the draft "
              "extend widens its KV locations (the boundary-KV window); the multi_layer_eagle "
              "variants run without the window (docs/sglang-configurations.md)"),
    Condition("multi_layer_eagle_worker_v2.py", "_draft_extend_for_decode", "wait_event",
              "_draft_extend_for_decode", "boundary_kv_ready_event is not None", "not_driven",
              "the plan stream waits on the boundary-KV event only when it was recorded (the "
              "boundary-KV window); the multi_layer_eagle variants run without the window"),
    Condition("shared_read_event.py", "maybe_publish_prefill_shared_read_done", "record",
              "maybe_publish_prefill_shared_read_done",
              "shared_read_ends is not SharedReadEnds.PRE_REPLAY", "harness",
              "the prefill read-done fastpath is taken by SGLang's eager runner or prefill "
              "graph runner when the attention backend resolves the prefill's shared reads to "
              "PRE_REPLAY (TRT-LLM MHA, DeepSeek-V4, MiniMax sparse NVFP4 backends on CUDA); "
              "the harness drives it only in prefill_pre_replay (SGLang's eager runner with a "
              "PRE_REPLAY stand-in backend), which needs the eager runner's publish; the "
              "prefill graph runner is not driven"),
)


def _function_nodes(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function of a module."""
    found: list[tuple[str, ast.AST]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append((name, child))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)
    visit(tree, "")
    return found


@cache
def _parsed(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text())


def _exits(block: list[ast.stmt]) -> bool:
    return bool(block) and isinstance(block[-1], (ast.Return, ast.Raise, ast.Continue))


def _negated(test: ast.expr) -> str:
    """The text of ``not test`` (``not (not X)`` read as ``X``)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return ast.unparse(test.operand)
    return f"not ({ast.unparse(test)})"


def guards_at(path: str, line: int) -> tuple[str, list[str]]:
    """The innermost function holding ``line`` of ``path`` (qualified name) and the
    conditions that must hold for that line to run: the tests of the ``if``s around it
    (``not (...)`` in an ``else``) and of the early exits before it (``if X: return``
    gives ``not (X)``), outermost first."""
    functions = [(name, node) for name, node in _function_nodes(_parsed(path))
                 if node.lineno <= line <= (node.end_lineno or node.lineno)]
    if not functions:
        return "", []
    name, function = max(functions, key=lambda item: item[1].lineno)
    guards: list[str] = []

    def walk(block: list[ast.stmt]) -> bool:
        for stmt in block:
            start, end = stmt.lineno, stmt.end_lineno or stmt.lineno
            if end < line:
                if isinstance(stmt, ast.If) and _exits(stmt.body) and not stmt.orelse:
                    guards.append(_negated(stmt.test))
                continue
            if start > line:
                return False
            if isinstance(stmt, ast.If) and stmt.body[0].lineno <= line:
                in_body = line <= (stmt.body[-1].end_lineno or stmt.body[-1].lineno)
                guards.append(ast.unparse(stmt.test) if in_body else _negated(stmt.test))
                return walk(stmt.body if in_body else stmt.orelse)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(stmt, field, None)
                if inner and any(s.lineno <= line <= (s.end_lineno or s.lineno)
                                 for s in inner):
                    return walk(inner)
            return True
        return True
    walk(function.body)  # type: ignore[attr-defined]
    return name, guards


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def call_lines(path: str, callee: str, caller: str | None = None) -> list[int]:
    """Lines of ``path`` that call a function or method named ``callee`` (only inside the
    function ``caller``, a qualified name's last part, when given)."""
    nodes: list[ast.AST] = [_parsed(path)] if caller is None else [
        node for name, node in _function_nodes(_parsed(path))
        if name.rsplit(".", 1)[-1] == caller]
    return sorted({call.lineno for node in nodes for call in ast.walk(node)
                   if isinstance(call, ast.Call) and _called_name(call) == callee})


def has_call_site(package: Path, callee: str) -> bool:
    """Whether any file of the package calls a function or method named ``callee``."""
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(errors="replace")
        if f"{callee}(" not in text:
            continue
        try:
            tree = _parsed(str(path))
        except SyntaxError:
            continue
        if any(isinstance(call, ast.Call) and _called_name(call) == callee
               for call in ast.walk(tree)):
            return True
    return False


def _platform(guards: list[str]) -> str | None:
    """The platform a guard requires: a flag of :data:`PLATFORM_FLAGS` alone or as one
    conjunct of an ``and`` (``_is_npu or X`` requires nothing)."""
    for guard in guards:
        test = ast.parse(guard, mode="eval").body
        conjuncts = test.values if isinstance(test, ast.BoolOp) and isinstance(
            test.op, ast.And) else [test]
        for term in conjuncts:
            if isinstance(term, ast.Name) and term.id in PLATFORM_FLAGS:
                return f"runs only on {PLATFORM_FLAGS[term.id]}: guarded by `{guard}`"
    return None


def _documented(file_name: str, function: str, code: str) -> Condition | None:
    last = function.rsplit(".", 1)[-1]
    return next((c for c in CONDITIONS if c.file == file_name and c.function == last
                 and c.code in code), None)


def reason(package: Path, site: str, code: str) -> dict[str, object]:
    """Why ``site`` (``sglang/srt/...:line``) is reached by no variant: ``{site, function,
    category, guards, condition, reason}`` (module docstring); ``package`` holds ``srt/``."""
    relative, line_text = site.rsplit(":", 1)
    path = str(package / relative.removeprefix("sglang/"))
    function, guards = guards_at(path, int(line_text))
    out: dict[str, object] = {"site": site, "function": function, "guards": guards}
    last = function.rsplit(".", 1)[-1]
    platform = _platform(guards)
    callers: list[str] = []
    if platform is None and last:
        # a guard-free function: its callers' guards in the same file
        for call_line in call_lines(path, last):
            caller, caller_guards = guards_at(path, call_line)
            callers.append(caller)
            platform = platform or _platform(caller_guards)
    if platform is not None:
        return {**out, "category": "platform", "condition": platform.split("`")[1],
                "reason": platform}
    if last and not callers and not has_call_site(package, last):
        return {**out, "category": "unused", "condition": f"a call of {last}",
                "reason": f"{last} is called nowhere in the sglang package (no call site)"}
    documented = _documented(Path(relative).name, function, code)
    if documented is not None:
        checked = guards if documented.guarded_in == last else _caller_guards(
            path, documented.guarded_in, last)
        if any(documented.condition in guard for guard in checked):
            return {**out, "category": documented.category,
                    "condition": documented.condition, "reason": documented.reason}
        return {**out, "category": "unknown", "condition": documented.condition,
                "reason": f"stale entry: `{documented.condition}` is no longer a guard of "
                f"this site ({checked})"}
    return {**out, "category": "unknown", "condition": "", "reason": ""}


def _caller_guards(path: str, caller: str, callee: str) -> list[str]:
    guards: list[str] = []
    for call_line in call_lines(path, callee, caller):
        guards += guards_at(path, call_line)[1]
    return guards
