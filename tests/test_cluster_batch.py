"""Batch-system cluster files: the job scripts dask-jobqueue generates from them, and how a
worker reads its job's end time from each batch system's tool."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from dasktune.cluster import ClusterConfigError, load_cluster_config, parse_cluster_config
from dasktune.cluster.walltime import (
    batch_job,
    parse_duration,
    parse_lsf,
    parse_pbs,
    parse_sge,
    parse_slurm_end,
)

pytest.importorskip("dask_jobqueue")

from dasktune.cluster.batch import job_script  # noqa: E402 - needs dask_jobqueue


def _config(kind: str, **node: object) -> dict:
    with open("cluster/slurm.yaml") as f:
        data = yaml.safe_load(f)
    data["provider"] = {"type": kind, "partition": "gpuq", "account": "proj7"}
    data["available_node_types"]["worker_nodes"]["node_config"].update(
        {"cores": 8, "memory": "16GB", "processes": 2, "walltime": "02:00:00", "gpus": 4,
         "job_extra_directives": ["--x-extra"], "job_script_prologue": ["module load cuda"],
         **node})
    return data


def test_shipped_slurm_file_loads():
    config = load_cluster_config("cluster/slurm.yaml")
    assert config.provider.type == "slurm" and config.worker_type_name == "worker_nodes"


def test_slurm_job_script():
    script = job_script(parse_cluster_config(_config("slurm")), "exp")
    for line in ("#SBATCH -J exp", "#SBATCH -p gpuq", "#SBATCH -A proj7",
                 "#SBATCH -t 02:00:00", "#SBATCH --gres=gpu:4", "#SBATCH --x-extra",
                 "module load cuda"):
        assert line in script, (line, script)
    # Two workers per job, each advertising half the job's cores, GPUs and memory.
    assert "--nworkers 2" in script and "--nthreads 4" in script
    assert "--resources CPU=4,GPU=2,memory=8000000000" in script


@pytest.mark.parametrize("kind,queue,account,gpu", [
    ("pbs", "#PBS -q gpuq", "#PBS -A proj7", None),
    ("sge", "#$ -q gpuq", "#$ -P proj7", None),
    ("lsf", "#BSUB -q gpuq", '#BSUB -P "proj7"', '#BSUB -gpu "num=4"'),
])
def test_other_batch_systems_same_file_shape(kind, queue, account, gpu):
    walltime = "02:00" if kind == "lsf" else "02:00:00"
    script = job_script(parse_cluster_config(_config(kind, walltime=walltime,
                                                     job_extra_directives=[])), "exp")
    assert queue in script and account in script, script
    assert walltime in script
    if gpu:
        assert gpu in script
    assert "--resources CPU=4,GPU=2,memory=8000000000" in script
    assert "module load cuda" in script


def test_processes_must_divide_cores():
    with pytest.raises(ClusterConfigError, match="processes: .*must divide cores"):
        parse_cluster_config(_config("slurm", cores=3, processes=2))


def test_unknown_node_key_is_named():
    with pytest.raises(ClusterConfigError, match="node_config.gpu: unknown key"):
        parse_cluster_config(_config("slurm", gpu=1))


def test_batch_job_from_environment():
    assert batch_job({"SLURM_JOB_ID": "42"}) == ("slurm", "42")
    assert batch_job({"PBS_JOBID": "7.server"}) == ("pbs", "7.server")
    assert batch_job({"LSB_JOBID": "9"}) == ("lsf", "9")
    assert batch_job({"JOB_ID": "5", "SGE_ROOT": "/opt/sge"}) == ("sge", "5")
    assert batch_job({"JOB_ID": "5"}) is None  # JOB_ID alone is no SGE job
    assert batch_job({}) is None


def test_end_time_parsers():
    local = dt.datetime(2026, 12, 6, 10, 18, 34).timestamp()
    assert parse_slurm_end("2026-12-06T10:18:34\n") == local
    assert parse_slurm_end("N/A") is None
    assert parse_duration("1-02:00:00") == 93600 and parse_duration("10:05") == 605
    pbs = ("Job Id: 7.server\n    Resource_List.walltime = 01:00:00\n"
           "    resources_used.walltime = 00:10:00\n")
    assert parse_pbs(pbs, now=1000.0) == 1000.0 + 3000
    sge = ("job_number: 5\nhard resource_list:         h_rt=3600,h_vmem=2G\n"
           "start_time            1:    12/06/2026 10:18:34.123\n")
    assert parse_sge(sge) == local + 3600
    # Son of Grid Engine (Debian's gridengine) has no start_time in plain qstat -j: its
    # XML (trimmed from a real `qstat -j 5 -xml`), in seconds, or milliseconds elsewhere.
    xml = ("<?xml version='1.0'?>\n<detailed_job_info>\n  <djob_info>\n    <element>\n"
           "      <JB_job_number>5</JB_job_number>\n      <JB_hard_resource_list>\n"
           "        <qstat_l_requests>\n          <CE_name>h_rt</CE_name>\n"
           "          <CE_valtype>3</CE_valtype>\n          <CE_stringval>100</CE_stringval>\n"
           "        </qstat_l_requests>\n      </JB_hard_resource_list>\n"
           "      <JB_ja_tasks>\n        <ulong_sublist>\n"
           "          <JAT_start_time>1796564696</JAT_start_time>\n")
    assert parse_sge(xml) == 1796564696 + 100
    assert parse_sge(xml.replace("1796564696<", "1796564696000<")) == 1796564696 + 100
    assert parse_sge(xml.replace(">100<", ">00:01:40<")) == 1796564696 + 100
    assert parse_sge(xml.replace("JAT_start_time", "JAT_other")) is None  # still queued
    assert parse_lsf("1:05 L\n", now=0.0) == 3900 and parse_lsf("-\n", now=0.0) is None
