"""Guards: the platform's rules over the node-type catalog (filled in by the compute work)."""

from __future__ import annotations

from ..findings import Finding


def check_bundle_clusters(tree: dict) -> list[Finding]:
    """Findings for every cluster of a merged bundle tree (one target), with `path` set inside the tree."""
    return []
