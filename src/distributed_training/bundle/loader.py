"""Load a bundle: databricks.yml, the files its `include:` globs name, merged into one tree; and its targets.

What goes wrong while loading (a YAML error, an include that matches nothing, a resource key defined twice) is
recorded as a finding on the `Bundle`, never raised: the rest of the bundle is still worth checking. Only a
folder that is not a bundle at all raises `NotABundle`.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any

from ..findings import Finding
from .merging import apply_target, merge, merge_keyed_lists
from .paths import format_path
from .sourced import SourcedDict, attach_source
from .yaml_files import load_yaml

ROOT_FILE_NAMES = ("databricks.yml", "databricks.yaml", "bundle.yml", "bundle.yaml")
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

    def target_tree(self, name: str) -> SourcedDict:
        """The tree the CLI deploys for target `name` (`IMPLICIT_TARGET` for a bundle without targets)."""
        if name == IMPLICIT_TARGET and not self.target_names:
            tree = SourcedDict({key: value for key, value in self.tree.items() if key != "targets"},
                               self.tree.sources)
            merge_keyed_lists(tree)
            return tree
        return apply_target(self.tree, name)


def find_root_file(bundle_dir: FilePath) -> FilePath:
    for name in ROOT_FILE_NAMES:
        if (bundle_dir / name).is_file():
            return bundle_dir / name
    raise NotABundle(f"{bundle_dir} has no databricks.yml: it is not a bundle folder "
                     "(pass the folder that holds databricks.yml)")


def load_bundle(bundle_dir: str | FilePath) -> Bundle:
    root = FilePath(bundle_dir).resolve()
    root_path = find_root_file(root)
    root_data, findings = load_yaml(root_path, root_path.name)
    files = [BundleFile(root_path.name, root_data)]
    for name, include_findings in _included_names(root, root_path.name, root_data):
        findings += include_findings
        if name is None:
            continue
        data, file_findings = load_yaml(root / name, name)
        findings += file_findings
        files.append(BundleFile(name, data))
        if isinstance(data, dict) and "include" in data:
            findings.append(Finding("include-outside-root", f"{name} has an include section; the CLI only reads "
                                    "include from the root file", "move these globs to databricks.yml",
                                    file=name, path="include", severity="warning"))
    tree, merge_findings = _merge_files(files)
    return Bundle(root, files, tree, findings + merge_findings)


def _included_names(root: FilePath, root_name: str, root_data: Any):
    """(relative file name or None, findings) for every include glob, in order; each file once."""
    includes = root_data.get("include") if isinstance(root_data, dict) else None
    if includes is None:
        return
    if not isinstance(includes, list):
        yield None, [Finding("include-not-a-list", "include must be a list of glob patterns",
                             'write include: ["resources/*.yml"]', file=root_name, path="include")]
        return
    seen = {root_name}
    for index, pattern in enumerate(includes):
        path = format_path(("include", index))
        if not isinstance(pattern, str):
            yield None, [Finding("include-not-a-glob", f"include entry {pattern!r} is not a glob pattern",
                                 "write each include as a string such as resources/*.yml", file=root_name, path=path)]
            continue
        matches = sorted(glob.glob(pattern, root_dir=root))
        matches = [name.replace("\\", "/") for name in matches if (root / name).is_file()]
        if not matches:
            yield None, [Finding("include-matches-nothing", f"include {pattern!r} matches no file under {root}",
                                 "fix the glob (it is relative to the folder of databricks.yml) or remove it",
                                 file=root_name, path=path)]
        for name in matches:
            if name not in seen:
                seen.add(name)
                yield name, []


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
        tree = merge(tree, data)
    return tree, findings


def _duplicate_resource(resource_type: str, key: str, first: tuple[str, str], file: str) -> Finding:
    first_type, first_file = first
    where = "this file" if first_file == file else first_file
    what = f"{resource_type} {key!r}" if first_type == resource_type else \
        f"{resource_type} {key!r} (the key of {first_type} {key!r})"
    return Finding("duplicate-resource-key", f"{what} is already defined in {where}",
                   "resource keys must be unique across the bundle, whatever their type: rename one of them",
                   file=file, path=format_path(("resources", resource_type, key)))
