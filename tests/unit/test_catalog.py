"""The node-type catalog file: its shape, its sources, and what it says about the families FACTS.md lists."""

import pytest
import yaml

from distributed_training.compute.catalog import CATALOG_FILE, CatalogError, load_catalog


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_every_node_type_has_a_source_and_consistent_hardware(catalog):
    for node in catalog.node_types:
        assert node.source.startswith("https://"), node.id
        assert node.vcpus > 0 and node.memory_gb > 0, node.id
        assert (node.gpu_model is None) == (node.gpus == 0), node.id
        assert (node.gpu_memory_gb > 0) == node.has_gpu, node.id
        assert node.reason, node.id


def test_every_cloud_has_gpu_and_cpu_defaults_of_its_own(catalog):
    for cloud in ("azure", "aws", "gcp"):
        gpu, cpu = catalog.default_node_type(cloud, gpu=True), catalog.default_node_type(cloud, gpu=False)
        assert (gpu.cloud, cpu.cloud) == (cloud, cloud)
        assert gpu.gpus > 1, "the default is one multi-GPU node"
        assert not cpu.has_gpu


def test_platform_advice_is_in_the_catalog(catalog):
    assert {node.multi_node for node in catalog.family("NCv3")} == {"refuse"}
    assert {node.network for node in catalog.family("NCasT4_v3")} == {"accelerated"}
    assert catalog.find("Standard_NC64as_T4_v3").multi_node == "allow"
    assert catalog.find("Standard_NV72ads_A10_v5").multi_gpu_broken
    assert catalog.find("p5.48xlarge").network == "efa"


def test_closest_names_for_a_typo(catalog):
    assert catalog.closest("Standard_NC24s_v4", "azure")[0] == "Standard_NC24s_v3"


@pytest.mark.parametrize("edit, message", [
    (lambda doc: doc["families"][0].pop("source"), "lacks source"),
    (lambda doc: doc["families"][0].update(multi_node="maybe"), "multi_node 'maybe'"),
    (lambda doc: doc["families"][1]["node_types"].append(dict(doc["families"][1]["node_types"][0])), "listed twice"),
    (lambda doc: doc["defaults"]["aws"].update(gpu="m5d.xlarge"), "defaults.aws.gpu"),
])
def test_a_malformed_catalog_is_refused_with_the_entry_named(tmp_path, edit, message):
    document = yaml.safe_load(CATALOG_FILE.read_text())
    edit(document)
    path = tmp_path / "node_types.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(CatalogError, match=message):
        load_catalog(path)
