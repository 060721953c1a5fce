"""Databricks Runtime versions (`spark_version` strings such as `17.3.x-gpu-ml-scala2.13`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SPARK_VERSION = re.compile(
    r"^(?P<major>\d+)\.(?P<minor>\d+)\.x"
    r"(?P<flavour>(-cpu-ml|-gpu-ml|-ml|-photon|-aarch64-photon|-aarch64)?)"
    r"-scala(?P<scala>\d+\.\d+)$"
)


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
        kind = "GPU ML" if self.gpu else "ML" if self.ml else "standard"
        return f"{self.major}.{self.minor} {kind}"


def parse_runtime(spark_version: str) -> Runtime | None:
    """The runtime a `spark_version` names, or None when it is not a Databricks Runtime version string."""
    match = _SPARK_VERSION.match(spark_version.strip())
    if not match:
        return None
    flavour = match["flavour"]
    return Runtime(
        spark_version=spark_version,
        major=int(match["major"]),
        minor=int(match["minor"]),
        ml="ml" in flavour,
        gpu="gpu" in flavour,
        photon="photon" in flavour,
    )


def version_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"
