"""The node-type catalog: `node_types.yaml` beside this file, read into `NodeType`s."""

import difflib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

CATALOG_FILE = Path(__file__).with_name("node_types.yaml")
CLOUDS = ("azure", "aws", "gcp")
MULTI_NODE_VERDICTS = ("allow", "warn", "refuse")
NETWORKS = ("none", "standard", "accelerated", "infiniband", "efa")
FAMILY_FIELDS = ("family", "cloud", "gpu_model", "gpu_memory_gb", "network", "multi_node", "reason", "source",
                 "node_types")
NODE_FIELDS = ("id", "gpus", "vcpus", "memory_gb")


@dataclass(frozen=True)
class Retirement:
    date: str
    source: str
    replacements: tuple[str, ...]


@dataclass(frozen=True)
class NodeType:
    id: str
    cloud: str
    family: str
    gpus: int
    gpu_model: str | None
    gpu_memory_gb: float
    vcpus: int
    memory_gb: float
    network: str
    multi_node: str
    reason: str
    source: str
    notes: str | None = None
    multi_gpu_broken: bool = False
    retired: Retirement | None = None

    @property
    def has_gpu(self) -> bool:
        return self.gpus > 0


class CatalogError(ValueError):
    """The catalog file is malformed: names the file, the entry and the field."""


class Catalog:
    def __init__(self, node_types: list[NodeType], defaults: dict[str, dict[str, str]]):
        self.node_types, self.defaults = node_types, defaults
        self._by_id = {node.id: node for node in node_types}

    def find(self, node_type_id: str) -> NodeType | None:
        return self._by_id.get(node_type_id)

    def family(self, family: str) -> list[NodeType]:
        return [node for node in self.node_types if node.family == family]

    def closest(self, node_type_id: str, cloud: str | None = None, count: int = 3) -> list[str]:
        by_lower = {node.id.lower(): node.id for node in self.node_types
                    if (cloud is None or node.cloud == cloud) and not node.retired}
        matches = difflib.get_close_matches(node_type_id.lower(), list(by_lower), n=count, cutoff=0.5)
        return [by_lower[match] for match in matches]


def _family_node_types(family: dict, where: str) -> list[NodeType]:
    if missing := [name for name in FAMILY_FIELDS if name not in family]:
        raise CatalogError(f"{where}: family {family.get('family', '?')!r} lacks {', '.join(missing)}")
    for key, allowed in (("cloud", CLOUDS), ("multi_node", MULTI_NODE_VERDICTS), ("network", NETWORKS)):
        if family[key] not in allowed:
            raise CatalogError(f"{where}: family {family['family']!r} has {key} {family[key]!r}; use one of {allowed}")
    retired = family.get("retired")
    if retired is not None:
        if missing := [name for name in ("date", "source", "replacements")
                       if not isinstance(retired, dict) or not retired.get(name)]:
            raise CatalogError(f"{where}: family {family['family']!r} has retired without {', '.join(missing)}")
        retired = Retirement(str(retired["date"]), retired["source"], tuple(retired["replacements"]))
    shared = {name: family[name] for name in FAMILY_FIELDS if name not in ("gpu_memory_gb", "node_types")}
    node_types = []
    for entry in family["node_types"]:
        if missing := [name for name in NODE_FIELDS if name not in entry]:
            raise CatalogError(f"{where}: node type {entry.get('id', '?')!r} in family {family['family']!r} "
                               f"lacks {', '.join(missing)}")
        node_types.append(NodeType(
            **shared, id=entry["id"], gpus=int(entry["gpus"]), vcpus=int(entry["vcpus"]), notes=family.get("notes"),
            memory_gb=float(entry["memory_gb"]), gpu_memory_gb=float(family["gpu_memory_gb"]), retired=retired,
            multi_gpu_broken=bool(entry.get("multi_gpu_broken", False))))
    return node_types


def load_catalog(path: Path | str = CATALOG_FILE) -> Catalog:
    path = Path(path)
    document = yaml.safe_load(path.read_text())
    node_types = [node for family in document["families"] for node in _family_node_types(family, str(path))]
    catalog = Catalog(node_types, document["defaults"])
    for node in node_types:
        if catalog.find(node.id) is not node:  # a later entry of the same id took its place
            raise CatalogError(f"{path}: node type {node.id!r} is listed twice")
        for replacement in node.retired.replacements if node.retired else ():
            if catalog.find(replacement) is None or catalog.find(replacement).retired:
                raise CatalogError(f"{path}: {node.id} names {replacement!r} as a replacement, which is not a "
                                   "current node type of the catalog")
    for cloud in CLOUDS:
        for kind in ("gpu", "cpu"):
            default = catalog.find(document["defaults"][cloud][kind])
            if default is None or default.cloud != cloud or default.has_gpu != (kind == "gpu"):
                raise CatalogError(f"{path}: defaults.{cloud}.{kind} must name a {kind.upper()} node type of {cloud}")
    return catalog


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    return load_catalog()
