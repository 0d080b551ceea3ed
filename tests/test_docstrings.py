"""The public faces are documented numpydoc-style, true to their signatures (issue 22 item 5).

For every public callable below, numpydoc's own parser (``numpydoc.docscrape``) reads the
docstring and the test asserts:

- a ``Parameters`` section naming exactly the parameters of ``inspect.signature`` (``self``
  excluded; ``*args``/``**kwargs`` written with their stars, untyped as numpydoc has them), in
  order, each with a type and a description;
- a ``Returns`` (or ``Yields``) section when the function returns a value (an AST ``return
  <value>``, or a ``yield``), none when it does not;
- a ``Raises`` section naming every exception class the body raises itself (``raise X(...)``;
  a bare re-raise names nothing), each entry a real exception class (built-in, or written
  ``package.module.Name``).

A class is checked on its constructor: the class docstring documents ``__init__``'s parameters
(a dataclass's fields) and the exceptions ``__init__``/``__post_init__`` raise.
"""
from __future__ import annotations

import ast
import builtins
import doctest
import importlib
import inspect
import textwrap

import pytest
from numpydoc.docscrape import NumpyDocString

import fairlib.analysis as analysis

# (module, name): the faces issue 22 names, plus every callable in fairlib.analysis.__all__
FACES = [
    ("fairlib", "simulate"), ("fairlib", "Engine"), ("fairlib", "SimResult"), ("fairlib", "make_policy"),
    ("fairlib.backend", "run_scenario"),
    ("fairlib.records", "load_run"), ("fairlib.records", "simulate_run"), ("fairlib.records", "Run"),
    ("fairlib.scenarios", "load"),
    ("fairlib.client", "run"), ("fairlib.client", "EndpointConfig"), ("fairlib.client", "build_schedule"),
] + [("fairlib.analysis", n) for n in analysis.__all__ if callable(getattr(analysis, n))]

IDS = [f"{m}.{n}" for m, n in FACES]


def _obj(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def _parameters(func, skip_self: bool) -> list[str]:
    out = []
    for p in inspect.signature(func).parameters.values():
        if skip_self and p.name == "self" and not out:
            continue
        star = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        out.append(star + p.name)
    return out


def _function_node(func) -> ast.FunctionDef | ast.AsyncFunctionDef:
    src = textwrap.dedent(inspect.getsource(inspect.unwrap(func)))
    node = ast.parse(src).body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), func
    return node


def _own_nodes(node):
    """The nodes of ``node``'s body, not descending into nested functions, lambdas or classes."""
    stack = list(node.body)
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(n))


def _raised(node) -> set[str]:
    """Names of the exception classes ``raise`` statements in ``node`` raise (nested defs included:
    a local helper's raise is the function's)."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Raise) and n.exc is not None:
            e = n.exc.func if isinstance(n.exc, ast.Call) else n.exc
            if isinstance(e, ast.Name):
                names.add(e.id)
            elif isinstance(e, ast.Attribute):
                names.add(e.attr)
    return names


def _returns_value(node) -> bool:
    for n in _own_nodes(node):
        if isinstance(n, ast.Return) and n.value is not None and \
                not (isinstance(n.value, ast.Constant) and n.value.value is None):
            return True
        if isinstance(n, (ast.Yield, ast.YieldFrom)):
            return True
    return False


def _face(module: str, name: str):
    """(docstring, documented callable's parameters, raised names, returns a value?)."""
    obj = _obj(module, name)
    if inspect.isclass(obj):
        params = _parameters(obj, skip_self=False)          # the constructor's, as the class is called
        raised: set[str] = set()
        for meth in ("__init__", "__post_init__"):
            f = obj.__dict__.get(meth)
            if f is not None and not f.__code__.co_filename.startswith("<"):   # not a dataclass's own
                raised |= _raised(_function_node(f))
        return inspect.getdoc(obj), params, raised, False
    node = _function_node(obj)
    return inspect.getdoc(obj), _parameters(obj, skip_self=False), _raised(node), _returns_value(node)


def test_the_faces_are_found():
    """The list is what issue 22 names: the analysis names are its callables, none missing."""
    assert len(FACES) == len(set(FACES))
    names = {n for m, n in FACES if m == "fairlib.analysis"}
    assert {"jain_index", "analyze_run", "verdict", "RunAnalysis", "report", "main"} <= names
    assert not {"QS", "DEFINITIONS", "REFUSED"} & names       # constants: no signature to document


def parameter_problems(doc: str, params: list) -> list:
    """What is wrong with ``doc``'s Parameters section for a callable taking ``params``."""
    parsed = NumpyDocString(doc)
    documented = [p.name for p in parsed["Parameters"]]
    if documented != params:
        return [f"Parameters section lists {documented}, the signature has {params}"]
    out = [f"parameter {p.name} has no type" for p in parsed["Parameters"]
           if not p.type.strip() and not p.name.startswith("*")]
    return out + [f"parameter {p.name} has no description" for p in parsed["Parameters"]
                  if not " ".join(p.desc).strip()]


def returns_problems(doc: str, returns: bool, is_class: bool) -> list:
    """What is wrong with ``doc``'s Returns section for a body that does (not) return a value."""
    parsed = NumpyDocString(doc)
    has = bool(parsed["Returns"] or parsed["Yields"])
    if returns and not has:
        return ["returns a value but has no Returns section"]
    if returns and not all(r.type.strip() or r.name.strip() for r in parsed["Returns"]):
        return ["a Returns entry has no type"]
    if not returns and not is_class and has:
        return ["returns nothing but documents a Returns section"]
    return []


def raises_problems(doc: str, raised: set) -> list:
    """What is wrong with ``doc``'s Raises section for a body raising ``raised``."""
    documented = set()
    for entry in NumpyDocString(doc)["Raises"]:
        # numpydoc puts an entry's type in .type ("ValueError") or, with no description, in .name
        for word in (entry.type or entry.name).replace(",", " ").split():
            if word != "or":
                documented.add(word)
    out = []
    missing = raised - {d.rpartition(".")[2] for d in documented}
    if missing:
        out.append(f"raises {sorted(missing)} but its Raises section lists {sorted(documented)}")
    for exc in sorted(documented):
        cls = _exception_class(exc)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            out.append(f"Raises names {exc!r}, not an exception class (built-in, or package.module.Name)")
    return out


@pytest.mark.parametrize("module,name", FACES, ids=IDS)
def test_parameters_are_documented_exactly(module, name):
    doc, params, _, _ = _face(module, name)
    assert doc, f"{module}.{name} has no docstring"
    problems = parameter_problems(doc, params)
    assert not problems, f"{module}.{name}: {'; '.join(problems)}"


@pytest.mark.parametrize("module,name", FACES, ids=IDS)
def test_returns_section_matches_the_body(module, name):
    doc, _, _, returns = _face(module, name)
    problems = returns_problems(doc, returns, inspect.isclass(_obj(module, name)))
    assert not problems, f"{module}.{name}: {'; '.join(problems)}"


@pytest.mark.parametrize("module,name", FACES, ids=IDS)
def test_raises_section_names_what_the_body_raises(module, name):
    doc, _, raised, _ = _face(module, name)
    problems = raises_problems(doc, raised)
    assert not problems, f"{module}.{name}: {'; '.join(problems)}"


def _exception_class(text: str):
    """A built-in exception by name, or ``package.module.Name``."""
    if "." not in text:
        return getattr(builtins, text, None)
    mod, _, attr = text.rpartition(".")
    try:
        return getattr(importlib.import_module(mod), attr, None)
    except ImportError:
        return None


FAKE = ('def f(a, b, **kw):\n'
        '    """Doc.\n\n    Parameters\n    ----------\n    a : int\n        A.\n    """\n'
        '    if a:\n        raise ValueError("a")\n    return a\n')


def test_the_checks_can_fail():
    """A parameter added without documentation, a missing Returns, an unlisted raise and a Raises
    entry that is no exception are each caught by the checks the faces pass."""
    ns: dict = {}
    exec(compile(FAKE, "<fake>", "exec"), ns)
    f = ns["f"]
    doc, node = inspect.getdoc(f), ast.parse(FAKE).body[0]
    assert _parameters(f, skip_self=False) == ["a", "b", "**kw"]
    assert parameter_problems(doc, _parameters(f, skip_self=False)) == [
        "Parameters section lists ['a'], the signature has ['a', 'b', '**kw']"]
    assert returns_problems(doc, _returns_value(node), False) == [
        "returns a value but has no Returns section"]
    assert raises_problems(doc, _raised(node)) == ["raises ['ValueError'] but its Raises section lists []"]
    bogus = doc + "\n\nRaises\n------\nValueErr\n    Misspelt.\n"
    assert raises_problems(bogus, set()) == ["Raises names 'ValueErr', not an exception class "
                                             "(built-in, or package.module.Name)"]
    bare = ast.parse("def g():\n    try:\n        pass\n    except OSError:\n        raise\n").body[0]
    assert _raised(bare) == set() and not _returns_value(bare)
    # a real face with one more parameter than its docstring documents
    doc, params, _, _ = _face("fairlib", "make_policy")
    assert parameter_problems(doc, params) == []
    assert parameter_problems(doc, params + ["new_option"]) != []


@pytest.mark.parametrize("module,name", [f for f in FACES if "Examples" in (inspect.getdoc(_obj(*f)) or "")],
                         ids=lambda f: f if isinstance(f, str) else None)
def test_examples_run(module, name):
    """The Examples sections are doctests: what they print is what the code gives."""
    obj = _obj(module, name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder(recurse=False).find(obj, name, globs={}):
        runner.run(test)
    assert runner.tries > 0 and runner.failures == 0, \
        f"{module}.{name}: {runner.failures} of {runner.tries} example(s) failed (printed above)"
