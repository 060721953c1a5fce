"""`advise`: single node or several, which engine, which node type and how many, from model and data size.

The platform's advice is the order in which setups are tried; the first step that holds the job wins:
1. one GPU (a single-GPU node type): no distributed training at all;
2. one node with several GPUs, sharding the training state with DeepSpeed ZeRO when plain DDP does not fit;
3. one node with the optimizer states (and weights) offloaded to CPU memory: slow, but no network between nodes;
4. several nodes, only of families whose catalog verdict on multi-node training is allow or warn (never Azure
   NC-series, whose verdict is refuse);
5. several nodes with CPU offload.
Within a step the simplest technique that fits is taken: DDP, DDP with activation checkpointing, ZeRO 1, 2, 3,
then ZeRO with checkpointing (offload: ZeRO 2 then 3 with the optimizer, then ZeRO 3 with the weights too).
Fine-tuning a pretrained model (in full or with LoRA) runs under DDP, FSDP2 or ZeRO 3, so its ladder holds no
ZeRO 1 or 2 (under LoRA they would shard only the small adapter's state: the frozen base is sharded at stage 3). Among
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
the next step up would be when a measured epoch is too slow."""

from __future__ import annotations

import math
from typing import Callable

from ...compute.catalog import CLOUDS, Catalog, NodeType, default_catalog
from ...compute.requirements import DEEPSPEED, RAY, SPARK_ML_CONNECT, TORCH_DISTRIBUTOR
from ..serverless import ACCELERATORS
from .memory import FULL, HEADROOM, LORA, Estimate, Sharding, Term, Training, estimate, format_gb
from .plan import MAX_DATASET_GB, Advice, AdviseError, Job, Plan, ServerlessPlan, fsdp2_engine, fsdp2_estimate

MAX_NODES = 256  # the template accepts up to 256 workers
VERDICT_RANK = {"allow": 0, "warn": 1, "refuse": 2}
DATA_CACHE_SHARE = 0.5  # a dataset up to half of a node's memory can be cached there next to everything else
SPARK_EXPANSION = 2.0  # rows held in memory against compressed Parquet on disk (an assumption: measure with cache())
SPARK_USABLE = 0.5  # share of a node's memory that Spark gives to cached data and execution

ON_GPU_LADDER = (
    Sharding(0), Sharding(0, checkpointing=True), Sharding(1), Sharding(2), Sharding(3),
    Sharding(1, checkpointing=True), Sharding(2, checkpointing=True), Sharding(3, checkpointing=True),
)
OFFLOAD_LADDER = tuple(
    Sharding(stage, offload, checkpointing)
    for stage, offload in ((2, "optimizer"), (3, "optimizer"), (3, "optimizer+weights"))
    for checkpointing in (False, True)
)


def advise(job: Job, catalog: Catalog | None = None) -> Advice:
    catalog = catalog or default_catalog()
    if job.cloud not in CLOUDS:
        raise AdviseError(f"cloud {job.cloud!r} is not one of {', '.join(CLOUDS)}")
    if not 0 <= job.dataset_gb <= MAX_DATASET_GB:
        raise AdviseError(f"dataset size {job.dataset_gb:g} GB is out of range; give the size on disk in GB, from 0 "
                          f"(not known) to {MAX_DATASET_GB:,.0f}")
    if job.training is not None and job.training.fine_tune == LORA:
        _check_lora_targets(job.training)
    nodes = _nodes_in_scope(job, catalog)
    return _advise_classical(job, nodes) if job.training is None else _advise_gpu(job, nodes)


def _check_lora_targets(training: Training) -> None:
    model = training.model
    if model.name is not None and model.intermediate is None:
        raise AdviseError(f"{model.name} is not Llama-shaped (no gated MLP), and LoRA's adapters are counted on q, k, "
                          "v, o, gate, up and down: use --fine-tune full or a llama model")
    if model.intermediate is None:
        raise AdviseError("LoRA's adapters are counted on the q, k, v, o, gate, up and down projections of a "
                          "Llama-shaped model: give its MLP width with --intermediate (and --kv-heads if it groups "
                          "its queries)")


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
FINE_TUNING_STAGES = (0, 3)  # DDP, ZeRO 3 (and FSDP2 where ZeRO 3 fits on the GPUs)


def _ladder(offload: bool, job: Job) -> list[Sharding]:
    ladder = OFFLOAD_LADDER if offload else ON_GPU_LADDER
    return [sharding for sharding in ladder
            if (sharding.checkpointing or not job.activation_checkpointing)
            and (sharding.zero_stage in FINE_TUNING_STAGES or job.training.fine_tune is None)]


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
    if job.training.fine_tune == FULL:
        why += ", or fine-tune with LoRA (--fine-tune lora)"
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
    fsdp2 = fsdp2_estimate(job, plan)
    if fsdp2 is not None:
        notes.append(f"FSDP2 holds it too, in torch alone: engine {fsdp2_engine(job)} with `train --parallelism "
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
