"""tests/python/test_package_layout.py — the shape of the Python package (python/tpcheck),
read from its source, nothing imported.

* No import cycles: every `import` statement of every module (at module level and inside
  functions alike) is an edge to the module it names — `from . import x` names the submodule
  x when there is one, else the package; `from .a import b` names a; the compiled module
  `_tpcheck` is a leaf — and no module may reach itself along the edges. (A package's
  __init__ importing its own submodules is no cycle: a submodule names its package only
  when it imports from it.)
* tpcheck.emulate: no function longer than ~60 lines, the process group a thin adapter.
"""

import ast
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.normpath(os.path.join(HERE, "..", "..", "python", "tpcheck"))
COMPILED = {"tpcheck._tpcheck"}
MAX_FUNCTION_LINES = 60
MAX_GROUP_LINES = 200


def modules():
    """{dotted name: path} of every .py file under python/tpcheck."""
    out = {}
    root = os.path.dirname(PACKAGE)
    for d, dirs, files in os.walk(PACKAGE):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), root)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(d, f)
    return out


def imports_of(name, path, known):
    """The tpcheck modules `name` (at `path`) imports."""
    is_package = path.endswith("__init__.py")
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "tpcheck")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "tpcheck":
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in known or sub in COMPILED else mod)
    return {m for m in found if m not in COMPILED and m != name}


def import_graph():
    known = modules()
    return {name: {m for m in imports_of(name, path, known) if m in known}
            for name, path in known.items()}


def cycles(graph):
    """Every strongly connected component of more than one module (Tarjan), as sorted lists."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_the_package():
    graph = import_graph()
    assert {"tpcheck", "tpcheck.emulate", "tpcheck.emulate.group", "tpcheck.emulate.protocol"} <= set(graph)
    assert "tpcheck.emulate.protocol" in graph["tpcheck.emulate.engine"]
    assert "tpcheck.emulate.launcher" in graph["tpcheck.__main__"]
    # A cycle is found when there is one.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_one_that_imports_it_back():
    found = cycles(import_graph())
    assert not found, "import cycles in python/tpcheck (each a set of modules that import each " \
                      "other, directly or through the others): " + "; ".join(" <-> ".join(c) for c in found)


def functions(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node, node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("name", sorted(m for m in modules() if m.startswith("tpcheck.emulate")))
def test_emulate_functions_are_short(name):
    path = modules()[name]
    long = [f"{node.name} ({n} lines, line {node.lineno})" for node, n in functions(path)
            if not isinstance(node, ast.ClassDef) and n > MAX_FUNCTION_LINES]
    assert not long, f"{path}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


def test_the_process_group_is_a_thin_adapter():
    path = modules()["tpcheck.emulate.group"]
    sizes = {node.name: n for node, n in functions(path) if isinstance(node, ast.ClassDef)}
    assert sizes["TpcheckProcessGroup"] <= MAX_GROUP_LINES, sizes
