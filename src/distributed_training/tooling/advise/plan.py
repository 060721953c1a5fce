"""What `advise` answers with: the job asked about, the plan that holds it (a node type, how many, the engine and
its sharding), the serverless GPU alternative, and the advice as a whole, with its cookiecutter answers and its JSON
form."""

from __future__ import annotations

from dataclasses import dataclass

from ...compute.catalog import NodeType
from ...compute.requirements import DEEPSPEED, RAY, TORCH_DISTRIBUTOR
from ..serverless import SERVERLESS_GPU
from .memory import HEADROOM, LORA, TRANSFORMER, Estimate, Sharding, Term, Training, fully_sharded

CLASSICAL = "classical"
MAX_DATASET_GB = 1e9  # an exabyte


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


def fsdp2_estimate(job: Job, plan: Plan | None) -> Estimate | None:
    """FSDP2's memory per GPU where the plan is DeepSpeed ZeRO on the GPUs alone, if it holds the job there too."""
    if plan is None or plan.engine != DEEPSPEED or plan.sharding.offload != "none":
        return None
    per_gpu = fully_sharded(job.training, plan.sharding.checkpointing, plan.gpus)
    return per_gpu if per_gpu.needed_gb <= plan.node.gpu_memory_gb else None


def fsdp2_engine(job: Job) -> str:
    return RAY if job.prefer_ray else TORCH_DISTRIBUTOR


def _job_dict(job: Job) -> dict:
    result: dict = {"cloud": job.cloud, "dataset_gb": job.dataset_gb, "node_type_id": job.node_type_id,
                    "prefer_ray": job.prefer_ray}
    if job.training is None:
        return {**result, "model_type": CLASSICAL}
    training, model = job.training, job.training.model
    return {**result, "model_type": model.kind, "model": model.name, "params": model.params, "layers": model.layers,
            "hidden": model.hidden, "heads": model.heads, "kv_heads": model.kv_heads,
            "intermediate": model.intermediate, "vocab": model.vocab, "features": model.features,
            "precision": training.precision, "optimizer": training.optimizer, "batch_size": training.batch_size,
            "seq_len": training.seq_len if model.kind == TRANSFORMER else None,
            "flash_attention": training.flash_attention, "activation_checkpointing": job.activation_checkpointing,
            "fine_tune": training.fine_tune, "lora_rank": training.lora_rank if training.fine_tune == LORA else None,
            "adapter_params": training.adapter_params}


def _terms_dict(terms: tuple[Term, ...]) -> list[dict]:
    return [{"name": term.name, "formula": term.formula, "gb": round(term.gb, 4)} for term in terms]


def _estimate_dict(per_gpu: Estimate | None) -> dict | None:
    if per_gpu is None:
        return None
    return {"gpu": _terms_dict(per_gpu.gpu), "gpu_gb": round(per_gpu.gpu_gb, 4),
            "needed_gb": round(per_gpu.needed_gb, 4), "host_per_gpu": _terms_dict(per_gpu.host),
            "host_gb_per_gpu": round(per_gpu.host_gb, 4)}


def _fsdp2_dict(job: Job, plan: Plan | None) -> dict | None:
    per_gpu = fsdp2_estimate(job, plan)
    if per_gpu is None:
        return None
    return {"engine": fsdp2_engine(job), "train_options": ["--parallelism", "fsdp2"],
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
