"""Cluster files: the shipped ones load; each kind of mistake names its key."""

from __future__ import annotations

import copy

import pytest
import yaml

from dasktune.cluster import ClusterConfigError, load_cluster_config, parse_cluster_config
from dasktune.cluster.aws import ec2_cluster_kwargs
from dasktune.cluster.gcp import gcp_cluster_kwargs


def _aws() -> dict:
    with open("cluster/aws-spot.yaml") as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize("name", ["local", "aws-spot", "aws-gpu-spot", "gcp-preemptible"])
def test_shipped_files_load(name):
    config = load_cluster_config(f"cluster/{name}.yaml")
    assert config.worker_type_name == "worker_nodes"


def _err(data: dict) -> str:
    with pytest.raises(ClusterConfigError) as e:
        parse_cluster_config(data, source="c.yaml")
    return str(e.value)


def test_unknown_key_named_with_its_path():
    data = _aws()
    data["available_node_types"]["worker_nodes"]["node_config"]["InstanceTyp"] = "m5.large"
    msg = _err(data)
    assert "available_node_types.worker_nodes.node_config.InstanceTyp: unknown key" in msg


def test_missing_field_named_with_its_path():
    data = _aws()
    del data["available_node_types"]["worker_nodes"]["node_config"]["InstanceType"]
    msg = _err(data)
    assert msg == ("c.yaml: available_node_types.worker_nodes.node_config.InstanceType: "
                   "missing required key")


def test_wrong_type_named_with_its_path():
    data = _aws()
    data["min_workers"] = "three"
    assert _err(data).startswith("c.yaml: min_workers: Input should be a valid integer")
    data = _aws()
    data["available_node_types"]["worker_nodes"]["node_config"]["InstanceMarketOptions"][
        "SpotOptions"]["MaxPrice"] = "cheap"
    assert ("available_node_types.worker_nodes.node_config.InstanceMarketOptions.SpotOptions."
            "MaxPrice: Input should be a valid number") in _err(data)


@pytest.mark.parametrize("change, expected", [
    (lambda d: d.update(head_node_type="nope"), "head_node_type: 'nope' is not one of"),
    (lambda d: d.update(max_workers=1), "max_workers: Value error, must be >= min_workers"),
    (lambda d: d["provider"].update(type="azure"), "provider.type: Input should be"),
    (lambda d: d["provider"].pop("region"), "provider.region: required for aws"),
    (lambda d: d["available_node_types"]["head_node"]["node_config"].pop("SecurityGroupIds"),
     "available_node_types.head_node.node_config.SecurityGroupIds: required for aws"),
    (lambda d: d["available_node_types"]["head_node"]["node_config"].update(ImageId="ubuntu"),
     "available_node_types.head_node.node_config.ImageId: String should match"),
    (lambda d: d.pop("cluster_name"), "cluster_name: missing required key"),
])
def test_each_mistake_has_its_own_message(change, expected):
    data = copy.deepcopy(_aws())
    change(data)
    assert expected in _err(data)


def test_not_a_mapping_and_bad_yaml(tmp_path):
    assert "expected a mapping" in _err([1, 2])  # type: ignore[arg-type]
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(ClusterConfigError, match="not valid YAML"):
        load_cluster_config(bad)
    with pytest.raises(ClusterConfigError, match="no such file"):
        load_cluster_config(tmp_path / "missing.yaml")


def test_aws_translation_avoids_the_known_traps():
    kw = ec2_cluster_kwargs(load_cluster_config("cluster/aws-gpu-spot.yaml"), "g")
    assert kw["spot"] is True and kw["max_price"] == 0.6
    assert kw["ami"].startswith("ami-") and kw["security_groups"]  # no lookup, no group create
    assert kw["worker_instance_type"] == "g4dn.xlarge"
    assert kw["scheduler_instance_type"] == "m5.large"
    assert kw["instance_tags"] == {"dasktune-cluster": "g"}
    assert kw["extra_bootstrap"] == ["pip install dasktune torch"]
    assert all(not isinstance(v, list) for v in kw["scheduler_options"].values())
    assert kw["worker_options"] == {"resources": {"CPU": 4, "GPU": 1}}


def test_gcp_translation():
    kw = gcp_cluster_kwargs(load_cluster_config("cluster/gcp-preemptible.yaml"), "p")
    assert kw["preemptible"] is True and kw["head_preemptible"] is False
    assert (kw["worker_ngpus"], kw["worker_gpu_type"]) == (1, "nvidia-tesla-t4")
    assert kw["filesystem_size"] == 50 and kw["worker_machine_type"] == "n1-standard-4"


def test_aws_different_amis_refused():
    data = _aws()
    data["available_node_types"]["head_node"]["node_config"]["ImageId"] = "ami-1"
    with pytest.raises(ValueError, match="same ImageId"):
        ec2_cluster_kwargs(parse_cluster_config(data), "x")


def test_setup_commands_run_on_the_head_in_order_and_a_failing_one_raises(tmp_path):
    import subprocess

    from dasktune.cluster import get_provider

    log = tmp_path / "setup.log"
    base = load_cluster_config("cluster/local.yaml")
    config = base.model_copy(update={"setup_commands": [f"echo one >> {log}",
                                                        f"echo two >> {log}"]})
    said: list[str] = []
    get_provider(config, "setup-test").run_setup_commands(said.append)
    assert log.read_text().split() == ["one", "two"]
    assert said == [f"setup: echo one >> {log}", f"setup: echo two >> {log}"]
    config = base.model_copy(update={"setup_commands": ["exit 3", f"echo never >> {log}"]})
    with pytest.raises(subprocess.CalledProcessError):
        get_provider(config, "setup-test").run_setup_commands()
    assert "never" not in log.read_text()
