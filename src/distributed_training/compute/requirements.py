"""What each training engine needs from its cluster: runtimes, GPUs, Spark scheduling."""

from dataclasses import dataclass

TORCH_DISTRIBUTOR, DEEPSPEED, RAY, SPARK_ML_CONNECT = "torch_distributor", "deepspeed", "ray", "spark_ml_connect"
ENGINES = (TORCH_DISTRIBUTOR, DEEPSPEED, RAY, SPARK_ML_CONNECT)


@dataclass(frozen=True)
class EngineRequirements:
    name: str
    min_ml_runtime: tuple[int, int]  # on a dedicated (single-user) ML runtime
    needs_gpu: bool
    uses_gpu: bool  # trains on GPUs when the node has them
    min_standard_runtime: tuple[int, int] | None = None  # runs on Standard compute from this version
    # spark.task.resource.gpu.amount the engine needs on a multi-node GPU cluster (None: no opinion)
    task_gpu_amount: str | None = None


REQUIREMENTS = {needs.name: needs for needs in (
    EngineRequirements(TORCH_DISTRIBUTOR, (13, 0), needs_gpu=False, uses_gpu=True, task_gpu_amount="1"),
    EngineRequirements(DEEPSPEED, (14, 0), needs_gpu=True, uses_gpu=True, task_gpu_amount="1"),
    EngineRequirements(RAY, (12, 2), needs_gpu=False, uses_gpu=True, task_gpu_amount="0"),
    EngineRequirements(SPARK_ML_CONNECT, (14, 0), needs_gpu=False, uses_gpu=False, min_standard_runtime=(17, 0)),
)}
