"""`advise`: single node or several, which engine, which node type and how many, from model and data size.

The platform's advice is the order in which setups are tried; the first step that holds the job wins:
1. one GPU (a single-GPU node type): no distributed training at all;
2. one node with several GPUs, sharding the training state with DeepSpeed ZeRO when plain DDP does not fit;
3. one node with the optimizer states (and weights) offloaded to CPU memory: slow, but no network between nodes;
4. several nodes, only of families whose catalog verdict on multi-node training is allow or warn (never Azure
   NC-series, whose verdict is refuse);
5. several nodes with CPU offload.
Within a step the simplest technique that fits is taken: DDP, DDP with activation checkpointing, ZeRO 1, 2, 3,
then ZeRO with checkpointing (offload: ZeRO 2 then 3 with the optimizer, then ZeRO 3 with the weights too). Among
node types that fit: families the catalog allows without reservation before those it warns about (its reasons:
unverified interconnect, unconfirmed availability, a graphics family), then the fewest nodes, the fewest GPUs, the
smallest GPU, the simplest technique, the smallest node.

Engine: DeepSpeed when ZeRO or offload is needed (the distributor for models that need more compute but are
limited by memory); otherwise TorchDistributor (DDP), or Ray Train when asked for. Where ZeRO without offload holds
the job, FSDP2 (`train --parallelism fsdp2` under TorchDistributor or Ray) holds it too, sharding everything as ZeRO 3
does in torch alone: the advice says so, with its own arithmetic. Classical models on tabular data
train with Spark ML on CPU nodes: one node while the data fits in its memory, more workers when it does not.

The same search, without offload (the serverless nodes' host memory is not published), picks the serverless GPU
alternative: the first of GPU_1xA10, GPU_1xH100, then GPU_8xH100 on one node and on as few nodes as hold the job.

Memory per GPU is estimated by `memory` (its docstring states the accounting). Training time is not estimated:
that needs the GPU's sustained throughput on this model, which no table here can promise; the advice says what
the next step up would be when a measured epoch is too slow.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Callable

from ...compute.catalog import CLOUDS, Catalog, NodeType, default_catalog
from ...compute.requirements import DEEPSPEED, RAY, SPARK_ML_CONNECT, TORCH_DISTRIBUTOR
from ..serverless import ACCELERATORS, SERVERLESS_GPU
from .memory import (
    HEADROOM, MLP, NAMED_MODELS, OPTIMIZERS, PRECISIONS, TRANSFORMER, Estimate, ModelShape, Sharding, Term,
    Training, estimate, format_count, format_gb, fully_sharded, mlp_params, parse_count,
)

CLASSICAL = "classical"
MODEL_TYPES = (TRANSFORMER, MLP, CLASSICAL)
MAX_NODES = 256  # the template accepts up to 256 workers
VERDICT_RANK = {"allow": 0, "warn": 1, "refuse": 2}
DATA_CACHE_SHARE = 0.5  # a dataset up to half of a node's memory can be cached there next to everything else
SPARK_EXPANSION = 2.0  # rows held in memory against compressed Parquet on disk (an assumption: measure with cache())
SPARK_USABLE = 0.5  # share of a node's memory that Spark gives to cached data and execution
MAX_SIZE = 10**9  # layers, widths, batch, sequence length: beyond this the arithmetic describes no real model
MAX_DATASET_GB = 1e9  # an exabyte

ON_GPU_LADDER = (
    Sharding(0), Sharding(0, checkpointing=True), Sharding(1), Sharding(2), Sharding(3),
    Sharding(1, checkpointing=True), Sharding(2, checkpointing=True), Sharding(3, checkpointing=True),
)
OFFLOAD_LADDER = tuple(
    Sharding(stage, offload, checkpointing)
    for stage, offload in ((2, "optimizer"), (3, "optimizer"), (3, "optimizer+weights"))
    for checkpointing in (False, True)
)


class AdviseError(ValueError):
    """The question cannot be answered as asked: names the input and what to give instead."""


@dataclass(frozen=True)
class Job:
    """What the user wants to train, and where."""

    cloud: str
    training: Training | None  # None: a classical model (Spark ML on tabular data)
    dataset_gb: float = 0.0
    node_type_id: str | None = None  # only consider this node type
    prefer_ray: bool = False
    activation_checkpointing: bool = False  # the model always checkpoints: count it in every setup


@dataclass(frozen=True)
class Plan:
    node: NodeType
    nodes: int
    engine: str
    sharding: Sharding | None = None  # GPU plans
    estimate: Estimate | None = None  # GPU plans: per GPU
    data_terms: tuple[Term, ...] = ()  # Spark ML plans: the data arithmetic

    @property
    def gpus(self) -> int:
        return self.node.gpus * self.nodes

    @property
    def num_workers(self) -> int:
        """Single node trains on the driver (0 workers); several nodes train on the workers."""
        return 0 if self.nodes == 1 else self.nodes

    def describe(self) -> str:
        hardware = f"{self.node.gpus} x {self.node.gpu_model} {self.node.gpu_memory_gb:g} GB" if self.node.has_gpu \
            else f"{self.node.vcpus} vCPUs, {self.node.memory_gb:g} GB"
        where = "one node" if self.nodes == 1 else f"{self.nodes} nodes"
        gpus = f", {self.gpus} GPU{'s' if self.gpus > 1 else ''}" if self.node.has_gpu else ""
        return f"{where}{gpus}: {self.node.id} ({hardware}), num_workers={self.num_workers}"


@dataclass(frozen=True)
class ServerlessPlan:
    accelerator_type: str
    accelerator_count: int
    engine: str
    sharding: Sharding

    def template_answers(self, cloud: str) -> dict[str, str]:
        return {"cloud": cloud, "engine": self.engine, "compute": SERVERLESS_GPU,
                "accelerator_type": self.accelerator_type, "accelerator_count": str(self.accelerator_count)}


@dataclass(frozen=True)
class Advice:
    job: Job
    plan: Plan | None  # None: nothing in scope holds the job
    why: str
    notes: tuple[str, ...] = ()
    baseline: Estimate | None = None  # one GPU, nothing sharded (GPU jobs)
    alternative: Plan | None = None  # when the plan offloads to CPU: the best setup without offload
    serverless: ServerlessPlan | None = None  # GPU jobs: the serverless GPU compute that holds it, if any

    def template_answers(self) -> dict[str, str]:
        """The cookiecutter answers that generate a project for this plan."""
        if self.plan is None:
            raise AdviseError(self.why)
        return {"cloud": self.job.cloud, "engine": self.plan.engine, "node_type_id": self.plan.node.id,
                "num_workers": str(self.plan.num_workers)}

    def deepspeed_config(self) -> dict | None:
        if self.plan is None or self.plan.engine != DEEPSPEED:
            return None
        return deepspeed_config(self.plan.sharding, self.job.training.precision)

    def to_dict(self) -> dict:
        return {
            "job": _job_dict(self.job),
            "fits": self.plan is not None,
            "why": self.why,
            "baseline_one_gpu": _estimate_dict(self.baseline),
            "recommendation": _plan_dict(self.plan),
            "deepspeed_config": self.deepspeed_config(),
            "fsdp2": _fsdp2_dict(self.job, self.plan),
            "alternative": _plan_dict(self.alternative),
            "notes": list(self.notes),
            "template_answers": self.template_answers() if self.plan else None,
            "serverless_gpu_template_answers": self.serverless.template_answers(self.job.cloud)
            if self.serverless else None,
            "headroom": HEADROOM,
        }


def deepspeed_config(sharding: Sharding, precision: str) -> dict:
    zero: dict = {"stage": sharding.zero_stage}
    if sharding.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu"}
    if sharding.offload == "optimizer+weights":
        zero["offload_param"] = {"device": "cpu"}
    config: dict = {"zero_optimization": zero}
    if precision != "fp32":
        config[precision] = {"enabled": True}
    return config


def advise(job: Job, catalog: Catalog | None = None) -> Advice:
    catalog = catalog or default_catalog()
    if job.cloud not in CLOUDS:
        raise AdviseError(f"cloud {job.cloud!r} is not one of {', '.join(CLOUDS)}")
    if not 0 <= job.dataset_gb <= MAX_DATASET_GB:
        raise AdviseError(f"dataset size {job.dataset_gb:g} GB is out of range; give the size on disk in GB, from 0 "
                          f"(not known) to {MAX_DATASET_GB:,.0f}")
    nodes = _nodes_in_scope(job, catalog)
    return _advise_classical(job, nodes) if job.training is None else _advise_gpu(job, nodes)


def _nodes_in_scope(job: Job, catalog: Catalog) -> list[NodeType]:
    want_gpu = job.training is not None
    if job.node_type_id is None:
        return [node for node in catalog.node_types
                if node.cloud == job.cloud and node.has_gpu == want_gpu and not node.multi_gpu_broken
                and not node.retired]
    node = catalog.find(job.node_type_id)
    if node is None:
        closest = catalog.closest(job.node_type_id, job.cloud)
        hint = f"; did you mean {', '.join(closest)}?" if closest else "; compute/node_types.yaml lists the known ones"
        raise AdviseError(f"node type {job.node_type_id!r} is not in the catalog{hint}")
    if node.cloud != job.cloud:
        raise AdviseError(f"{node.id} is a node type of {node.cloud}, not {job.cloud}: give --cloud {node.cloud}")
    if want_gpu and not node.has_gpu:
        raise AdviseError(f"{node.id} has no GPU; a neural network needs a GPU node type (or --model-type classical)")
    if not want_gpu and node.has_gpu:
        raise AdviseError(f"{node.id} is a GPU node; classical models train with Spark ML on CPU nodes")
    if node.multi_gpu_broken:
        raise AdviseError(f"{node.id}: {node.notes}; pick a single-GPU size of the family or another family")
    if node.retired:
        raise AdviseError(f"{node.id} was retired on {node.retired.date}: use "
                          f"{', '.join(node.retired.replacements)}")
    return [node]


# ---------------------------------------------------------------- GPU jobs

# (what the step is, several nodes?, CPU offload?, which node types take part)
SEARCH_STEPS: tuple[tuple[str, bool, bool, Callable[[NodeType], bool]], ...] = (
    ("one GPU", False, False, lambda node: node.gpus == 1),
    ("one multi-GPU node", False, False, lambda node: node.gpus > 1),
    ("one node with CPU offload", False, True, lambda node: True),
    ("several nodes", True, False, lambda node: node.multi_node != "refuse"),
    ("several nodes with CPU offload", True, True, lambda node: node.multi_node != "refuse"),
)


def _ladder(offload: bool, job: Job) -> list[Sharding]:
    ladder = OFFLOAD_LADDER if offload else ON_GPU_LADDER
    if job.activation_checkpointing:
        return [sharding for sharding in ladder if sharding.checkpointing]
    return list(ladder)


def _fits(training: Training, node: NodeType, nodes: int, sharding: Sharding) -> Estimate | None:
    per_gpu = estimate(training, sharding, node.gpus * nodes)
    host_per_node = per_gpu.host_gb * node.gpus * HEADROOM
    if per_gpu.needed_gb <= node.gpu_memory_gb and host_per_node <= node.memory_gb:
        return per_gpu
    return None


def _fewest_nodes(training: Training, node: NodeType, sharding: Sharding) -> tuple[int, Estimate] | None:
    """The fewest nodes (2 or more) that hold the job: memory per GPU only falls as nodes are added."""
    if _fits(training, node, MAX_NODES, sharding) is None:
        return None
    low, high = 2, MAX_NODES
    while low < high:
        middle = (low + high) // 2
        if _fits(training, node, middle, sharding) is None:
            low = middle + 1
        else:
            high = middle
    return low, _fits(training, node, low, sharding)


def _best_plan(job: Job, nodes: list[NodeType], several: bool, offload: bool) -> Plan | None:
    candidates = []
    for node in nodes:
        for rank, sharding in enumerate(_ladder(offload, job)):
            if not several and node.gpus == 1 and sharding.zero_stage > 0 and not offload:
                continue  # ZeRO without offload shards nothing on one GPU
            if several:
                found = _fewest_nodes(job.training, node, sharding)
            else:
                per_gpu = _fits(job.training, node, 1, sharding)
                found = (1, per_gpu) if per_gpu else None
            if found is None:
                continue
            count, per_gpu = found
            plan = Plan(node, count, _engine(sharding, job.prefer_ray), sharding, per_gpu)
            key = (VERDICT_RANK[node.multi_node], count, plan.gpus, node.gpu_memory_gb, rank, node.memory_gb,
                   node.vcpus, node.id)
            candidates.append((key, plan))
    return min(candidates, key=lambda candidate: candidate[0])[1] if candidates else None


def _engine(sharding: Sharding, prefer_ray: bool) -> str:
    if sharding.needs_deepspeed:
        return DEEPSPEED
    return RAY if prefer_ray else TORCH_DISTRIBUTOR


def _advise_gpu(job: Job, nodes: list[NodeType]) -> Advice:
    baseline = estimate(job.training, Sharding(0, checkpointing=job.activation_checkpointing), 1)
    scope = f"on {job.node_type_id}" if job.node_type_id else f"of {job.cloud}"
    for step, (what, several, offload, takes_part) in enumerate(SEARCH_STEPS):
        plan = _best_plan(job, [node for node in nodes if takes_part(node)], several, offload)
        if plan is None:
            continue
        alternative = None
        if offload and not several:
            alternative = _best_plan(job, [node for node in nodes if node.multi_node != "refuse"], True, False)
        return Advice(job, plan, _why_gpu(step, plan, scope), tuple(_gpu_notes(job, plan, nodes, alternative)),
                      baseline, alternative, _serverless_plan(job))
    why = (f"no setup {scope} holds this job, not even {MAX_NODES} nodes with CPU offload: one GPU would need "
           f"{format_gb(baseline.needed_gb)}. Lower the micro-batch (--batch-size, with gradient accumulation to "
           "keep the effective batch), the sequence length, or use fused attention (--flash-attention)")
    if job.node_type_id and nodes[0].multi_node == "refuse":
        why = (f"{job.node_type_id} cannot hold this job on one node, and multi-node training on it is refused: "
               f"{nodes[0].reason}. Pick a family with accelerated networking (advise without --node-type lists one)")
    return Advice(job, None, why, baseline=baseline, serverless=_serverless_plan(job))


def _serverless_plan(job: Job) -> ServerlessPlan | None:
    """The first serverless GPU setup that holds the job, trying one node of each type, then more 8-GPU nodes."""
    sizes = [(accelerator, accelerator.gpus_per_node) for accelerator in ACCELERATORS.values()]
    largest = max(ACCELERATORS.values(), key=lambda accelerator: accelerator.gpus_per_node)
    sizes += [(largest, largest.gpus_per_node * nodes) for nodes in range(2, MAX_NODES + 1)]
    for accelerator, gpus in sizes:
        for sharding in _ladder(False, job):
            if gpus == 1 and sharding.zero_stage > 0:
                continue  # ZeRO without offload shards nothing on one GPU
            if estimate(job.training, sharding, gpus).needed_gb <= accelerator.gpu_memory_gb:
                return ServerlessPlan(accelerator.name, gpus, DEEPSPEED if sharding.needs_deepspeed
                                      else TORCH_DISTRIBUTOR, sharding)
    return None


def _why_gpu(step: int, plan: Plan, scope: str) -> str:
    per_gpu = f"{format_gb(plan.estimate.needed_gb)} per GPU with headroom"
    if step == 0:
        return (f"It fits on one GPU ({per_gpu}): train on a single machine; no distributed training needed.")
    if step == 1 and not plan.sharding.needs_deepspeed:
        return (f"It fits on each GPU ({per_gpu}); DDP uses the {plan.node.gpus} GPUs of the one node, "
                "still a single machine.")
    if step == 1:
        return (f"No single GPU {scope} holds it; one node with {plan.node.gpus} GPUs does with "
                f"{plan.sharding.describe()} ({per_gpu}): a single machine, no network between nodes.")
    if step == 2:
        return (f"No node {scope} holds it in GPU memory alone; one node does with the "
                f"{plan.sharding.offload.replace('+', ' and ')} in CPU memory ({per_gpu}): slower steps "
                "(PCIe traffic, the optimizer step on the CPU) but a single machine.")
    offload = " and needs CPU offload even then" if step == 4 else ""
    return (f"No single node {scope} holds it, even with CPU offload: {plan.nodes} nodes, "
            f"{plan.sharding.describe()} ({per_gpu}){offload}.")


def _gpu_notes(job: Job, plan: Plan, nodes: list[NodeType], alternative: Plan | None) -> list[str]:
    notes = []
    sharding = plan.sharding
    if job.prefer_ray and plan.engine == DEEPSPEED:
        notes.append("Ray Train was asked for, but the job needs DeepSpeed ZeRO: engine deepspeed.")
    if sharding.checkpointing:
        notes.append("Activation checkpointing recomputes each layer's activations in the backward pass: about a "
                     "third more compute, far less memory.")
    if sharding.offload != "none":
        notes.append("CPU offload runs the optimizer step on the CPU (DeepSpeedCPUAdam) and moves state over PCIe "
                     "every step: expect slower steps than with the state on the GPUs.")
    fsdp2 = _fsdp2(job, plan)
    if fsdp2 is not None:
        notes.append(f"FSDP2 holds it too, in torch alone: engine {_fsdp2_engine(job)} with `train --parallelism "
                     f"fsdp2` shards the weights, gradients and optimizer state over the {plan.gpus} GPUs as ZeRO 3 "
                     f"does: {' + '.join(f'{term.name} {term.formula} = {format_gb(term.gb)}' for term in fsdp2.gpu)}"
                     f"; x {HEADROOM:.2f} headroom = {format_gb(fsdp2.needed_gb)} <= {plan.node.gpu_memory_gb:g} GB "
                     "per GPU.")
    if alternative is not None:
        notes.append(f"Without CPU offload: {alternative.describe()}, {alternative.sharding.describe()}; faster "
                     "steps if the network between nodes is good, but distributed across machines.")
    if plan.nodes > 1:
        notes.append(f"num_workers={plan.num_workers}: the workers train; the driver, one more {plan.node.id} "
                     f"(GPU clusters take a GPU driver), only coordinates: you pay for {plan.nodes + 1} nodes and "
                     f"{plan.node.gpus} of the GPUs sit idle. One node of more GPUs, where one exists, costs less.")
        if plan.node.multi_node == "warn":
            notes.append(f"{plan.node.family}: {plan.node.reason}.")
        if job.cloud == "azure":
            notes.append("Azure NC-series (NCv3) is never used across nodes: low inter-node network performance.")
    notes += _data_notes(job, plan, nodes)
    notes.append(_throughput_note(plan, nodes))
    return notes


def _fsdp2(job: Job, plan: Plan | None) -> Estimate | None:
    """FSDP2's memory per GPU where the plan is DeepSpeed ZeRO on the GPUs alone, if it holds the job there too."""
    if plan is None or plan.engine != DEEPSPEED or plan.sharding.offload != "none":
        return None
    per_gpu = fully_sharded(job.training, plan.sharding.checkpointing, plan.gpus)
    return per_gpu if per_gpu.needed_gb <= plan.node.gpu_memory_gb else None


def _fsdp2_engine(job: Job) -> str:
    return RAY if job.prefer_ray else TORCH_DISTRIBUTOR


def _data_notes(job: Job, plan: Plan, nodes: list[NodeType]) -> list[str]:
    if job.dataset_gb <= 0:
        return []
    share = job.dataset_gb / plan.nodes
    per_node = f", {share:,.1f} GB per node" if plan.nodes > 1 else ""
    dataset = f"The dataset ({job.dataset_gb:,g} GB{per_node})"
    if share <= plan.node.memory_gb * DATA_CACHE_SHARE:
        return [f"{dataset} fits in half of {plan.node.id}'s {plan.node.memory_gb:g} GB of memory: cache it in "
                "memory or on local disk; reading data will not hold training back."]
    roomier = sorted((node for node in nodes if node.family == plan.node.family and node.gpus == plan.node.gpus
                      and node.memory_gb * DATA_CACHE_SHARE >= share), key=lambda node: node.memory_gb)
    cache = f", or {roomier[0].id} ({roomier[0].memory_gb:g} GB) to cache it" if roomier else ""
    return [f"{dataset} is more than half of {plan.node.id}'s {plan.node.memory_gb:g} GB of memory: it streams from "
            "storage every epoch, and data loading may dominate (watch GPU utilization). Large data alone does not "
            f"call for more GPUs: read pre-shuffled shards in parallel (Mosaic Streaming, Petastorm){cache}."]


def _throughput_note(plan: Plan, nodes: list[NodeType]) -> str:
    note = "Training time is not estimated: measure an epoch on this setup first."
    if plan.nodes == 1 and plan.node.gpus == 1:
        family = [node for node in nodes if node.family == plan.node.family and node.gpus > 1]
        if family:
            bigger = min(family, key=lambda node: (node.gpus, node.memory_gb))
            return note + (f" If it is too slow, the next step is {bigger.id} ({bigger.gpus} GPUs) with DDP, "
                           "still one node.")
    if plan.nodes == 1:
        return note + " If it is too slow, a node with more or faster GPUs comes before several nodes."
    return note


# ---------------------------------------------------------------- classical models (Spark ML)

def _advise_classical(job: Job, nodes: list[NodeType]) -> Advice:
    if job.dataset_gb <= 0:
        raise AdviseError("a classical model's advice depends only on the data: give --dataset-gb")
    in_memory = job.dataset_gb * SPARK_EXPANSION
    data = Term("data in memory", f"{job.dataset_gb:g} GB on disk x {SPARK_EXPANSION:g} (rows in memory "
                "against compressed Parquet)", in_memory)
    holds = [node for node in nodes if node.memory_gb * SPARK_USABLE >= in_memory]
    if holds:
        node = min(holds, key=lambda node: (node.memory_gb, node.vcpus, node.id))
        count = 1
        why = "The data fits in one node's memory: train on a single node; Spark ML uses all its cores."
    else:
        node = max(nodes, key=lambda node: (node.memory_gb, node.vcpus))
        count = max(2, math.ceil(in_memory / (node.memory_gb * SPARK_USABLE)))
        why = (f"The data does not fit in one node's memory: ceil({in_memory:,.2f} / "
               f"{node.memory_gb * SPARK_USABLE:,.2f}) = {count} workers of {node.id} hold it.")
    usable = Term("usable per node", f"{node.memory_gb:g} GB x {SPARK_USABLE:g} (Spark's storage and execution "
                  "share)", node.memory_gb * SPARK_USABLE)
    if count > MAX_NODES:
        return Advice(job, None, f"{count} workers of {node.id} would be needed, more than {MAX_NODES}: sample or "
                      "aggregate the data first")
    plan = Plan(node, count, SPARK_ML_CONNECT, data_terms=(data, usable))
    notes = ["Spark ML trains on CPUs (pyspark.ml.connect): no GPU node needed.",
             "Spark spills to disk when memory runs short: a smaller cluster still works, more slowly."]
    return Advice(job, plan, why, tuple(notes))


# ---------------------------------------------------------------- output

def _job_dict(job: Job) -> dict:
    result: dict = {"cloud": job.cloud, "dataset_gb": job.dataset_gb, "node_type_id": job.node_type_id,
                    "prefer_ray": job.prefer_ray}
    if job.training is None:
        return {**result, "model_type": CLASSICAL}
    training, model = job.training, job.training.model
    return {**result, "model_type": model.kind, "model": model.name, "params": model.params, "layers": model.layers,
            "hidden": model.hidden, "heads": model.heads, "vocab": model.vocab, "features": model.features,
            "precision": training.precision, "optimizer": training.optimizer, "batch_size": training.batch_size,
            "seq_len": training.seq_len if model.kind == TRANSFORMER else None,
            "flash_attention": training.flash_attention, "activation_checkpointing": job.activation_checkpointing}


def _terms_dict(terms: tuple[Term, ...]) -> list[dict]:
    return [{"name": term.name, "formula": term.formula, "gb": round(term.gb, 4)} for term in terms]


def _estimate_dict(per_gpu: Estimate | None) -> dict | None:
    if per_gpu is None:
        return None
    return {"gpu": _terms_dict(per_gpu.gpu), "gpu_gb": round(per_gpu.gpu_gb, 4),
            "needed_gb": round(per_gpu.needed_gb, 4), "host_per_gpu": _terms_dict(per_gpu.host),
            "host_gb_per_gpu": round(per_gpu.host_gb, 4)}


def _fsdp2_dict(job: Job, plan: Plan | None) -> dict | None:
    per_gpu = _fsdp2(job, plan)
    if per_gpu is None:
        return None
    return {"engine": _fsdp2_engine(job), "train_options": ["--parallelism", "fsdp2"],
            "memory_per_gpu": _estimate_dict(per_gpu)}


def _plan_dict(plan: Plan | None) -> dict | None:
    if plan is None:
        return None
    sharding = plan.sharding
    return {
        "node_type_id": plan.node.id, "nodes": plan.nodes, "num_workers": plan.num_workers,
        "gpus_per_node": plan.node.gpus, "gpus": plan.gpus, "gpu_model": plan.node.gpu_model,
        "gpu_memory_gb": plan.node.gpu_memory_gb, "node_memory_gb": plan.node.memory_gb, "engine": plan.engine,
        "zero_stage": sharding.zero_stage if sharding else None,
        "offload": sharding.offload if sharding else None,
        "activation_checkpointing": sharding.checkpointing if sharding else None,
        "memory_per_gpu": _estimate_dict(plan.estimate),
        "data": _terms_dict(plan.data_terms) or None,
    }


def _term_lines(terms: tuple[Term, ...]) -> list[str]:
    name_width = max(12, *(len(term.name) for term in terms))
    width = max(len(term.formula) for term in terms)
    return [f"  {term.name:<{name_width}} {term.formula:<{width}}  = {format_gb(term.gb):>12}" for term in terms]


def _estimate_lines(per_gpu: Estimate, capacity: str) -> list[str]:
    lines = _term_lines(per_gpu.gpu)
    lines.append(f"  {'total':<12} {format_gb(per_gpu.gpu_gb)} x {HEADROOM:.2f} headroom (CUDA context, "
                 f"fragmentation) = {format_gb(per_gpu.needed_gb)} {capacity}")
    if per_gpu.host:
        lines.append("  in CPU memory, per GPU:")
        lines += _term_lines(per_gpu.host)
    return lines


def _describe_job(job: Job) -> list[str]:
    if job.training is None:
        return [f"Classical model (Spark ML) on {job.dataset_gb:g} GB of data, cloud {job.cloud}"]
    training, model = job.training, job.training.model
    shape = f"{model.layers} layers, hidden {model.hidden}"
    if model.kind == TRANSFORMER:
        shape += f", {model.heads} heads" + (f", vocab {model.vocab}" if model.vocab else ", vocab not given: "
                                             "logits not counted")
    else:
        shape = f"{model.features} features, " + shape
    name = f"{model.name}: " if model.name else ""
    lines = [f"Model: {name}{model.kind}, {format_count(model.params)} parameters ({shape})"]
    setup = [f"{training.precision}{' mixed precision' if training.mixed_precision else ''}", training.optimizer,
             f"micro-batch {training.batch_size} per GPU"]
    if model.kind == TRANSFORMER:
        setup.append(f"sequence {training.seq_len}")
        setup.append("fused attention" if training.flash_attention else "attention scores stored")
    data = f", dataset {job.dataset_gb:g} GB" if job.dataset_gb else ""
    lines.append(f"Training: {', '.join(setup)}; cloud {job.cloud}{data}")
    return lines


def render(advice: Advice) -> str:
    lines = _describe_job(advice.job)
    plan = advice.plan
    if advice.baseline is not None:
        lines += ["", "Memory on one GPU, nothing sharded (GB = 10^9 bytes):"]
        lines += _estimate_lines(advice.baseline, "needed")
    if plan is None:
        return "\n".join(lines + ["", f"Does not fit: {advice.why}"]) + "\n"
    lines += ["", f"Recommendation: {plan.describe()}"]
    engine = f"  engine: {plan.engine}"
    if plan.sharding is not None:
        processes = "one process on one GPU" if plan.gpus == 1 else "one process per GPU"
        engine += f", {processes}, {plan.sharding.describe()}"
    lines.append(engine)
    if advice.deepspeed_config():
        lines.append(f"  DeepSpeed config: {json.dumps(advice.deepspeed_config())}")
    if plan.estimate is not None:
        capacity = f"<= {plan.node.gpu_memory_gb:g} GB on each {plan.node.gpu_model}"
        if plan.estimate == advice.baseline:
            lines.append(f"  memory per GPU: as above, {format_gb(plan.estimate.needed_gb)} {capacity}")
        else:
            lines += ["", f"Memory per GPU on it ({plan.gpus} GPU{'s' if plan.gpus > 1 else ''}):"]
            lines += _estimate_lines(plan.estimate, capacity)
        if plan.estimate.host:
            host = plan.estimate.host_gb * plan.node.gpus
            lines.append(f"  {'per node':<12} {format_gb(plan.estimate.host_gb)} x {plan.node.gpus} GPUs x "
                         f"{HEADROOM:.2f} headroom = {format_gb(host * HEADROOM)} <= {plan.node.memory_gb:g} GB "
                         "of host memory")
    if plan.data_terms:
        lines += ["", "Data:"] + _term_lines(plan.data_terms)
    lines += ["", f"Why: {advice.why}"]
    if advice.notes:
        lines += ["Notes:"] + [f"  - {note}" for note in advice.notes]
    answers = " ".join(f"{key}={value}" for key, value in advice.template_answers().items())
    lines += ["", f"Template answers: {answers}"]
    lines += _serverless_lines(advice)
    return "\n".join(lines) + "\n"


def _serverless_lines(advice: Advice) -> list[str]:
    if advice.job.training is None:
        return []
    if advice.serverless is None:
        return ["Serverless GPU compute: no accelerator count holds it without CPU offload."]
    plan = advice.serverless
    answers = " ".join(f"{key}={value}" for key, value in plan.template_answers(advice.job.cloud).items())
    nodes = plan.accelerator_count // ACCELERATORS[plan.accelerator_type].gpus_per_node
    return ["", f"Or on serverless GPU compute (AI Runtime, preview; no cluster to size): {plan.accelerator_type}, "
            f"accelerator_count {plan.accelerator_count} ({nodes} node{'s' if nodes > 1 else ''}), engine "
            f"{plan.engine}, {plan.sharding.describe()}", f"  template answers: {answers}"]


# ---------------------------------------------------------------- command line

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"{text!r} must be at most {MAX_SIZE:,}")
    return value


def _size_gb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in GB") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite size in GB")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0 (the dataset's size on disk, in GB)")
    if value > MAX_DATASET_GB:
        raise argparse.ArgumentTypeError(f"{text!r} must be at most {MAX_DATASET_GB:,.0f} GB (an exabyte)")
    return value


def _count(text: str) -> float:
    try:
        return parse_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--model", choices=sorted(NAMED_MODELS), help="a well-known transformer by name")
    model.add_argument("--params", type=_count, help="parameter count: 1.3e9, 1.3B, 350M")
    model.add_argument("--model-type", choices=MODEL_TYPES, default=TRANSFORMER,
                       help="transformer (default); mlp on tabular features; classical: Spark ML on CPU nodes")
    model.add_argument("--layers", type=_positive_int, help="transformer layers, or MLP hidden layers")
    model.add_argument("--hidden", type=_positive_int, help="hidden size (MLP: width of each hidden layer)")
    model.add_argument("--heads", type=_positive_int, help="attention heads (transformer)")
    model.add_argument("--vocab", type=_positive_int, help="vocabulary size; counts the output logits")
    model.add_argument("--features", type=_positive_int, help="input features (mlp)")
    training = parser.add_argument_group("training")
    training.add_argument("--precision", choices=PRECISIONS, default="bf16", help="bf16 or fp16 (mixed), or fp32")
    training.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    training.add_argument("--batch-size", type=_positive_int, default=8, help="micro-batch per GPU (default 8)")
    training.add_argument("--seq-len", type=_positive_int, default=1024, help="sequence length (default 1024)")
    training.add_argument("--flash-attention", action="store_true",
                          help="fused attention (FlashAttention, PyTorch SDPA): attention scores are not stored")
    training.add_argument("--activation-checkpointing", action="store_true",
                          help="the model always checkpoints its activations (otherwise advised only when needed)")
    where = parser.add_argument_group("data and compute")
    where.add_argument("--dataset-gb", type=_size_gb, default=0.0, help="dataset size on disk, GB")
    where.add_argument("--cloud", choices=CLOUDS, required=True)
    where.add_argument("--node-type", help="consider only this node type (from the catalog)")
    where.add_argument("--prefer-ray", action="store_true", help="use Ray Train when no DeepSpeed sharding is needed")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="machine-readable output")
    output.add_argument("--template-answers", action="store_true",
                        help="print only the cookiecutter answers (key=value ...) for the recommendation")


def job_from_args(args: argparse.Namespace) -> Job:
    if args.model_type == CLASSICAL:
        given = [flag for flag, value in (("--model", args.model), ("--params", args.params)) if value is not None]
        if given:
            raise AdviseError(f"{', '.join(given)} describe a neural network; a classical model needs only "
                              "--dataset-gb")
        training = None
    else:
        options = dict(precision=args.precision, optimizer=args.optimizer, batch_size=args.batch_size,
                       seq_len=args.seq_len, flash_attention=args.flash_attention)
        training = Training(_model_from_args(args), **options)
    return Job(cloud=args.cloud, training=training, dataset_gb=args.dataset_gb, node_type_id=args.node_type,
               prefer_ray=args.prefer_ray, activation_checkpointing=args.activation_checkpointing)


def _model_from_args(args: argparse.Namespace) -> ModelShape:
    shape_flags = {"--layers": args.layers, "--hidden": args.hidden, "--heads": args.heads, "--vocab": args.vocab,
                   "--features": args.features}
    if args.model is not None:
        given = [flag for flag, value in {**shape_flags, "--params": args.params}.items() if value is not None]
        if args.model_type != TRANSFORMER:
            raise AdviseError(f"--model {args.model} is a transformer; drop --model-type {args.model_type}")
        if given:
            raise AdviseError(f"--model {args.model} fixes the shape; drop {', '.join(given)} "
                              "(or describe the model with --params and the shape flags alone)")
        return NAMED_MODELS[args.model]
    if args.model_type == TRANSFORMER:
        missing = [flag for flag in ("--params", "--layers", "--hidden", "--heads")
                   if {"--params": args.params, **shape_flags}[flag] is None]
        if missing:
            raise AdviseError(f"a transformer needs --model NAME ({', '.join(sorted(NAMED_MODELS))}) or --params "
                              f"with --layers, --hidden and --heads; missing {', '.join(missing)}")
        if args.features is not None:
            raise AdviseError("--features describes an MLP's input; a transformer's is --seq-len")
        return ModelShape(args.params, TRANSFORMER, args.layers, args.hidden, args.heads, vocab=args.vocab)
    missing = [flag for flag in ("--features", "--layers", "--hidden") if shape_flags[flag] is None]
    if missing:
        raise AdviseError(f"an MLP needs --features, --layers and --hidden; missing {', '.join(missing)}")
    if args.heads is not None or args.vocab is not None or args.activation_checkpointing:
        raise AdviseError("--heads, --vocab and --activation-checkpointing describe transformers; drop them for "
                          "--model-type mlp")
    params = args.params if args.params is not None else mlp_params(args.features, args.hidden, args.layers)
    return ModelShape(params, MLP, args.layers, args.hidden, features=args.features)


def run(args: argparse.Namespace) -> int:
    try:
        advice = advise(job_from_args(args))
    except AdviseError as error:
        print(f"advise: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(advice.to_dict(), indent=2))
    elif args.template_answers:
        if advice.plan is None:
            print(f"advise: does not fit: {advice.why}", file=sys.stderr)
            return 1
        print(" ".join(f"{key}={value}" for key, value in advice.template_answers().items()))
    else:
        print(render(advice), end="")
    return 0 if advice.plan is not None else 1
