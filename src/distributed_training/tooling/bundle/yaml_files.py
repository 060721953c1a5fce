"""Read one bundle YAML file the way the Databricks CLI does, with problems returned as findings.

The CLI reads YAML 1.2: only `true`/`false` are booleans (`yes`, `on` stay strings) and dates stay strings.
PyYAML's safe loader speaks YAML 1.1, so this loader narrows its implicit types to match. A key repeated in one
mapping keeps its later value, as in the CLI (libs/dyn/yamlloader/loader.go, loadMapping: the node tree holds both, the
later one is set last): a warning, since it is mostly a mistake. A second merge key (`<<`) in one mapping is an error
there ("duplicate YAML merge key"), which PyYAML would accept.

Hostile input is refused before it is built into a tree, by limits the CLI lacks (its loader,
libs/dyn/yamlloader/loader.go, expands every alias and only refuses an alias inside its own anchor):
- only a regular file is opened (a FIFO would block the read forever; a folder or a broken link cannot be read);
- `MAX_FILE_BYTES` per file;
- `MAX_DEPTH` levels of nesting (the composer recurses once per level: deeper input ends in RecursionError);
- `MAX_VALUES` values once aliases are expanded, counted over the whole bundle (`ValueBudget`): an alias bomb
  (billion laughs) is a few hundred bytes that expand to billions of values;
- an alias inside its own anchor (a recursive structure) is an error, as in the CLI.
These are measured on the parser's event stream (libyaml's when PyYAML has it, iterative either way) before any
node is composed, so refusing costs one pass over the text and no memory.
"""

from __future__ import annotations

import gc
import os
import re
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import yaml

from ...findings import Finding
from .paths import Path, format_path

MERGE_TAG = "tag:yaml.org,2002:merge"
MERGE_KEY = "<<"
STR_TAG, MAP_TAG, SEQ_TAG = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
# Where an anchor (&name) or an alias (*name) may start: at a line's start or after a space or a flow indicator. A
# `*` inside a word (a glob: ../dist/*.whl) is neither. Text that may hold one is measured on its events (`_measure`).
ANCHOR_OR_ALIAS = re.compile(r"(?:^|[\s\[\]{},:\ufeff])[&*]", re.MULTILINE)
# Scalars `_built` constructs itself (with PyYAML's own constructors, but for strings, which are their text).
PLAIN_SCALAR_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("int", "float", "bool", "null"))
BOOL_TAG = "tag:yaml.org,2002:bool"
TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 128  # a bundle nests about 12 levels (resources.jobs.<key>.tasks[0].new_cluster.spark_conf...)
MAX_VALUES = 5_000_000  # a 50,000-job bundle is about 750,000 values
# Anchor containers are recorded down to this many keys (the CLI's unknown-field rule spares them).
ANCHOR_PATH_DEPTH = 3

TOO_DEEP_FIX = "a bundle nests about a dozen levels: flatten the structure (or fix what generated the file)"

_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML was built with it


class BundleYamlLoader(_SafeLoader):
    """Safe loader with YAML 1.2 booleans and no timestamps."""


BundleYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (BOOL_TAG, TIMESTAMP_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
BundleYamlLoader.add_implicit_resolver(BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


@dataclass
class ValueBudget:
    """Values (after alias expansion) the files of one bundle may still hold together."""

    left: int = MAX_VALUES
    limit: int = MAX_VALUES


@dataclass
class YamlFile:
    data: Any  # None when the file could not be read or parsed
    findings: list[Finding] = field(default_factory=list)
    # Paths (up to ANCHOR_PATH_DEPTH keys) whose value is an anchor, or a collection made only of anchors.
    anchor_paths: set[Path] = field(default_factory=set)


class _LimitExceeded(Exception):
    def __init__(self, finding: Finding):
        super().__init__(finding.message)
        self.finding = finding


@contextmanager
def gc_paused() -> Iterator[None]:
    """Building a large tree allocates millions of objects and no cycles: the cyclic collector would rescan the
    growing heap again and again (several times the cost of the parse itself)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_yaml(file: str | os.PathLike, relative_name: str, budget: ValueBudget | None = None) -> YamlFile:
    """The file's data and the findings met while reading it."""
    budget = budget if budget is not None else ValueBudget()
    text = _read_text(file, relative_name)
    if isinstance(text, Finding):
        return YamlFile(None, [text])
    try:
        with gc_paused():
            # No value stands for more than itself (most files have neither character: `in` is much quicker)
            plain = ("&" not in text and "*" not in text) or not ANCHOR_OR_ALIAS.search(text)
            anchor_paths = set() if plain else _measure(text, relative_name, budget)
            loader = BundleYamlLoader(text)
            try:
                node = loader.get_single_node()
                try:
                    if not plain:
                        raise _NotPlain
                    data, duplicates = _built(node, relative_name, budget, loader)
                except _NotPlain:
                    if plain:
                        _measure_nodes(node, relative_name, budget)
                    duplicates = list(_duplicate_keys(node, (), set()))
                    data = loader.construct_document(node) if node is not None else None
            finally:
                loader.dispose()
    except _LimitExceeded as limit:
        return YamlFile(None, [limit.finding])
    except yaml.YAMLError as error:
        if "maximum nesting depth" in str(error):  # libyaml's own limit, met while scanning ahead
            return YamlFile(None, [_too_deep(relative_name, error.problem_mark)])
        return YamlFile(None, [_syntax_finding(error, relative_name, text)])
    findings = [_duplicate_finding(path, key, line, first_line, relative_name)
                for path, key, line, first_line in duplicates]
    if data is not None and not isinstance(data, dict):
        findings.append(Finding("not-a-mapping", f"{relative_name} holds a {type(data).__name__}, not a mapping",
                                "a bundle file is a YAML mapping of top-level keys (bundle, resources, targets...)",
                                file=relative_name))
        data = None
    return YamlFile(data, findings, anchor_paths)


def _read_text(file: str | os.PathLike, relative_name: str) -> str | Finding:
    """The file's text, or why it cannot be read. Only a regular file is opened: opening a FIFO blocks until
    something writes to it, and a folder or a broken link has no text."""
    def unreadable(why: str, fix: str) -> Finding:
        return Finding("unreadable-file", f"cannot read {relative_name}: {why}", fix, file=relative_name)

    try:
        info = os.stat(file)
    except FileNotFoundError:
        if os.path.islink(file):
            return unreadable(f"it is a broken symbolic link (to {os.readlink(file)})",
                              "point the link at a YAML file, or remove it")
        return unreadable("it does not exist", "create it, or fix the name that points at it")
    except OSError as error:
        return unreadable(str(error), "make the file readable")
    if not stat.S_ISREG(info.st_mode):
        kind, noun = special_file_kind(info.st_mode)
        return unreadable(f"it is {kind}, not a regular file",
                          f"include only YAML or JSON files: narrow the include glob, or move the {noun} away")
    if info.st_size > MAX_FILE_BYTES:
        return _too_large(relative_name, info.st_size)
    try:
        descriptor = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # replaced since the stat above
                return unreadable("it is no longer a regular file", "include only YAML or JSON files")
            content = _read_all(descriptor, info.st_size)
        finally:
            os.close(descriptor)
    except OSError as error:
        return unreadable(str(error), "make the file readable")
    if len(content) > MAX_FILE_BYTES:
        return _too_large(relative_name, len(content))
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as error:
        return unreadable(f"it is not UTF-8 text ({error})", "make the file readable UTF-8 text")


def _read_all(descriptor: int, size: int) -> bytes:
    """The file's bytes: its size and a byte more (a read sized to the limit would allocate the limit's 64 MiB, once
    per file), and if that byte came (it grew since the stat) up to the limit and a byte more. Plain reads on the
    descriptor: a buffered file object costs more than the read itself on a bundle of many small files."""
    chunks, total, wanted = [], 0, size + 1
    while total < wanted:
        chunk = os.read(descriptor, wanted - total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total == size + 1:
            wanted = MAX_FILE_BYTES + 1
    return b"".join(chunks)


def special_file_kind(mode: int) -> tuple[str, str]:
    """(what it is, what to call it) for a file that is not a regular one."""
    for test, kind, noun in ((stat.S_ISDIR, "a folder", "folder"), (stat.S_ISFIFO, "a named pipe (FIFO)", "pipe"),
                             (stat.S_ISSOCK, "a socket", "socket"), (stat.S_ISCHR, "a character device", "device"),
                             (stat.S_ISBLK, "a block device", "device")):
        if test(mode):
            return kind, noun
    return "a special file", "file"


def _too_large(relative_name: str, size: int) -> Finding:
    return Finding("yaml-too-large", f"{relative_name} is {size:,} bytes, over the limit of {MAX_FILE_BYTES:,} "
                   "bytes for one bundle file", "split it into several files named by include "
                   "(resources/*.yml), or check that the include glob names the files you meant", file=relative_name)


class _Frame:
    """An open collection while measuring: its path, and what is known of its children so far."""

    __slots__ = ("is_mapping", "path", "anchor", "start", "expect_key", "key", "children", "anchors_only")

    def __init__(self, is_mapping: bool, path: Path | None, anchor: str | None, start: int):
        self.is_mapping, self.path, self.anchor, self.start = is_mapping, path, anchor, start
        self.expect_key, self.key, self.children, self.anchors_only = True, None, 0, True


def _measure(text: str, relative_name: str, budget: ValueBudget) -> set[Path]:
    """Check the limits on the event stream and take this file's values from `budget`; the paths of anchor
    containers (see `YamlFile.anchor_paths`). Raises `_LimitExceeded`, or `yaml.YAMLError` for a syntax error."""
    parser = _SafeLoader(text)
    stack: list[_Frame] = []
    anchor_sizes: dict[str, int] = {}  # anchor -> values it stands for, aliases inside it expanded
    anchor_paths: set[Path] = set()
    values = aliases = 0
    try:
        while parser.check_event():
            event = parser.get_event()
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) >= MAX_DEPTH:
                    raise _LimitExceeded(_too_deep(relative_name, event))
                values += 1
                stack.append(_Frame(isinstance(event, yaml.MappingStartEvent), _child_path(stack), event.anchor,
                                    values - 1))
                continue
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                frame = stack.pop()
                if frame.anchor is not None:
                    anchor_sizes[frame.anchor] = values - frame.start
                _completed(stack, frame.path, frame.anchor is not None or (frame.children > 0 and frame.anchors_only),
                           None, anchor_paths)
                continue
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
                if any(frame.anchor == event.anchor for frame in stack):
                    raise _LimitExceeded(_limit_finding(
                        "yaml-recursive-alias", relative_name, event, f"uses alias *{event.anchor} inside the anchor "
                        f"&{event.anchor} it names (a structure that contains itself)",
                        f"move *{event.anchor} out of the value anchored as &{event.anchor}"))
                values += anchor_sizes.get(event.anchor, 1)  # an undefined alias: the composer reports it
                _completed(stack, _child_path(stack), True, None, anchor_paths)
            elif isinstance(event, yaml.ScalarEvent):
                values += 1
                if event.anchor is not None:
                    anchor_sizes[event.anchor] = 1
                _completed(stack, _child_path(stack), event.anchor is not None, event.value, anchor_paths)
            else:
                continue
            if values > budget.left:
                raise _LimitExceeded(_too_many_values(relative_name, event, budget, aliases))
    finally:
        parser.dispose()
    budget.left -= values
    return anchor_paths


def _measure_nodes(node: yaml.Node | None, relative_name: str, budget: ValueBudget) -> None:
    """`_measure` for a text without anchors and aliases, on its nodes as libyaml composed them (in C, with its own
    nesting limit): the same limits and the same count, in the same order, without parsing the text a second time."""
    values, stack = 0, [(node, 0)] if node is not None else []
    while stack:
        node, depth = stack.pop()
        values += 1
        if values > budget.left:
            raise _LimitExceeded(_too_many_values(relative_name, node.start_mark, budget, aliases=0))
        if isinstance(node, yaml.ScalarNode):
            continue
        if depth >= MAX_DEPTH:
            raise _LimitExceeded(_too_deep(relative_name, node.start_mark))
        children = [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else node.value
        stack.extend((child, depth + 1) for child in reversed(children))  # popped in the document's order
    budget.left -= values


class _NotPlain(Exception):
    """A document `_built` leaves to PyYAML's constructor: a merge key, a tag of its own, a key that is a collection."""


def _built(node: yaml.Node | None, relative_name: str, budget: ValueBudget,
           loader: BundleYamlLoader) -> tuple[Any, list[tuple[Path, str, int, int]]]:
    """(the data, the repeated keys) of a document without anchors and aliases, in one walk over its nodes that
    does what `_measure_nodes`, `_duplicate_keys` and PyYAML's `construct_document` do one after the other (a third
    of the time of loading a large bundle). Raises `_NotPlain` for a document it leaves to them."""
    builder = _Builder(relative_name, budget, loader)
    data = builder.build(node, 0, ()) if node is not None else None
    budget.left -= builder.values
    return data, builder.duplicates


class _Builder:
    """The state of one `_built` walk. (A class, not a closure: a nested function that calls itself is a reference
    cycle, which would keep every file's parser alive while `gc_paused` holds the collector off.)"""

    __slots__ = ("relative_name", "budget", "loader", "constructors", "values", "duplicates")

    def __init__(self, relative_name: str, budget: ValueBudget, loader: BundleYamlLoader):
        self.relative_name, self.budget, self.loader = relative_name, budget, loader
        self.constructors = loader.yaml_constructors
        self.values, self.duplicates = 0, []

    def build(self, node: yaml.Node, depth: int, path: Path) -> Any:
        self.values += 1
        if self.values > self.budget.left:
            raise _LimitExceeded(_too_many_values(self.relative_name, node.start_mark, self.budget, aliases=0))
        tag = node.tag
        if isinstance(node, yaml.ScalarNode):
            if tag == STR_TAG:
                return node.value
            if tag in PLAIN_SCALAR_TAGS:
                return self.constructors[tag](self.loader, node)
            raise _NotPlain
        if depth >= MAX_DEPTH:
            raise _LimitExceeded(_too_deep(self.relative_name, node.start_mark))
        if isinstance(node, yaml.SequenceNode) and tag == SEQ_TAG:
            return [self.build(item, depth + 1, (*path, index)) for index, item in enumerate(node.value)]
        if not isinstance(node, yaml.MappingNode) or tag != MAP_TAG:
            raise _NotPlain
        mapping, first_lines = {}, {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == MERGE_TAG:
                raise _NotPlain
            name, line = key_node.value, key_node.start_mark.line + 1
            if name in first_lines:
                self.duplicates.append((path, name, line, first_lines[name]))
            else:
                first_lines[name] = line
            key = self.build(key_node, depth + 1, path)
            mapping[key] = self.build(value_node, depth + 1, (*path, name))
        return mapping


def _too_deep(relative_name: str, where: yaml.Event | Any) -> Finding:
    return _limit_finding("yaml-too-deep", relative_name, where, f"nests deeper than {MAX_DEPTH} levels", TOO_DEEP_FIX)


def _too_many_values(relative_name: str, where: yaml.Event | Any, budget: ValueBudget, aliases: int) -> Finding:
    why = f" (its {aliases:,} aliases expanded)" if aliases else ""
    return _limit_finding("yaml-too-many-values", relative_name, where,
                          f"holds more values{why} than the limit of {budget.limit:,} for a bundle's files together",
                          "use aliases for small shared parts only (an alias of an alias multiplies), or split the "
                          "bundle: no real bundle comes near this")


def _child_path(stack: list[_Frame]) -> Path | None:
    """The path of the value about to start (None below ANCHOR_PATH_DEPTH keys, in sequences, or for a key)."""
    if not stack:
        return ()
    parent = stack[-1]
    if not parent.is_mapping or parent.expect_key or parent.path is None or len(parent.path) >= ANCHOR_PATH_DEPTH:
        return None
    return (*parent.path, parent.key) if isinstance(parent.key, str) else None


def _completed(stack: list[_Frame], path: Path | None, is_anchor_container: bool, scalar: str | None,
               anchor_paths: set[Path]) -> None:
    """Record a finished node in its parent: a mapping's key, or a value that may be an anchor container."""
    if not stack:
        return
    parent = stack[-1]
    if parent.is_mapping and parent.expect_key:
        parent.key, parent.expect_key = scalar, False
        return
    parent.children += 1
    parent.anchors_only = parent.anchors_only and is_anchor_container
    if is_anchor_container and path is not None:
        anchor_paths.add(path)
    if parent.is_mapping:
        parent.expect_key = True


def _limit_finding(rule: str, relative_name: str, event: yaml.Event | Any, what: str, fix: str) -> Finding:
    mark = event.start_mark if isinstance(event, yaml.Event) else event
    where = f" (at line {mark.line + 1})" if mark is not None else ""
    return Finding(rule, f"{relative_name} {what}{where}: not read further", fix, file=relative_name)


def _syntax_finding(error: yaml.YAMLError, relative_name: str, text: str) -> Finding:
    """One line: where, and what the YAML library says."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if isinstance(error, yaml.reader.ReaderError):  # a character refused before parsing: no mark, a position
        line = text.count("\n", 0, error.position) + 1
        character = error.character if isinstance(error.character, int) else ord(error.character or "\0")
        where, detail = f" at line {line}", f"character #x{character:04x}: {error.reason}"
    else:
        problem = getattr(error, "problem", None) or str(error)
        context = getattr(error, "context", None)
        detail = f"{context}: {problem}" if context else problem
    detail = " ".join(str(detail).split())
    return Finding("yaml-syntax", f"YAML syntax error{where}: {detail}",
                   "fix the YAML there (indentation, a missing colon or quote, a tab instead of spaces)",
                   file=relative_name)


def _duplicate_keys(node: yaml.Node | None, path: Path, seen_nodes: set[int]) -> Iterator[tuple[Path, str, int, int]]:
    """(path of the mapping, key, line, line of the first occurrence) for every key repeated in a mapping, a second
    merge key (`<<`) among them."""
    if node is None or id(node) in seen_nodes:  # an alias revisits a node already walked
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = MERGE_KEY if key_node.tag == MERGE_TAG else key_node.value
            line = key_node.start_mark.line + 1
            if key in first_lines:
                yield path, key, line, first_lines[key]
            else:
                first_lines[key] = line
            if key != MERGE_KEY:
                yield from _duplicate_keys(value_node, (*path, key), seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicate_keys(item, (*path, index), seen_nodes)


def _duplicate_finding(path: Path, key: str, line: int, first_line: int, relative_name: str) -> Finding:
    full_path = format_path((*path, key))
    lines = f"lines {first_line} and {line}"
    if key == MERGE_KEY:
        where = format_path(path) or "the top level"
        return Finding("duplicate-merge-key", f"the mapping at {where} has two merge keys (<<, {lines}): the CLI "
                       "refuses it (\"duplicate YAML merge key\")",
                       "merge several mappings with one key and a list: <<: [*first, *second]", file=relative_name,
                       path=format_path(path) or None)
    if len(path) == 2 and path[0] == "resources":
        return Finding("duplicate-key", f"{path[1]} {key!r} is defined twice in this file ({lines}): the CLI "
                       "keeps the later one and drops the first", "give each resource its own key, or remove the one "
                       "you do not mean", file=relative_name, path=full_path, severity="warning")
    return Finding("duplicate-key", f"key {key!r} is repeated in the same mapping ({lines}): the CLI keeps the later "
                   "value", "keep one of them", file=relative_name, path=full_path, severity="warning")
