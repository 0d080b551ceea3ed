"""The package layout: every import points down the pipeline, no circles, no private names.

Levels, lowest first (a module may import its own level or a lower one):

0. ``fairlib.paths``, ``fairlib.sim`` (the engine model and its policies), the package root
1. ``fairlib.workload``, ``fairlib.traces``, ``fairlib.scenarios``: what is sent; ``fairlib.drift``:
   the output-length estimate (chapter 5); ``fairlib.pools``: capacity and the pool's parameters
   (chapter 6)
2. ``fairlib.records``: the seam both backends write and the analysis reads
3. ``fairlib.client``: the HTTP backend; ``fairlib.servers``: how fairlib's servers run
4. ``fairlib.serve`` (test doubles), ``fairlib.gateway`` (the policies in front of an engine),
   ``fairlib.backend`` (the one fork), ``fairlib.sweep``, ``fairlib.analysis``
5. ``fairlib.calibrate``: probing and fitting real engines, their processes
6. ``fairlib.chapters``: book-only code
7. ``fairlib.cli`` and its entry ``fairlib.__main__``

Also: the module graph has no cycle, no module imports another module's private (``_name``)
attribute, and imports inside functions are kept for heavy or optional dependencies only (none of
fairlib's own modules).
"""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "fairlib"
LEVELS = {"fairlib.paths": 0, "fairlib.sim": 0, "fairlib": 0,
          "fairlib.workload": 1, "fairlib.traces": 1, "fairlib.scenarios": 1, "fairlib.drift": 1,
          "fairlib.pools": 1,
          "fairlib.records": 2, "fairlib.client": 3, "fairlib.servers": 3,
          "fairlib.serve": 4, "fairlib.gateway": 4, "fairlib.backend": 4, "fairlib.sweep": 4, "fairlib.analysis": 4,
          "fairlib.calibrate": 5, "fairlib.chapters": 6, "fairlib.cli": 7, "fairlib.__main__": 7}


def _modname(p: Path) -> str:
    parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def level(mod: str) -> int:
    """The level of the longest prefix of ``mod`` in :data:`LEVELS`."""
    parts = mod.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in LEVELS:
            return LEVELS[".".join(parts[:k])]
    raise KeyError(f"{mod} has no level: add its folder to LEVELS")


def _imports(path: Path, mod: str = None):
    """(target module, names, at top level?) for each import of fairlib in ``path`` (the module
    ``mod``, by default the one the path names under the package)."""
    tree = ast.parse(path.read_text())
    top = set()
    for node in tree.body:
        for n in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            top.add(n)
    mod = mod or _modname(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{mod}: relative import (use fairlib.*)"
            if (node.module or "").split(".")[0] == "fairlib":
                yield node.module, [a.name for a in node.names], node in top
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "fairlib":
                    yield a.name, [], node in top


def _graph():
    mods = {_modname(p): p for p in PKG.rglob("*.py")}
    edges = {}
    for m, p in mods.items():
        out = set()
        for target, names, _ in _imports(p):
            for n in names:      # `from fairlib.x import y`: y may be a submodule
                if f"{target}.{n}" in mods:
                    out.add(f"{target}.{n}")
            out.add(target)
        edges[m] = out - {m}
    return mods, edges


def test_every_module_has_a_level():
    for m in _graph()[0]:
        level(m)


def test_imports_point_down():
    mods, edges = _graph()
    up = [(m, t) for m, ts in edges.items() for t in ts if level(t) > level(m)]
    assert not up, "imports from a lower level into a higher one:\n" + "\n".join(f"{m} -> {t}" for m, t in up)


def test_no_cycles():
    mods, edges = _graph()
    # a package's __init__ importing its own submodules is not a cycle of the layout
    g = {m: {t for t in ts if t in mods and not (m.startswith(t + ".") and mods[t].name == "__init__.py")}
         for m, ts in edges.items()}
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_names_across_modules():
    bad = []
    for p in PKG.rglob("*.py"):
        me = _modname(p)
        for target, names, _ in _imports(p):
            bad += [f"{me}: from {target} import {n}" for n in names
                    if n.startswith("_") and not n.startswith("__") and target != me]
    assert not bad, "\n".join(bad)


#: What may be imported inside a function: heavy or optional packages a run does not need
#: (charts, tokenizers, progress bars, the notebook display).
LAZY_OK = {"altair", "transformers", "tokenizers", "tqdm", "IPython", "tiktoken"}


def test_imports_inside_functions_only_for_heavy_optional_packages():
    inner = []
    for p in PKG.rglob("*.py"):
        tree = ast.parse(p.read_text())
        top = {n for node in tree.body     # a module's own statements, also under a top-level if/try
               for n in (ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node])}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in top:
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if (mod or "").split(".")[0] not in LAZY_OK:
                    inner.append(f"{_modname(p)}:{node.lineno}: {ast.unparse(node)}")
    assert not inner, "imports inside functions:\n" + "\n".join(inner)


@pytest.mark.parametrize("mod,lvl", [("fairlib.sim.policies.vtc", 0), ("fairlib.records.run", 2),
                                     ("fairlib.chapters.grid", 6), ("fairlib.cli", 7)])
def test_level_of(mod, lvl):
    assert level(mod) == lvl


def test_the_checks_catch_what_they_check(tmp_path):
    """The parser sees an upward, an inner and a private import in a made-up module."""
    fake = tmp_path / "_layout_probe.py"
    fake.write_text("from fairlib.chapters import book\n\ndef f():\n    from fairlib.records.run import _x\n")
    found = list(_imports(fake, "fairlib.sim._layout_probe"))
    assert ("fairlib.chapters", ["book"], True) in found and ("fairlib.records.run", ["_x"], False) in found
    assert level("fairlib.sim._layout_probe") < level("fairlib.chapters")
