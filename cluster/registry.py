"""A name -> entry registry for the extension points whose entries are plain values (teacher
and judge backends): registered at import time by the module that defines them, the shipped
ones by a module imported on the first lookup."""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

Entry = TypeVar("Entry")


class Registry(Generic[Entry]):
    def __init__(self, key: str, kind: str, builtin_module: str) -> None:
        """`key`: the config key that names an entry (for errors); `kind`: what an entry is;
        `builtin_module`: registers the shipped entries when imported."""
        self.key, self.kind, self.builtin_module = key, kind, builtin_module
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, entry: Entry) -> None:
        """Make `<key>: <name>` mean `entry`; registering the same entry again is a no-op."""
        if name in self._entries and self._entries[name] != entry:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def known(self) -> list[str]:
        importlib.import_module(self.builtin_module)
        return sorted(self._entries)

    def __getitem__(self, name: str) -> Entry:
        """The registered entry; ValueError naming the known ones when there is none."""
        importlib.import_module(self.builtin_module)
        if name not in self._entries:
            raise ValueError(f"{self.key}: unknown {self.kind} {name!r}; known: {self.known()}")
        return self._entries[name]
