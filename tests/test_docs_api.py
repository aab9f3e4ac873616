"""Every public name of the modules in ``docs/api_modules.txt`` has a docstring.

The API reference is generated from those docstrings (``docs/apigen.py``), so a public
class, function or method without one would be an empty entry. Data (constants) is exempt:
Python gives it no docstring of its own.
"""

from __future__ import annotations

import inspect
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "docs"))
import apigen  # noqa: E402


def _undocumented(module) -> list[str]:
    missing = []
    for name in apigen.public_names(module):
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or callable(obj)):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(f"{module.__name__}.{name}")
        if not inspect.isclass(obj) or not obj.__module__.startswith("dasktune"):
            continue
        for attr, member in vars(obj).items():  # the class's own public methods
            if attr.startswith("_"):
                continue
            func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            if isinstance(func, property):
                func = func.fget
            if not inspect.isfunction(func) or (func.__doc__ or "").strip():
                continue
            # An override documented by its base class inherits that docstring.
            if inspect.getdoc(getattr(obj, attr)):
                continue
            missing.append(f"{module.__name__}.{name}.{attr}")
    return missing


def test_the_module_list_names_existing_core_modules():
    listed = apigen.listed_modules()
    assert listed[0] == "dasktune"
    names = {module.__name__ for module in apigen.public_modules()}
    assert {"dasktune", "dasktune.search", "dasktune.schedulers"} <= names


@pytest.mark.parametrize("name", [m for m in apigen.listed_modules() if apigen.available(m)])
def test_public_names_have_docstrings(name):
    module = __import__(name, fromlist=["_"])
    assert (module.__doc__ or "").strip(), f"{name} has no module docstring"
    assert _undocumented(module) == []
