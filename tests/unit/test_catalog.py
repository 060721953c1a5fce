"""The node-type catalog file: its shape, its sources, and what it says about the GPU families of Databricks' docs."""

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
        gpu, cpu = (catalog.find(catalog.defaults[cloud][kind]) for kind in ("gpu", "cpu"))
        assert (gpu.cloud, cpu.cloud) == (cloud, cloud)
        assert gpu.gpus > 1, "the default is one multi-GPU node"
        assert not cpu.has_gpu


def test_platform_advice_is_in_the_catalog(catalog):
    assert {node.multi_node for node in catalog.family("NCv3")} == {"refuse"}
    assert {node.network for node in catalog.family("NCasT4_v3")} == {"accelerated"}
    assert catalog.find("Standard_NC64as_T4_v3").multi_node == "allow"
    assert catalog.find("Standard_NV72ads_A10_v5").multi_gpu_broken
    assert catalog.find("p5.48xlarge").network == "efa"


def test_closest_names_for_a_typo_and_never_a_retired_type(catalog):
    assert catalog.closest("Standard_NC64as_T4_v4", "azure")[0] == "Standard_NC64as_T4_v3"
    suggested = catalog.closest("Standard_NC24s_v4", "azure") + catalog.closest("Standard_NC24rs_v3")
    assert suggested and not any(catalog.find(name).retired for name in suggested)
    assert "Standard_NC24s_v3" not in suggested and "Standard_NC24rs_v3" not in suggested


def test_ncv3_is_retired_as_microsofts_notice_says(catalog):
    """Microsoft's NCv3 retirement notice (learn.microsoft.com/azure/virtual-machines/sizes/retirement/
    ncv3-nc6s-nc12s-nc24s-retirement): Standard_NC6s_v3, NC12s_v3 and NC24s_v3 retired on 2025-09-30."""
    retired = {node.id: node.retired for node in catalog.family("NCv3")}
    assert set(retired) == {"Standard_NC6s_v3", "Standard_NC12s_v3", "Standard_NC24s_v3"}
    assert {(entry.date, entry.source) for entry in retired.values()} == {
        ("2025-09-30", "https://learn.microsoft.com/azure/virtual-machines/sizes/retirement/"
                       "ncv3-nc6s-nc12s-nc24s-retirement")}


def test_nc24rs_v3_has_infiniband_is_refused_multi_node_and_is_retired(catalog):
    """Standard_NC24rs_v3 is not on the NCv3 notice: it has InfiniBand (Microsoft's NCv3-series page) and its own
    retirement (2025-03-31, the catalog's source). InfiniBand does not lift the NC-series refusal (Databricks'
    distributed-training docs for Azure)."""
    node = catalog.find("Standard_NC24rs_v3")
    assert (node.family, node.network, node.multi_node, node.gpus) == ("NCv3_RDMA", "infiniband", "refuse", 4)
    assert node.retired is not None and node.retired.date == "2025-03-31"
    assert node.retired.source.startswith("https://learn.microsoft.com/")


def test_every_retirement_names_current_replacements_of_its_cloud_with_gpus(catalog):
    retired = [node for node in catalog.node_types if node.retired]
    assert retired, "the catalog records retirements"
    for node in retired:
        assert node.retired.replacements, node.id
        assert node.retired.source.startswith("https://"), node.id
        for replacement in map(catalog.find, node.retired.replacements):
            assert replacement is not None and not replacement.retired, node.id
            assert replacement.cloud == node.cloud and replacement.has_gpu, node.id


def test_no_default_is_retired(catalog):
    for cloud in ("azure", "aws", "gcp"):
        for kind in ("gpu", "cpu"):
            assert not catalog.find(catalog.defaults[cloud][kind]).retired


def _ncv3(document):
    return next(family for family in document["families"] if family["family"] == "NCv3")


@pytest.mark.parametrize("edit, message", [
    (lambda doc: doc["families"][0].pop("source"), "lacks source"),
    (lambda doc: doc["families"][0].update(multi_node="maybe"), "multi_node 'maybe'"),
    (lambda doc: doc["families"][1]["node_types"].append(dict(doc["families"][1]["node_types"][0])), "listed twice"),
    (lambda doc: doc["defaults"]["aws"].update(gpu="m5d.xlarge"), "defaults.aws.gpu"),
    (lambda doc: _ncv3(doc)["retired"].pop("replacements"), "retired without replacements"),
    (lambda doc: _ncv3(doc)["retired"].update(replacements=[]), "retired without replacements"),
    (lambda doc: _ncv3(doc).update(retired=True), "retired without date, source, replacements"),
    (lambda doc: _ncv3(doc)["retired"].pop("source"), "retired without source"),
    (lambda doc: _ncv3(doc)["retired"].update(replacements=["Standard_NC6s_v4"]),
     "names 'Standard_NC6s_v4' as a replacement"),
    (lambda doc: _ncv3(doc)["retired"].update(replacements=["Standard_NC24rs_v3"]),
     "names 'Standard_NC24rs_v3' as a replacement"),  # itself retired
])
def test_a_malformed_catalog_is_refused_with_the_entry_named(tmp_path, edit, message):
    document = yaml.safe_load(CATALOG_FILE.read_text())
    edit(document)
    path = tmp_path / "node_types.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(CatalogError, match=message):
        load_catalog(path)
