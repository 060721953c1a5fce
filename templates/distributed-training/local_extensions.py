"""Jinja extension for the template: the shared library's answer logic, available while rendering.

Cookiecutter puts this folder on sys.path for `_extensions`; the shared library lives two folders up, in the
repository's `src/` (the template is always used from a checkout or clone of the whole repository).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from jinja2.ext import Extension

SHARED_SOURCE = Path(__file__).resolve().parents[2] / "src"
if str(SHARED_SOURCE) not in sys.path:
    sys.path.insert(0, str(SHARED_SOURCE))

from distributed_training import answers  # noqa: E402  (needs the path above)
from distributed_training.compute import clusters, serverless  # noqa: E402


def _to_yaml(value, indent: int = 0) -> str:
    """A mapping as block YAML, every line after the first indented by `indent` spaces."""
    text = yaml.safe_dump(value, sort_keys=False, default_flow_style=False).rstrip("\n")
    return text.replace("\n", "\n" + " " * indent)


class BundleAnswers(Extension):
    def __init__(self, environment):
        super().__init__(environment)
        environment.globals.update(
            default_node_type=answers.default_node_type,
            default_cpu_node_type=answers.default_cpu_node_type,
            default_spark_version=clusters.default_spark_version,
            job_cluster=answers.job_cluster,
            is_serverless=answers.is_serverless,
            nodes_and_gpus=answers.nodes_and_gpus,
            default_accelerator_count=serverless.default_accelerator_count,
            chosen_engines=answers.chosen_engines,
            gpus_per_node=clusters.gpus_per_node,
            connect_version=clusters.databricks_connect_version,
            shared_source=str(SHARED_SOURCE),
        )
        environment.filters["to_yaml"] = _to_yaml
