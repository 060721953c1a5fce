"""The guards read back from a bundle: render a project, edit its job cluster (or its node-type catalog) by hand,
validate.

The same rules as the pre-generation hook (failures/test_bad_answers.py) and the preflight (unit/test_guards.py).
`validate` reads the project's own catalog (src/<package>/compute/node_types.yaml), which its user may edit.
"""

from __future__ import annotations

import pytest
import yaml

from distributed_training.tooling.bundle.validate import validate_bundle

JOB_FILE = "resources/train_torch_distributor.job.yml"
CLUSTER = "resources.jobs.train_torch_distributor.job_clusters[0].new_cluster"


def edit_cluster(project, **changes):
    path = project / JOB_FILE
    document = yaml.safe_load(path.read_text())
    cluster = document["resources"]["jobs"]["train_torch_distributor"]["job_clusters"][0]["new_cluster"]
    for key, value in changes.items():
        if value is None:
            cluster.pop(key, None)
        else:
            cluster[key] = value
    path.write_text(yaml.safe_dump(document, sort_keys=False))


def findings_of(project):
    return [finding for finding in validate_bundle(project, targets=["dev"])["dev"]]


def edit_catalog(project, edit):
    [path] = project.glob("src/*/compute/node_types.yaml")
    document = yaml.safe_load(path.read_text())
    edit(document)
    path.write_text(yaml.safe_dump(document, sort_keys=False))


# The generated single-node form is is_single_node: true; several nodes drop it.
MULTI_NODE = {"num_workers": 2, "spark_conf": {"spark.task.resource.gpu.amount": "1"}, "is_single_node": None}


@pytest.mark.parametrize("edit, rule, leaf", [
    # Microsoft's NCv3 retirement notice: Standard_NC6s_v3 retired on 2025-09-30
    ({"node_type_id": "Standard_NC6s_v3"}, "retired-node-type", "node_type_id"),
    ({"node_type_id": "Standard_NC24rs_v3", **MULTI_NODE}, "retired-node-type", "node_type_id"),
    ({"node_type_id": "Standard_NC64as_T4_v9"}, "unknown-node-type", "node_type_id"),
    ({"use_ml_runtime": None}, "gpu-node-cpu-runtime", "spark_version"),
    ({"node_type_id": "Standard_D8ds_v5", "spark_version": "17.3.x-gpu-ml-scala2.13"}, "gpu-runtime-cpu-node",
     "node_type_id"),
    ({"spark_version": "17.3.x-cpu-ml-scala2.13"}, "gpu-node-cpu-runtime", "spark_version"),
    ({"spark_version": "12.2.x-gpu-ml-scala2.12"}, "runtime-too-old", "spark_version"),
    ({"runtime_engine": "PHOTON"}, "photon-on-gpu", "runtime_engine"),
    ({"data_security_mode": "USER_ISOLATION"}, "ml-on-standard-access", "data_security_mode"),
    ({"data_security_mode": "DATA_SECURITY_MODE_STANDARD"}, "ml-on-standard-access", "data_security_mode"),
    ({**MULTI_NODE, "spark_conf": {}}, "gpu-task-amount", "spark_conf"),
])
def test_hand_edited_cluster_is_refused_with_file_and_path(render, edit, rule, leaf):
    project = render()
    edit_cluster(project, **edit)
    matching = [finding for finding in findings_of(project) if finding.rule == rule]
    assert matching, [str(finding) for finding in findings_of(project)]
    assert (matching[0].file, matching[0].path, matching[0].severity) == (JOB_FILE, f"{CLUSTER}.{leaf}", "error")


def test_hand_edited_cluster_that_follows_the_rules_passes(render):
    project = render()
    edit_cluster(project, node_type_id="Standard_NC64as_T4_v3", **MULTI_NODE)
    assert [str(finding) for finding in findings_of(project) if finding.is_error] == []


def test_a_cpu_driver_beside_gpu_workers_is_a_warning_on_azure(render):
    """Databricks' GPU docs for AWS ask for GPU driver and worker types; Azure's do not say (compute/guards.py)."""
    project = render()
    edit_cluster(project, driver_node_type_id="Standard_D8ds_v5", **MULTI_NODE)
    [finding] = findings_of(project)
    assert (finding.rule, finding.severity, finding.path) == (
        "cpu-driver-gpu-workers", "warning", f"{CLUSTER}.driver_node_type_id")


def test_validate_reads_the_projects_own_catalog(render):
    """A node type the user added to src/<package>/compute/node_types.yaml is known to `validate`, and one they
    mark retired is refused (bundle/validate.py, project_catalog)."""
    project = render()
    edit_cluster(project, node_type_id="Standard_NC8ads_A10_v4")
    assert [finding.rule for finding in findings_of(project)] == ["unknown-node-type"]

    def add_family(document):
        document["families"].append({
            "family": "NC_A10_v4", "cloud": "azure", "gpu_model": "A10", "gpu_memory_gb": 24,
            "network": "accelerated", "multi_node": "allow", "reason": "added by the user", "source": "https://x",
            "node_types": [{"id": "Standard_NC8ads_A10_v4", "gpus": 1, "vcpus": 8, "memory_gb": 110}]})
    edit_catalog(project, add_family)
    assert findings_of(project) == []


def test_multi_node_nc_series_is_refused_by_a_catalog_from_before_the_retirement(render):
    """A project generated before Microsoft retired NCv3 carries a catalog without `retired`: validate then says
    what Databricks' distributed-training docs for Azure say, no multi-node training on NC-series."""
    project = render()
    edit_catalog(project, lambda document: [family.pop("retired", None) for family in document["families"]])
    edit_cluster(project, node_type_id="Standard_NC24s_v3", **MULTI_NODE)
    assert [(finding.rule, finding.file, finding.path) for finding in findings_of(project)] == [
        ("azure-nc-multi-node", JOB_FILE, f"{CLUSTER}.num_workers")]
