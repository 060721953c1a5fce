"""The advice as text: the job, the memory arithmetic, the recommendation and why, the template's answers."""

from __future__ import annotations

import json

from ..serverless import ACCELERATORS
from .memory import (FULL, HEADROOM, LORA, TRANSFORMER, Estimate, Term, adapter_formula, format_count,
                     format_gb)
from .plan import Advice, Job


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


def _describe_job(job: Job) -> list[str]:
    if job.training is None:
        return [f"Classical model (Spark ML) on {job.dataset_gb:g} GB of data, cloud {job.cloud}"]
    training, model = job.training, job.training.model
    shape = f"{model.layers} layers, hidden {model.hidden}"
    if model.kind == TRANSFORMER:
        shape += f", {model.heads} heads"
        if model.kv_heads:
            shape += f", {model.kv_heads} KV heads"
        if model.intermediate:
            shape += f", MLP {model.intermediate}"
        shape += f", vocab {model.vocab}" if model.vocab else ", vocab not given: logits not counted"
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
    if training.fine_tune == FULL:
        lines.append("Fine-tuning in full: every weight of the pretrained model trains, as from scratch")
    elif training.fine_tune == LORA:
        adapter = training.adapter_params
        lines.append(f"Fine-tuning with LoRA, the base frozen: rank {training.lora_rank} adapters on q, k, v, o, "
                     "gate, up and down of each layer")
        lines.append(f"  adapter parameters: {adapter_formula(model, training.lora_rank)} = {adapter:,} "
                     f"({adapter / model.params:.2%} of the base)")
    return lines


def _estimate_lines(per_gpu: Estimate, capacity: str) -> list[str]:
    lines = _term_lines(per_gpu.gpu)
    lines.append(f"  {'total':<12} {format_gb(per_gpu.gpu_gb)} x {HEADROOM:.2f} headroom (CUDA context, "
                 f"fragmentation) = {format_gb(per_gpu.needed_gb)} {capacity}")
    if per_gpu.host:
        lines.append("  in CPU memory, per GPU:")
        lines += _term_lines(per_gpu.host)
    return lines


def _term_lines(terms: tuple[Term, ...]) -> list[str]:
    name_width = max(12, *(len(term.name) for term in terms))
    width = max(len(term.formula) for term in terms)
    return [f"  {term.name:<{name_width}} {term.formula:<{width}}  = {format_gb(term.gb):>12}" for term in terms]


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
