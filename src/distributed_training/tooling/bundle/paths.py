"""Paths inside a bundle tree, written the way the CLI prints them: `resources.jobs.train.tasks[0].new_cluster`.

A path is a tuple of mapping keys (str) and list indexes (int). Keys that contain `.`, `[` or `]` (Spark conf keys
such as `spark.master`) are written quoted, `spark_conf["spark.master"]`, so that a written path reads back the same.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

Path = tuple[str | int, ...]

_NEEDS_QUOTES = re.compile(r"[.\[\]\"]")
_TOKEN = re.compile(r'\.?([^.\[\]"]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def format_path(path: Path) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _NEEDS_QUOTES.search(part):
            text += f"[{json.dumps(part, ensure_ascii=False)}]"
        else:
            text += f".{part}" if text else part
    return text


def parse_path(text: str) -> Path:
    """The inverse of `format_path` (a plain dotted path reads as its keys)."""
    parts: list[str | int] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise ValueError(f"not a bundle path: {text!r} (at character {position})")
        key, index, quoted = match.groups()
        parts.append(key if key is not None else int(index) if index is not None else json.loads(quoted))
        position = match.end()
    return tuple(parts)


def get_at(tree: Any, path: Path, default: Any = None) -> Any:
    node = tree
    for part in path:
        if isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return default
    return node


def walk_strings(tree: Any, path: Path = (), containing: str = "") -> Iterator[tuple[Path, str]]:
    """Every string value of a tree that holds `containing` (default: every one) with its path (mapping keys are not
    values and are skipped)."""
    if isinstance(tree, str):
        if containing in tree:
            yield path, tree
        return
    if isinstance(tree, dict):
        children: Iterator[tuple[str | int, Any]] = ((str(key), value) for key, value in tree.items())
    elif isinstance(tree, list):
        children = enumerate(tree)
    else:
        return
    for part, value in children:  # a leaf is handled here: a generator per value costs more than the walk
        if isinstance(value, str):
            if containing in value:
                yield (*path, part), value
        elif isinstance(value, (dict, list)):
            yield from walk_strings(value, (*path, part), containing)
