"""The guards read back from a bundle: render a project, edit its job cluster by hand, validate.

The same rules as the pre-generation hook (test_render.py) and the preflight (unit/test_preflight.py).
"""

from __future__ import annotations

import pytest
import yaml

from distributed_training.bundle.validate import validate_bundle

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


MULTI_NODE = {"num_workers": 2, "spark_conf": {"spark.task.resource.gpu.amount": "1"}, "custom_tags": None}


@pytest.mark.parametrize("edit, rule, leaf", [
    ({"node_type_id": "Standard_NC24s_v3", **MULTI_NODE}, "azure-nc-multi-node", "num_workers"),
    ({"node_type_id": "Standard_NC64as_T4_v9"}, "unknown-node-type", "node_type_id"),
    ({"spark_version": "17.3.x-cpu-ml-scala2.13"}, "gpu-node-cpu-runtime", "spark_version"),
    ({"spark_version": "12.2.x-gpu-ml-scala2.12"}, "runtime-too-old", "spark_version"),
    ({"runtime_engine": "PHOTON"}, "photon-on-gpu", "runtime_engine"),
    ({"data_security_mode": "USER_ISOLATION"}, "ml-on-standard-access", "data_security_mode"),
    ({"node_type_id": "Standard_NC64as_T4_v3", "num_workers": 2, "spark_conf": {}, "custom_tags": None},
     "gpu-task-amount", "spark_conf"),
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
