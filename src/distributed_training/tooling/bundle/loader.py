"""Load a bundle: databricks.yml, the files its `include:` globs name, merged into one tree; and its targets.

What goes wrong while loading (a YAML error, an include that matches nothing, a resource key defined twice) is
recorded as a finding on the `Bundle`, never raised: the rest of the bundle is still worth checking. Only a
folder that is not a bundle at all raises `NotABundle`.
"""

from __future__ import annotations

import difflib
import functools
import glob
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any

from ...findings import Finding
from .config_fields import ROOT_FIELDS, TARGET_FIELDS
from .merging import apply_target, merge_into, merge_keyed_lists
from .paths import format_path
from .sourced_trees import SourcedDict, attach_source
from .yaml_files import ValueBudget, YamlFile, gc_paused, load_yaml

ROOT_FILE_NAMES = ("databricks.yml", "databricks.yaml", "bundle.yml", "bundle.yaml")  # bundle/config/filename.go
INCLUDE_EXTENSIONS = (".yml", ".yaml", ".json")
# The name the CLI gives the only target of a bundle that declares none.
IMPLICIT_TARGET = "default"


class NotABundle(ValueError):
    """The folder has no bundle configuration file."""


@dataclass
class BundleFile:
    name: str  # relative to the bundle root, with forward slashes
    data: dict | None  # None when the file could not be read or parsed


@dataclass
class Bundle:
    root: FilePath
    files: list[BundleFile]
    tree: SourcedDict  # every file merged, `targets` still inside
    findings: list[Finding] = field(default_factory=list)

    @property
    def root_file(self) -> BundleFile:
        return self.files[0]

    @property
    def target_names(self) -> list[str]:
        targets = self.tree.get("targets")
        return [str(name) for name in targets] if isinstance(targets, dict) and targets else []

    def target_tree(self, name: str, merge_lists: bool = True) -> SourcedDict:
        """The tree the CLI deploys for target `name` (`IMPLICIT_TARGET` for a bundle without targets);
        `merge_lists=False`: its keyed lists left unmerged (see `merging.merge_keyed_lists`)."""
        if name == IMPLICIT_TARGET and not self.target_names:
            tree = SourcedDict({key: value for key, value in self.tree.items() if key != "targets"},
                               self.tree.sources)
            if merge_lists:
                merge_keyed_lists(tree)
            return tree
        return apply_target(self.tree, name, merge_lists)


def find_root_file(bundle_dir: FilePath) -> FilePath:
    for name in ROOT_FILE_NAMES:
        if (bundle_dir / name).is_file():
            return bundle_dir / name
    raise NotABundle(f"{bundle_dir} has no databricks.yml: it is not a bundle folder "
                     "(pass the folder that holds databricks.yml)")


def load_bundle(bundle_dir: str | FilePath) -> Bundle:
    root = FilePath(bundle_dir).resolve()
    root_path = find_root_file(root)
    budget = ValueBudget()
    root_file = load_yaml(root_path, root_path.name, budget)
    findings = _several_root_files(root) + root_file.findings
    findings += _unknown_keys(root_path.name, root_file)
    files = [BundleFile(root_path.name, root_file.data)]
    for name, include_findings in _included_names(root, root_path.name, root_file.data):
        findings += include_findings
        if name is None:
            continue
        included = load_yaml(os.path.join(root, name), name, budget)
        findings += included.findings + _unknown_keys(name, included)
        files.append(BundleFile(name, included.data))
        if isinstance(included.data, dict) and "include" in included.data:
            findings.append(Finding("include-outside-root", f"{name} has an include section; the CLI only reads "
                                    "include from the root file", "move these globs to databricks.yml",
                                    file=name, path="include", severity="warning"))
    with gc_paused():
        tree, merge_findings = _merge_files(files)
    return Bundle(root, files, tree, findings + merge_findings)


def _several_root_files(root: FilePath) -> list[Finding]:
    """The CLI refuses a folder with more than one root file name (bundle/config/filename.go, FindInPath)."""
    present = [name for name in ROOT_FILE_NAMES if (root / name).exists()]
    if len(present) < 2:
        return []
    return [Finding("several-root-files", f"the bundle folder holds {', '.join(present)}: the CLI refuses more than "
                    "one bundle root file", f"keep {present[0]} and merge the others into it", file=present[1])]


def _unknown_keys(name: str, loaded: YamlFile) -> list[Finding]:
    """The CLI's warning for a key its Root (or Target) struct lacks, sparing blocks kept only for their anchors
    (libs/dyn/convert/normalize.go)."""
    data = loaded.data
    if not isinstance(data, dict):
        return []
    places = [((), data, ROOT_FIELDS, "top-level key")]
    targets = data.get("targets")
    if isinstance(targets, dict):
        places += [(("targets", str(target)), section, TARGET_FIELDS, f"key of target {target!r}")
                   for target, section in targets.items() if isinstance(section, dict)]
    return [Finding("unknown-key", f"unknown {what} {key!r}: the CLI ignores it (warning \"unknown field: {key}\")",
                    _unknown_key_fix(str(key), known), file=name, path=format_path((*path, str(key))),
                    severity="warning")
            for path, section, known, what in places for key in section
            if key not in known and (*path, str(key)) not in loaded.anchor_paths]


@functools.lru_cache(maxsize=1024)
def _unknown_key_fix(key: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}remove it or fix its name; the known keys are {', '.join(k for k in known if k[0] != '_')}"


def _included_names(root: FilePath, root_name: str, root_data: Any):
    """(relative file name or None, findings) for every include entry, in order; each file once. The CLI's rules
    (bundle/config/loader/process_root_includes.go): an entry is a path relative to the bundle root, globbed; an
    entry without glob characters must match; every match must be a .yml, .yaml or .json file and is read (a
    folder, a FIFO or a broken link among them is an error when it is read, see `yaml_files`); matches of one
    entry are sorted; a file already loaded (the root file names included) is skipped."""
    includes = root_data.get("include") if isinstance(root_data, dict) else None
    if includes is None:
        return
    if not isinstance(includes, list):
        yield None, [Finding("include-not-a-list", "include must be a list of glob patterns",
                             'write include: ["resources/*.yml"]', file=root_name, path="include")]
        return
    glob_character = next((character for character in "*?[]^" if character in str(root)), None)
    if glob_character is not None:
        yield None, [Finding("bundle-root-has-glob-characters", f"the bundle folder {root} holds the glob character "
                             f"{glob_character!r}: the CLI refuses to load its includes from there",
                             "rename or move the folder so that its path has none of * ? [ ] ^", file=root_name,
                             path="include")]
        return
    seen = set(ROOT_FILE_NAMES)
    for index, pattern in enumerate(includes):
        path = format_path(("include", index))
        if not isinstance(pattern, str):
            yield None, [Finding("include-not-a-glob", f"include entry {pattern!r} is not a glob pattern",
                                 "write each include as a string such as resources/*.yml", file=root_name, path=path)]
            continue
        if os.path.isabs(pattern) or pattern.startswith(("/", "\\")):
            yield None, [Finding("include-absolute", f"include {pattern!r} is an absolute path: the CLI refuses it "
                                 "(includes must be relative paths)", "write the path relative to the folder of "
                                 f"{root_name}, e.g. resources/*.yml", file=root_name, path=path)]
            continue
        bad = bad_pattern(pattern)
        if bad:
            yield None, [Finding("include-bad-pattern", f"include {pattern!r} is not a valid glob pattern ({bad}): "
                                 "the CLI stops with \"syntax error in pattern\"", "close the [ ] class, or write "
                                 "the character as [x]", file=root_name, path=path)]
            continue
        matches = glob_like_go(root, pattern)
        if not matches:
            if any(character in pattern for character in "*?["):
                yield None, [Finding("include-matches-nothing", f"include {pattern!r} matches no file under {root}",
                                     "fix the glob (it is relative to the folder of databricks.yml) or remove it",
                                     file=root_name, path=path, severity="warning")]
            else:
                yield None, [Finding("include-file-missing", f"include {pattern!r} names no file under {root} (the "
                                     "CLI: \"does not match any files\")", "create the file, fix the path (relative "
                                     f"to the folder of {root_name}) or remove the entry", file=root_name, path=path)]
        for name in matches:
            if name in seen:
                continue
            seen.add(name)
            if not name.endswith(INCLUDE_EXTENSIONS):
                yield None, [Finding("include-not-yaml", f"include {pattern!r} matches {name}, which is not a YAML or "
                                     "JSON file: the CLI refuses it", "narrow the glob to *.yml files; to deploy "
                                     "other files with the bundle, list them under sync.include instead",
                                     file=root_name, path=path)]
                continue
            yield name, []


def bad_pattern(pattern: str) -> str | None:
    """Why Go's filepath.Match would refuse `pattern` (ErrBadPattern), or None."""
    position = 0
    while position < len(pattern):
        character = pattern[position]
        if character == "\\" and position + 1 == len(pattern):
            return "a trailing backslash"
        if character == "\\":
            position += 2
            continue
        if character == "[":
            position += 1 + (pattern[position + 1:position + 2] == "^")
            end = pattern.find("]", position)
            if end == -1:
                return "a [ without its ]"
            if end == position or pattern[position] in "-]":
                return "an empty or malformed [ ] class"
            position = end
        position += 1
    return None


def glob_like_go(root: FilePath, pattern: str) -> list[str]:
    """Relative names that `pattern` matches under `root`, as Go's filepath.Glob would: hidden files match `*`
    (from Python 3.11), `[^...]` negates a class; folders, FIFOs and broken links are matches too."""
    pattern = pattern.replace("[^", "[!")
    hidden = {"include_hidden": True} if sys.version_info >= (3, 11) else {}
    try:
        matches = glob.glob(pattern, root_dir=root, **hidden)
    except (OSError, ValueError):
        return []
    return sorted(os.path.normpath(name).replace("\\", "/") for name in matches)  # "./x.yml" is "x.yml"


def _merge_files(files: list[BundleFile]) -> tuple[SourcedDict, list[Finding]]:
    """All files merged in order; a resource key already defined by an earlier file is reported and skipped."""
    tree = SourcedDict()
    defined_by: dict[str, tuple[str, str]] = {}  # resource key -> (resource type, file)
    findings: list[Finding] = []
    for bundle_file in files:
        if bundle_file.data is None:
            continue
        data = attach_source(bundle_file.data, bundle_file.name)
        resources = data.get("resources")
        if isinstance(resources, dict):
            for resource_type, of_type in resources.items():
                if not isinstance(of_type, dict):
                    continue
                for key in list(of_type):
                    if key in defined_by:
                        findings.append(_duplicate_resource(resource_type, key, defined_by[key], bundle_file.name))
                        del of_type[key]
                    else:
                        defined_by[key] = (resource_type, bundle_file.name)
        merge_into(tree, data)
    return tree, findings


def _duplicate_resource(resource_type: str, key: str, first: tuple[str, str], file: str) -> Finding:
    first_type, first_file = first
    where = "this file" if first_file == file else first_file
    what = f"{resource_type} {key!r}" if first_type == resource_type else \
        f"{resource_type} {key!r} (the key of {first_type} {key!r})"
    return Finding("duplicate-resource-key", f"{what} is already defined in {where}",
                   "resource keys must be unique across the bundle, whatever their type: rename one of them",
                   file=file, path=format_path(("resources", resource_type, key)))
