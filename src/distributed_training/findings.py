"""A finding: one thing wrong (or worth a warning) in a bundle, a template answer or a cluster, with its fix."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    rule: str  # stable id, e.g. "schema", "dangling-job-cluster-key", "azure-nc-multi-node"
    message: str  # what is wrong, naming the offending value
    fix: str  # what to do about it
    file: str | None = None  # file the finding is in, relative to the bundle root
    path: str | None = None  # path inside the YAML, e.g. resources.jobs.train.tasks[0].job_cluster_key
    severity: str = "error"  # "error" or "warning"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        where = ":".join(part for part in (self.file, self.path) if part)
        return f"{where + ': ' if where else ''}{self.severity} [{self.rule}] {self.message}\n    fix: {self.fix}"
