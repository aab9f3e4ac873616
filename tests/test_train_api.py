"""``dasktune.train``'s public surface without a cluster: Ray Train V2's names and
defaults, clear errors for bad input, the staged checkpoint commit, and how a rank
batches its reports."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from dasktune import train
from dasktune.integration.ray_train import TuneReportCallback
from dasktune.storage import ExperimentStorage
from dasktune.train.context import RankInfo, RankSession
from dasktune.train.torch import TorchConfig, TorchTrainer


def test_scaling_config_bundles_follow_rays_convention():
    sc = train.ScalingConfig(num_workers=3)
    pgf = sc.as_placement_group_factory()
    assert pgf.bundles == [{"CPU": 0.0}, {"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}]
    assert pgf.strategy == "PACK" and pgf.head_bundle_is_empty
    assert sc.worker_bundles() == [{"CPU": 1.0}] * 3
    gpu = train.ScalingConfig(num_workers=2, use_gpu=True, placement_strategy="SPREAD")
    assert gpu.worker_bundles() == [{"GPU": 1.0}] * 2 and gpu.uses_gpu
    assert gpu.as_placement_group_factory().strategy == "SPREAD"
    custom = train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 2, "GPU": 1},
                                 trainer_resources={"CPU": 1})
    assert custom.total_resources == {"CPU": 5.0, "GPU": 2.0}


@pytest.mark.parametrize("kwargs, match", [
    ({"num_workers": 0}, "num_workers must be an int >= 1"),
    ({"num_workers": (1, 4)}, "elastic"),
    ({"num_workers": 2, "placement_strategy": "RANDOM"}, "placement_strategy"),
    ({"num_workers": 2, "resources_per_worker": {"CPU": -1}}, "finite number >= 0"),
    ({"num_workers": 2, "use_gpu": True, "resources_per_worker": {"CPU": 1}}, "asks for no GPU"),
])
def test_scaling_config_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        train.ScalingConfig(**kwargs)


def test_trainer_rejects_what_it_cannot_do_before_any_work():
    def loop(config):
        pass

    with pytest.raises(ValueError, match="datasets"):
        TorchTrainer(loop, datasets={"train": object()})
    with pytest.raises(TypeError, match="scaling_config"):
        TorchTrainer(loop, scaling_config={"num_workers": 2})
    with pytest.raises(TypeError, match="unexpected keyword"):
        TorchTrainer(loop, scaling=2)
    with pytest.raises(TypeError, match="function"):
        TorchTrainer("loop")
    with pytest.raises(ValueError, match="backend"):
        TorchConfig(backend="mpi")


def test_rank_api_and_callback_outside_their_places_raise():
    with pytest.raises(RuntimeError, match="outside of a training worker"):
        train.report({"x": 1})
    with pytest.raises(RuntimeError, match="outside of a training worker"):
        train.get_context()
    with pytest.raises(RuntimeError, match="Tune session"):
        TuneReportCallback()


def test_checkpoint_staged_by_several_ranks_commits_once_with_every_file(tmp_path):
    storage = ExperimentStorage(str(tmp_path), "exp")
    trial = storage.trial_path("trial_0")
    staged = os.path.join(trial, ".staged_a1r1_000000")
    for rank in (0, 1):
        src = tmp_path / f"rank{rank}"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / f"shard{rank}.bin").write_bytes(b"x" * (rank + 3))
        storage.stage_files(str(src), staged)
    path = storage.commit_staged(staged, trial, 0, {"trial_id": "t"})
    assert path.endswith("checkpoint_000000") and not os.path.exists(staged)
    assert storage.is_committed(path)
    assert storage.read_manifest(path)["files"] == {"sub/shard0.bin": 3, "sub/shard1.bin": 4}
    # The next one takes the next name, as a single-worker trial's would.
    os.makedirs(staged)
    assert storage.commit_staged(staged, trial, 0, {}).endswith("checkpoint_000001")


# ------------------------------------------------------------------- report batches
class _Recorder:
    """A rank's connection to its controller that keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.cond = threading.Condition()

    def send(self, obj: tuple) -> None:
        with self.cond:
            self.sent.append(obj)
            self.cond.notify_all()

    def wait(self, n: int, timeout: float = 10.0) -> list[tuple]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.sent) >= n, timeout), self.sent
            return list(self.sent)


def _rank_session(tmp_path, rank: int, interval: float) -> tuple[RankSession, _Recorder]:
    info = RankInfo(world_rank=rank, world_size=2, local_rank=rank, local_world_size=2,
                    node_rank=0, trial_id="t", trial_name="t", experiment_name="exp",
                    storage=ExperimentStorage(str(tmp_path), "exp"), trial_path=str(tmp_path),
                    group="a1r1", checkpoint_path=None, use_gpu=False, backend="gloo",
                    timeout_s=60.0, report_interval_s=interval)
    conn = _Recorder()
    return RankSession(info, conn), conn


def test_reports_without_checkpoint_leave_in_one_batch_after_the_interval(tmp_path):
    # Long enough that a busy machine cannot stall between the reports past it.
    session, conn = _rank_session(tmp_path, rank=0, interval=2.0)
    started = time.monotonic()
    for i in range(5):
        session.report({"i": i})
    assert conn.sent == []  # held back: one message for the batch, not one per report
    (message,) = conn.wait(1)
    assert time.monotonic() - started >= 2.0
    assert message == ("report", [(i, {"i": i}, False) for i in range(5)])
    # Another rank says only how far it is; its metrics are not results.
    other, other_conn = _rank_session(tmp_path, rank=1, interval=0.3)
    other.report({"i": 0})
    assert other_conn.wait(1) == [("report", [(0, None, False)])]


def test_any_other_message_sends_the_batch_first_and_a_barrier_gets_reports_at_once(
        tmp_path):
    session, conn = _rank_session(tmp_path, rank=1, interval=60.0)
    session.report({"i": 0})
    session.report({"i": 1})
    session.send(("done", None))  # the end of the loop: nothing reported is left behind
    assert conn.sent == [("report", [(0, None, False), (1, None, False)]), ("done", None)]
    # The controller waits at index 3 for this rank (another rank's checkpoint): the
    # batch goes now, and so does each report up to index 3, then batching resumes.
    session.report({"i": 2})
    session.send_through(3)
    session.report({"i": 3})
    session.report({"i": 4})
    assert conn.sent[2:] == [("report", [(2, None, False)]), ("report", [(3, None, False)])]


def test_report_interval_zero_sends_each_report_as_it_is_made(tmp_path):
    session, conn = _rank_session(tmp_path, rank=0, interval=0.0)
    session.report({"i": 0})
    assert conn.sent == [("report", [(0, {"i": 0}, False)])]


def test_a_rank_imports_neither_the_tuner_nor_dasks_client():
    """What a rank's process imports (its entry, ``from dasktune import train`` and the
    loop helpers) is start-up time each fresh rank and each fork server pays: it leaves
    out the tuner, the driver and ``distributed`` (the trainer itself stays reachable)."""
    code = textwrap.dedent("""
        import sys
        import dasktune.train.forkserver, dasktune.train.rank
        from dasktune import train
        from dasktune.train.torch import prepare_data_loader, prepare_model
        heavy = ["distributed", "dasktune.tuner", "dasktune.driver", "dasktune.runtime",
                 "pandas"]
        print([m for m in heavy if m in sys.modules])
        import dasktune
        from dasktune.train.torch import TorchTrainer
        print(dasktune.Tuner.__module__, TorchTrainer.__module__)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "dasktune.tuner dasktune.train.torch.torch_trainer"


def test_enable_reproducibility_seeds_every_generator_and_makes_torch_deterministic(
        monkeypatch):
    torch = pytest.importorskip("torch")
    import random

    import numpy

    from dasktune.train.torch import enable_reproducibility

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)

    def draws() -> tuple[float, float, float]:
        return torch.rand(1).item(), random.random(), float(numpy.random.rand())

    try:
        enable_reproducibility(7)
        first = draws()
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.benchmark is False
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        enable_reproducibility(7)
        assert draws() == first
        enable_reproducibility(8)
        assert draws() != first
    finally:  # the rest of the session runs as before
        torch.use_deterministic_algorithms(False)
