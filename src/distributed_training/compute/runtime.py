"""Databricks Runtime versions (`spark_version`, e.g. `17.3.x-gpu-ml-scala2.13`), and the ones the project uses."""

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import yaml

VERSIONS_FILE = Path(__file__).with_name("versions.yaml")

_SPARK_VERSION = re.compile(r"^(?P<major>\d+)\.(?P<minor>\d+)\.x"
                            r"(?P<flavour>(-cpu-ml|-gpu-ml|-ml|-photon|-aarch64-photon|-aarch64)?)"
                            r"-scala(?P<scala>\d+\.\d+)$")


@dataclass(frozen=True)
class Runtime:
    spark_version: str
    major: int
    minor: int
    ml: bool
    gpu: bool
    photon: bool

    @property
    def version(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def label(self) -> str:
        return f"{self.major}.{self.minor} {'GPU ML' if self.gpu else 'ML' if self.ml else 'standard'}"


def parse_runtime(spark_version: str) -> Runtime | None:
    match = _SPARK_VERSION.match(spark_version.strip())
    if not match:
        return None
    return Runtime(spark_version=spark_version, major=int(match["major"]), minor=int(match["minor"]),
                   ml="ml" in match["flavour"], gpu="gpu" in match["flavour"], photon="photon" in match["flavour"])


def effective(runtime: Runtime, use_ml_runtime: bool, gpu_node: bool) -> Runtime:
    """What a cluster runs: `use_ml_runtime: true` has Databricks add ML (GPU ML on GPU nodes) to a plain key."""
    return runtime if not use_ml_runtime or runtime.ml else replace(runtime, ml=True, gpu=gpu_node)


@lru_cache(maxsize=1)
def versions() -> dict:
    return yaml.safe_load(VERSIONS_FILE.read_text())


def version_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"
