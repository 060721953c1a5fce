"""Bundle trees that remember which file every value came from.

A bundle is spread over databricks.yml and its included files, and a target can override any part of it from
yet another file. Findings carry paths in the merged tree (`resources.jobs.train.tasks[0].job_cluster_key`); to
name the file a user must edit, every mapping and list records the file of each of its entries, and merging
(see `merging`) keeps those records. Plain dict/list subclasses, so any consumer (jsonschema, the typed
classes, the guards) reads them as ordinary trees.
"""

from __future__ import annotations

from typing import Any

from .paths import Path


class SourcedDict(dict):
    """A mapping with `sources[key]`: the file (relative to the bundle root) the entry's value came from."""

    def __init__(self, items: Any = (), sources: dict[str, str] | None = None):
        super().__init__(items)
        self.sources: dict[str, str] = dict(sources or {})

    def put(self, key: str, value: Any, source: str | None) -> None:
        self[key] = value
        if source is not None:
            self.sources[key] = source


class SourcedList(list):
    """A list with `sources[index]`: the file each item came from."""

    def __init__(self, items: Any = (), sources: list[str | None] | None = None):
        super().__init__(items)
        self.sources: list[str | None] = list(sources) if sources is not None else [None] * len(self)


def attach_source(data: Any, file: str) -> Any:
    """The same tree with every mapping and list recording `file` as the source of its entries."""
    if isinstance(data, dict):
        return SourcedDict({key: attach_source(value, file) for key, value in data.items()},
                           {key: file for key in data})
    if isinstance(data, list):
        return SourcedList([attach_source(item, file) for item in data], [file] * len(data))
    return data


def source_of(tree: Any, key: str | int) -> str | None:
    sources = getattr(tree, "sources", None)
    if isinstance(sources, dict) and isinstance(key, str):
        return sources.get(key)
    if isinstance(sources, list) and isinstance(key, int) and 0 <= key < len(sources):
        return sources[key]
    return None


def file_at(tree: Any, path: Path) -> str | None:
    """The file that defined the deepest part of `path` present in `tree` (None: nothing of it is there)."""
    node, found = tree, None
    for part in path:  # `source_of` inlined: every finding and every local path asks
        sources = getattr(node, "sources", None)
        if isinstance(node, dict) and isinstance(part, str):
            found = (sources.get(part) if sources is not None else None) or found
            if part not in node:
                break
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            found = (sources[part] if sources is not None and part < len(sources) else None) or found
        else:
            break
        node = node[part]
    return found
