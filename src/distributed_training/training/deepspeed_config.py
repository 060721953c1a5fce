"""The DeepSpeed config of a run, from its options and a config to start from (e.g. `advise --json`), without torch or
DeepSpeed. It names no optimizer or schedule: the loop's own go to `deepspeed.initialize`."""

from ..config import Config

STEPS_PER_PRINT = 10 ** 9  # the loop prints its own progress once an epoch; DeepSpeed's step lines only add noise
LOOP_OWNED = ("optimizer", "scheduler", "bf16", "fp16", "gradient_clipping", "train_batch_size",
              "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def deepspeed_config(config: Config, world_size: int, precision: str) -> dict:
    """ZeRO stage and offload from the options, else from config.deepspeed_config, else ZeRO 2 without offload."""
    base = {name: value for name, value in (config.deepspeed_config or {}).items() if name not in LOOP_OWNED}
    zero = dict(base.pop("zero_optimization", {}))
    zero["stage"] = config.zero_stage if config.zero_stage is not None else zero.get("stage", 2)
    if config.offload is not None:
        zero.pop("offload_optimizer", None)
        zero.pop("offload_param", None)
        if config.offload != "none":
            zero["offload_optimizer"] = {"device": "cpu"}
        if config.offload == "optimizer+weights":
            zero["offload_param"] = {"device": "cpu"}
    generated = {
        **base, "train_micro_batch_size_per_gpu": config.batch_size,
        "gradient_accumulation_steps": config.grad_accumulation,
        "train_batch_size": config.batch_size * config.grad_accumulation * world_size,
        "gradient_clipping": config.grad_clip, "zero_optimization": zero,
        # The loop's AdamW is torch's: DeepSpeed's own CPU Adam would be compiled on first use (a compiler and the
        # CUDA toolkit on every node); these two let ZeRO and its offload take torch's optimizer.
        "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": STEPS_PER_PRINT,
    }
    if precision != "fp32":
        generated[precision] = {"enabled": True}
    return generated


def overridden(config: Config) -> list[str]:
    """The keys of the given DeepSpeed config that the loop's options decide instead."""
    return sorted(name for name in LOOP_OWNED if name in (config.deepspeed_config or {}))


def offload_of(zero: dict) -> str:
    parts = [name for key, name in (("offload_optimizer", "optimizer"), ("offload_param", "weights"))
             if zero.get(key, {}).get("device", "none") != "none"]
    return "+".join(parts) or "none"
