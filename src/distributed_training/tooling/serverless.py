"""Serverless GPU compute (AI Runtime, public preview): the accelerators a job may ask for, and its rules.

There is no cluster to size: a task names an accelerator type (the GPUs of one node) and a total count over nodes.
The training loop runs under torchrun there, one process per GPU, so only the engines whose loop is plain torch
make sense: TorchDistributor's loop (DDP) and DeepSpeed's. Ray on Spark and Spark ML need a Spark cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from ..compute.guards import is_reference
from ..compute.requirements import DEEPSPEED, ENGINES, TORCH_DISTRIBUTOR
from ..compute.runtime import versions
from ..findings import Finding

CLASSIC = "classic"
SERVERLESS_GPU = "serverless_gpu"
COMPUTE_CHOICES = (CLASSIC, SERVERLESS_GPU)
SERVERLESS_ENGINES = (TORCH_DISTRIBUTOR, DEEPSPEED)


@dataclass(frozen=True)
class Accelerator:
    name: str  # the platform's accelerator_type
    gpus_per_node: int
    gpu: str
    gpu_memory_gb: int


ACCELERATORS = {name: Accelerator(name, **spec) for name, spec in versions()["serverless"]["accelerators"].items()}
DEFAULT_ACCELERATOR = versions()["serverless"]["default_accelerator"]


def default_accelerator_count(accelerator_type: str) -> int:
    """One node of that type."""
    accelerator = ACCELERATORS.get(accelerator_type)
    return accelerator.gpus_per_node if accelerator else 1


def nodes(accelerator_type: str, accelerator_count: int) -> int:
    return accelerator_count // ACCELERATORS[accelerator_type].gpus_per_node


def check_accelerators(accelerator_type: Any, accelerator_count: Any, path: str = "") -> list[Finding]:
    """The accelerator type and total count of one serverless GPU task. `path` prefixes the YAML paths
    (e.g. `resources.jobs.train.tasks[1].ai_runtime_task.deployments[0].compute.`)."""
    return list(_accelerator_rules(accelerator_type, accelerator_count, path))


def _accelerator_rules(accelerator_type: Any, accelerator_count: Any, path: str) -> Iterator[Finding]:
    if is_reference(accelerator_type) or is_reference(accelerator_count):
        return  # a variable: checked where it is resolved
    accelerator = ACCELERATORS.get(str(accelerator_type))
    if accelerator is None:
        yield Finding("serverless-gpu-accelerator-type",
                      f"accelerator_type {accelerator_type!r} is not one serverless GPU compute offers",
                      f"use one of {', '.join(ACCELERATORS)}", path=path + "accelerator_type")
        return
    if isinstance(accelerator_count, bool) or not isinstance(accelerator_count, int) or accelerator_count < 1 \
            or accelerator_count % accelerator.gpus_per_node:
        per_node = accelerator.gpus_per_node
        examples = ", ".join(str(per_node * count) for count in (1, 2, 4))
        yield Finding("serverless-gpu-accelerator-count",
                      f"accelerator_count {accelerator_count!r} is not a positive multiple of {per_node}, the GPUs "
                      f"of one {accelerator.name} node (the count is the total over all nodes)",
                      f"use {examples}, ... ({per_node} per node)", path=path + "accelerator_count")
        return
    node_count = accelerator_count // accelerator.gpus_per_node
    if node_count > 1 and accelerator.gpus_per_node == 1:
        yield Finding("serverless-gpu-single-gpu-nodes",
                      f"{accelerator_count} x {accelerator.name} is {node_count} nodes of one GPU each: every "
                      "gradient of every step crosses the network",
                      "train on one GPU while the model and data fit; for more GPUs use GPU_8xH100 (8 on one node)",
                      path=path + "accelerator_count", severity="warning")
    elif node_count > 1:
        yield Finding("serverless-gpu-multi-node",
                      f"{accelerator_count} x {accelerator.name} spans {node_count} nodes",
                      "go beyond one node only when the model or the data does not fit on one (see `advise`)",
                      path=path + "accelerator_count", severity="warning")


def check_engine(engine: Any, path: str = "engine") -> list[Finding]:
    if engine in SERVERLESS_ENGINES or is_reference(engine):
        return []
    if engine in ENGINES:
        why = "it needs a Spark cluster"
    elif engine == "all":
        why = "all means one job per engine, and ray and spark_ml_connect need a Spark cluster"
    else:
        why = "it is not a training engine"
    return [Finding("serverless-gpu-engine",
                    f"engine {engine!r} cannot run on serverless GPU compute: {why}",
                    f"use engine {' or '.join(SERVERLESS_ENGINES)} (the torch loop under torchrun), or compute "
                    "classic for a cluster", path=path)]
