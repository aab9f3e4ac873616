"""Writes the API reference pages from ``docs/api_modules.txt``: the one list of public modules.

Each module gets ``api/<module>.rst`` with its docstring and one autodoc entry per public name
(``__all__``, or else the public classes and functions defined in it). An object re-exported
by several modules is documented once, where the list names it first (``dasktune.Tuner``
before ``dasktune.tuner``), and linked from the others. A listed module that does not exist
yet (a branch not merged) is left out with a note; one that exists but fails to import fails
the build. ``tests/test_docs_api.py`` uses :func:`public_modules` and :func:`public_names`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pathlib
import sys
from types import ModuleType

LIST = pathlib.Path(__file__).resolve().parent / "api_modules.txt"


def listed_modules() -> list[str]:
    """The module names in ``api_modules.txt``, in order (comments and blanks dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in LIST.read_text().splitlines())
    return [line for line in lines if line]


def exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def needs_missing_library(exc: ImportError) -> bool:
    """Whether ``exc`` comes from an optional third-party library that is not installed
    (an integration's ``ImportError`` naming its pip extra), not from dasktune itself."""
    while exc is not None:
        name = getattr(exc, "name", None)
        if isinstance(exc, ModuleNotFoundError) and name and not name.startswith("dasktune"):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def available(name: str) -> bool:
    """Whether the listed module ``name`` exists and its optional libraries are installed;
    any other import error propagates."""
    if not exists(name):
        return False
    try:
        importlib.import_module(name)
    except ImportError as exc:
        if needs_missing_library(exc):
            return False
        raise
    return True


def public_modules() -> list[ModuleType]:
    """The listed modules available here (:func:`available`), imported."""
    return [importlib.import_module(name) for name in listed_modules() if available(name)]


def public_names(module: ModuleType) -> list[str]:
    """``module.__all__``, or the public classes and functions the module itself defines."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [name for name, obj in vars(module).items()
            if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
            and getattr(obj, "__module__", None) == module.__name__]


def _entry(module: str, name: str, obj: object, first: dict[int, str]) -> str:
    target = f"{module}.{name}"
    if not isinstance(obj, (int, float, str, bool, type(None))):
        seen = first.setdefault(id(obj), target)
        if seen != target:
            role = "class" if inspect.isclass(obj) else "func" if callable(obj) else "data"
            return f".. py:currentmodule:: {module}\n\n``{name}``: the same as :py:{role}:`{seen}`.\n"
    if inspect.isclass(obj):
        return f".. autoclass:: {target}\n   :members:\n   :show-inheritance:\n"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or callable(obj):
        return f".. autofunction:: {target}\n"
    return f".. autodata:: {target}\n   :no-value:\n"


def write_api_pages(docs: pathlib.Path) -> None:
    """Write ``docs/api/index.rst`` and one page per existing listed module."""
    out = docs / "api"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.rst"):
        old.unlink()
    first: dict[int, str] = {}
    pages = []
    for name in listed_modules():
        if not available(name):
            print(f"apigen: {name} is listed but not importable here (missing, or its "
                  f"optional library is not installed); left out", file=sys.stderr)
            continue
        module = importlib.import_module(name)
        entries = [_entry(name, attr, getattr(module, attr), first)
                   for attr in public_names(module)]
        title = f"``{name}``"
        body = [title, "=" * len(title), "", f".. automodule:: {name}", "", *entries]
        (out / f"{name}.rst").write_text("\n".join(body) + "\n")
        pages.append(name)
    index = ["API reference", "=============", "",
             "Generated from the docstrings of the modules listed in ``docs/api_modules.txt``.",
             "The ``dasktune`` command is documented in :doc:`../cli`.", "",
             ".. toctree::", "   :maxdepth: 1", "", *(f"   {page}" for page in pages)]
    (out / "index.rst").write_text("\n".join(index) + "\n")
