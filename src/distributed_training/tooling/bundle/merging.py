"""How the Databricks CLI combines configuration: included files into the root, a target over the root.

- Mappings merge key by key, recursively; lists concatenate; any other value from the override replaces the base
  (an empty override, `key:` with nothing after it, keeps the base).
- After merging, the list items the CLI knows by a key are merged into the first item with the same key: job
  tasks (`task_key`), job clusters (`job_cluster_key`), job parameters (`name`) and pipeline clusters (`label`).
  That is how a target changes one task of a job without repeating the others. The CLI merges them once variables
  are resolved (bundle/config/mutator/resourcemutator/resource_mutator.go: MergeJobClusters and the others run after
  the resolver), so a key written `${var.cluster}` merges with the item its value names.
- A target overrides `bundle`, `workspace`, `artifacts`, `resources`, `sync`, `permissions` and `presets` by
  merging; its `variables` set the `default` (or `lookup`) of root variables; `run_as` replaces the root's;
  `cluster_id` (old name `compute_id`) and `git.branch` land under `bundle`. (The CLI also keeps `mode` under
  `bundle`, but the schema does not know it there: it stays in the target's own section.)
"""

from __future__ import annotations

from typing import Any, Callable

from .sourced_trees import SourcedDict, SourcedList, source_of

TARGET_MERGED_FIELDS = ("bundle", "workspace", "artifacts", "resources", "sync", "permissions", "presets")

# resource type -> list field -> the key that identifies an item of that list
KEYED_LISTS = {
    "jobs": {"tasks": "task_key", "job_clusters": "job_cluster_key", "parameters": "name"},
    "pipelines": {"clusters": "label"},
}


def merge(base: Any, override: Any) -> Any:
    """`override` merged over `base` by the CLI's rules (see the module docstring); sources travel along."""
    if override is None:
        return base
    if isinstance(base, dict) and isinstance(override, dict):
        merged = SourcedDict(base, getattr(base, "sources", {}))
        for key, value in override.items():
            if key in merged and _same_container(merged[key], value):
                merged[key] = merge(merged[key], value)
            elif value is not None or key not in merged:
                merged.put(key, value, source_of(override, key))
        return merged
    if isinstance(base, list) and isinstance(override, list):
        return SourcedList([*base, *override], [*_list_sources(base), *_list_sources(override)])
    return override


def merge_into(base: SourcedDict, override: dict) -> None:
    """`override` merged into `base` in place, by the same rules: the loader merges each included file into a tree
    it owns, so a bundle of many files costs one pass over each (copying the tree per file would be quadratic)."""
    for key, value in override.items():
        current = base.get(key)
        if isinstance(current, SourcedDict) and isinstance(value, dict):
            merge_into(current, value)
        elif isinstance(current, SourcedList) and isinstance(value, list):
            current.sources.extend(_list_sources(value))
            current.extend(value)
        elif isinstance(current, (dict, list)) and _same_container(current, value):
            base.put(key, merge(current, value), source_of(base, key))
        elif value is not None or key not in base:
            base.put(key, value, source_of(override, key))


def _same_container(base: Any, override: Any) -> bool:
    return any(isinstance(base, kind) and isinstance(override, kind) for kind in (dict, list))


def _list_sources(items: list) -> list[str | None]:
    return list(getattr(items, "sources", [None] * len(items)))


def merge_items_by_key(items: list, key_field: str, default_key: str | None = None,
                       key_of: Callable[[Any], Any] = lambda key: key) -> list:
    """Items sharing a key (as `key_of` reads it) merged into the first of them; items without a key stay as they
    are."""
    merged: list = []
    sources: list[str | None] = []
    first_index: dict[str, int] = {}
    for item, source in zip(items, _list_sources(items)):
        key = key_of(item.get(key_field, default_key)) if isinstance(item, dict) else None
        if isinstance(key, str) and key_field == "label":
            key = key.lower()
        if isinstance(key, str) and key in first_index:
            merged[first_index[key]] = merge(merged[first_index[key]], item)
            continue
        if isinstance(key, str):
            first_index[key] = len(merged)
        merged.append(item)
        sources.append(source)
    return SourcedList(merged, sources)


def merge_keyed_lists(tree: dict, key_of: Callable[[Any], Any] = lambda key: key) -> None:
    """Apply `merge_items_by_key` to every keyed list of every resource of `tree`; `key_of`: an item's key once its
    references are resolved. A resource whose items merge is copied into `tree` first (and the mappings above it): a
    part that a target leaves alone is shared with the bundle and the other targets' trees."""
    resources = tree.get("resources")
    if not isinstance(resources, dict):
        return
    copied: set[int] = set()
    for resource_type, list_fields in KEYED_LISTS.items():
        of_type = resources.get(resource_type)
        if not isinstance(of_type, dict):
            continue
        for key, resource in list(of_type.items()):
            if not isinstance(resource, dict):
                continue
            merged_lists = {}
            for field, key_field in list_fields.items():
                items = resource.get(field)
                if isinstance(items, list) and len(items) > 1:  # (one item has none to merge with)
                    merged = merge_items_by_key(items, key_field, "default" if key_field == "label" else None, key_of)
                    if len(merged) < len(items):
                        merged_lists[field] = merged
            if merged_lists:
                resources = _own(tree, "resources", copied)
                of_type = _own(resources, resource_type, copied)
                _own(of_type, key, copied).update(merged_lists)


def _own(parent: dict, key: str, copied: set[int]) -> SourcedDict:
    """`parent[key]`, replaced by a copy of it the first time (`copied` holds the ids of the copies)."""
    child = parent[key]
    if id(child) not in copied:
        child = SourcedDict(child, getattr(child, "sources", {}))
        parent[key] = child
        copied.add(id(child))
    return child


def apply_target(root: dict, name: str, merge_lists: bool = True) -> SourcedDict:
    """The configuration the CLI deploys for target `name`: the root (without `targets`) with the target merged in;
    `merge_lists=False` leaves the keyed lists for the caller to merge once it has resolved their keys."""
    targets = root.get("targets")
    target = targets.get(name) if isinstance(targets, dict) else None
    target = target if isinstance(target, dict) else {}
    tree = SourcedDict({key: value for key, value in root.items() if key not in ("targets", "environments")},
                       getattr(root, "sources", {}))
    for field in TARGET_MERGED_FIELDS:
        if field in target:
            tree.put(field, merge(tree.get(field), target[field]), source_of(tree, field) or source_of(target, field))
    if isinstance(target.get("variables"), dict):
        tree.put("variables", _override_variables(tree.get("variables"), target["variables"]),
                 source_of(tree, "variables") or source_of(target, "variables"))
    if "run_as" in target:
        tree.put("run_as", target["run_as"], source_of(target, "run_as"))
    bundle_overrides = SourcedDict()
    for field, bundle_field in (("compute_id", "cluster_id"), ("cluster_id", "cluster_id")):
        if field in target:
            bundle_overrides.put(bundle_field, target[field], source_of(target, field))
    branch = (target.get("git") or {}).get("branch") if isinstance(target.get("git"), dict) else None
    if branch is not None:
        bundle_overrides.put("git", SourcedDict({"branch": branch}, {"branch": source_of(target, "git")}),
                             source_of(target, "git"))
    if bundle_overrides:
        first_source = next(iter(bundle_overrides.sources.values()), None)
        tree.put("bundle", merge(tree.get("bundle") or SourcedDict(), bundle_overrides),
                 source_of(tree, "bundle") or first_source)
    if merge_lists:
        merge_keyed_lists(tree)
    return tree


def _override_variables(root_variables: Any, target_variables: dict) -> SourcedDict:
    if not isinstance(root_variables, dict):  # malformed: the schema reports it
        root_variables = {}
    variables = SourcedDict(root_variables, getattr(root_variables, "sources", {}))
    for name, value in target_variables.items():
        source = source_of(target_variables, name)
        declared = variables.get(name)
        declared = declared if isinstance(declared, dict) else {}
        definition = SourcedDict(declared, getattr(declared, "sources", {}))
        if isinstance(value, dict) and ("default" in value or "lookup" in value):
            for field in ("default", "lookup"):
                if field in value:
                    definition.pop("default" if field == "lookup" else "lookup", None)
                    definition.put(field, value[field], source_of(value, field))
        else:
            definition.pop("lookup", None)
            definition.put("default", value, source)
        variables.put(name, definition, source_of(variables, name) or source)
    return variables
