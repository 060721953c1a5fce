"""Read one bundle YAML file the way the Databricks CLI does, with problems returned as findings.

The CLI reads YAML 1.2: only `true`/`false` are booleans (`yes`, `on` stay strings) and dates stay strings.
PyYAML's safe loader speaks YAML 1.1, so this loader narrows its implicit types to match. A key repeated in one
mapping is an error for the CLI (the YAML library refuses it); PyYAML would silently keep the last one.
"""

from __future__ import annotations

import re
from pathlib import Path as FilePath
from typing import Any, Iterator

import yaml

from ..findings import Finding
from .paths import Path, format_path

MERGE_TAG = "tag:yaml.org,2002:merge"
BOOL_TAG = "tag:yaml.org,2002:bool"
TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


class BundleYamlLoader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 booleans and no timestamps."""


BundleYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (BOOL_TAG, TIMESTAMP_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
BundleYamlLoader.add_implicit_resolver(BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def load_yaml(file: FilePath, relative_name: str) -> tuple[Any, list[Finding]]:
    """The file's data (None when it cannot be read) and the findings met while reading it."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        return None, [Finding("unreadable-file", f"cannot read {relative_name}: {error}",
                              "make the file readable UTF-8 text", file=relative_name)]
    try:
        loader = BundleYamlLoader(text)
    except yaml.YAMLError as error:  # the reader refuses control characters before any parsing
        return None, [_syntax_finding(error, relative_name)]
    try:
        node = loader.get_single_node()
        duplicates = list(_duplicate_keys(node, (), set()))
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as error:
        return None, [_syntax_finding(error, relative_name)]
    finally:
        loader.dispose()
    findings = [_duplicate_finding(path, key, line, first_line, relative_name)
                for path, key, line, first_line in duplicates]
    if data is not None and not isinstance(data, dict):
        findings.append(Finding("not-a-mapping", f"{relative_name} holds a {type(data).__name__}, not a mapping",
                                "a bundle file is a YAML mapping of top-level keys (bundle, resources, targets...)",
                                file=relative_name))
        data = None
    return data, findings


def _syntax_finding(error: yaml.YAMLError, relative_name: str) -> Finding:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    detail = f"{context}: {problem}" if context else problem
    return Finding("yaml-syntax", f"YAML syntax error{where}: {detail}",
                   "fix the YAML there (indentation, a missing colon or quote, a tab instead of spaces)",
                   file=relative_name)


def _duplicate_keys(node: yaml.Node | None, path: Path, seen_nodes: set[int]) -> Iterator[tuple[Path, str, int, int]]:
    """(path of the mapping, key, line, line of the first occurrence) for every key repeated in a mapping."""
    if node is None or id(node) in seen_nodes:  # an alias revisits a node already walked
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in first_lines:
                yield path, key, line, first_lines[key]
            else:
                first_lines[key] = line
            yield from _duplicate_keys(value_node, (*path, key), seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicate_keys(item, (*path, index), seen_nodes)


def _duplicate_finding(path: Path, key: str, line: int, first_line: int, relative_name: str) -> Finding:
    full_path = format_path((*path, key))
    if len(path) == 2 and path[0] == "resources":
        return Finding("duplicate-resource-key",
                       f"{path[1]} {key!r} is defined twice in this file (lines {first_line} and {line})",
                       "give each resource its own key: the CLI refuses a bundle that repeats one",
                       file=relative_name, path=full_path)
    return Finding("duplicate-key", f"key {key!r} is repeated in the same mapping (lines {first_line} and {line})",
                   "keep one of them: the CLI refuses a mapping that repeats a key", file=relative_name,
                   path=full_path)
