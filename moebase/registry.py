"""Registries of pluggable parts chosen by name in a run config (policies, predictors).

A part registers itself with ``@POLICIES.register("name")`` in its own module, and its package imports every
module it holds (``import_submodules``): adding a part is adding one module, nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> class, with a helpful error for unknown names."""

    def __init__(self, kind: str, folder: str | None = None):
        self.kind = kind
        plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
        self.folder = folder or f"sim/{plural}/"  # where the parts are, for an error that does not list them all
        self._items: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """A class decorator registering the part as ``name``. A part with params must declare what each accepts
        (``declaration_problems`` empty, see :class:`sim.config.params.Parametrised`): a TypeError otherwise, when its
        module is imported, so that no part can take a param the config loader does not check."""

        def deco(cls: type[T]) -> type[T]:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            problems: list[str] = getattr(cls, "declaration_problems", lambda: [])()
            if problems:
                raise TypeError(f"{self.kind} {name!r} ({cls.__name__}): {problems[0]}")
            cls.name = name  # type: ignore[attr-defined]  # every registered class gets its name
            self._items[name] = cls
            return cls

        return deco

    def get(self, name: str) -> type[T]:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            from moebase.checks import known_text
            from moebase.errors import brief

            raise KeyError(
                f"unknown {self.kind} {brief(name)} ({known_text(name, self.names(), self.folder)})"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items


def import_submodules(package_name: str, package_path) -> None:
    """Import every module of a package (so that the parts in them register themselves)."""
    for info in sorted(pkgutil.iter_modules(package_path), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package_name}.{info.name}")
