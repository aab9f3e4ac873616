"""The storage layer over every backend: local disk, a second local path standing in
for NFS (given as a ``file://`` URI), ``memory://`` and S3 (moto's server over HTTP).

memory:// lives in one process, so it is tested here at the storage layer only;
Tuner runs with workers in other processes are in ``test_s3.py`` (S3) and
``test_tuner.py`` (local).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import posixpath
import threading
import uuid

import cloudpickle
import dask.config
import pytest
import test_s3_support
from test_s3_support import s3_options

from dasktune.checkpoint import Checkpoint
from dasktune.storage import MANIFEST, ExperimentStorage
from dasktune.transfer import StorageError, redact, retry, scrub_options

BACKENDS = ["local", "nfs", "memory", "s3"]

moto_s3 = test_s3_support.moto_s3  # the fixture, shared with other S3 tests


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path) -> ExperimentStorage:
    kind = request.param
    name = f"exp-{uuid.uuid4().hex[:6]}"
    if kind == "local":
        return ExperimentStorage(str(tmp_path / "results"), name)
    if kind == "nfs":
        return ExperimentStorage(f"file://{tmp_path}/nfs-mount/runs", name)
    if kind == "memory":
        return ExperimentStorage(f"memory://dasktune-tests/{uuid.uuid4().hex[:6]}", name)
    server = request.getfixturevalue("moto_s3")
    bucket = server.new_bucket()
    return ExperimentStorage(f"s3://{bucket}/sub/path", name,
                             storage_options=s3_options(server.endpoint))


def make_ckpt(root, tag: str, sizes=(10, 2000)) -> str:
    d = os.path.join(root, f"src-{tag}-{uuid.uuid4().hex[:4]}")
    os.makedirs(os.path.join(d, "sub"))
    for i, size in enumerate(sizes):
        where = d if i % 2 == 0 else os.path.join(d, "sub")
        with open(os.path.join(where, f"f{i}.bin"), "wb") as f:
            f.write(tag.encode() * (size // len(tag) + 1))
    return d


def trial_dir(store: ExperimentStorage) -> str:
    return store.trial_path("train_0001_x=1")


class InjectedCrash(Exception):
    """Stands in for the writer dying at this point."""


def crash_after_files(fs, n: int):
    """A copy of ``fs`` whose uploads fail after ``n`` files (an fsspec subclass)."""
    base = type(fs)
    count = [0]

    def hook() -> None:
        count[0] += 1
        if count[0] > n:
            raise InjectedCrash(f"writer died after {n} files")

    if getattr(fs, "async_impl", False):
        import asyncio

        lock: list[asyncio.Lock] = []

        async def _put_file(self, lpath, rpath, **kw):
            if not lock:
                lock.append(asyncio.Lock())
            async with lock[0]:  # one upload at a time, so "after n files" is exact
                hook()
                return await base._put_file(self, lpath, rpath, **kw)

        async def _call_s3(self, method, *args, **kw):
            # dasktune drives s3fs's requests itself: one file starts with one of these
            if method in ("put_object", "create_multipart_upload"):
                if not lock:
                    lock.append(asyncio.Lock())
                async with lock[0]:
                    hook()
                    return await base._call_s3(self, method, *args, **kw)
            return await base._call_s3(self, method, *args, **kw)

        attrs = {"_put_file": _put_file, "_call_s3": _call_s3}
    else:
        def put_file(self, lpath, rpath, **kw):
            hook()
            return base.put_file(self, lpath, rpath, **kw)

        attrs = {"put_file": put_file}
    crashing = type(f"Crashing{base.__name__}", (base,), attrs)
    # A new instance (fsspec's copy would hand back the cached original).
    return crashing(**{**fs.storage_options, "skip_instance_cache": True})


# ------------------------------------------------------------------ basics
def test_atomic_files_roundtrip(store):
    store.check_writable()
    p = store.path("experiment_state.json")
    store.write_json(p, {"a": 1})
    store.write_json(p, {"a": 2, "b": [1, 2]})
    assert store.read_json(p) == {"a": 2, "b": [1, 2]}
    assert store.exists(p) and not store.exists(store.path("nope.json"))
    with pytest.raises(FileNotFoundError):
        store.read_bytes(store.path("nope.json"))
    # no temporary or probe files left behind
    names = {posixpath.basename(n) for n in store.fs.ls(store.experiment_path, detail=False)}
    assert names == {"experiment_state.json"}


def test_storage_travels_pickled(store):
    store.write_bytes(store.path("x"), b"1")
    clone = cloudpickle.loads(cloudpickle.dumps(store))
    assert clone.read_bytes(clone.path("x")) == b"1"
    assert clone.experiment_path == store.experiment_path


def test_uri_has_protocol_and_no_credentials(store):
    uri = store.uri
    if store.is_local:
        assert uri.startswith("/")
    else:
        assert uri.startswith(f"{store.protocol}://") and uri.endswith(store.name)


# ------------------------------------------------------------- checkpoints
def test_commit_list_and_read_back(store, tmp_path):
    tdir = trial_dir(store)
    src = make_ckpt(tmp_path, "one")
    p0 = store.commit_checkpoint(src, tdir, 0, {"training_iteration": 3})
    p1 = store.commit_checkpoint(make_ckpt(tmp_path, "two"), tdir, 1, {"training_iteration": 6})
    assert posixpath.basename(p0) == "checkpoint_000000"
    assert store.list_checkpoints(tdir) == [p0, p1]
    assert store.latest_committed_checkpoint(tdir) == p1
    manifest = store.read_manifest(p0)
    assert manifest["files"] == {"f0.bin": 12, "sub/f1.bin": 2001}
    assert manifest["training_iteration"] == 3 and manifest["checkpoint_index"] == 0

    ckpt = Checkpoint(p0, store.fs)
    out = ckpt.to_directory(str(tmp_path / "out"))
    assert sorted(os.listdir(out)) == ["f0.bin", "sub"]  # no manifest in the user's copy
    assert open(os.path.join(out, "sub", "f1.bin"), "rb").read() == \
        open(os.path.join(src, "sub", "f1.bin"), "rb").read()
    with ckpt.as_directory() as d:
        assert os.path.getsize(os.path.join(d, "f0.bin")) == 12
        seen = d
    assert os.path.isdir(seen) == store.is_local  # a remote download is cleaned up
    assert ckpt.get_metadata()["training_iteration"] == 3
    # a copy of the checkpoint object (e.g. on a worker) reads the same files
    clone = cloudpickle.loads(cloudpickle.dumps(ckpt))
    assert clone.get_metadata()["checkpoint_index"] == 0
    store.delete(p0)
    assert store.list_checkpoints(tdir) == [p1]


def test_crash_before_manifest_is_skipped_and_never_reused(store, tmp_path, monkeypatch):
    tdir = trial_dir(store)
    good = store.commit_checkpoint(make_ckpt(tmp_path, "good"), tdir, 0, {})
    real = ExperimentStorage.write_bytes

    def dying(self, path, data):
        if path.endswith(MANIFEST):
            raise InjectedCrash("killed before the manifest")
        return real(self, path, data)

    monkeypatch.setattr(ExperimentStorage, "write_bytes", dying)
    with pytest.raises(InjectedCrash):
        store.commit_checkpoint(make_ckpt(tmp_path, "torn"), tdir, 1, {})
    monkeypatch.setattr(ExperimentStorage, "write_bytes", real)
    torn = posixpath.join(tdir, "checkpoint_000001")
    assert store.exists(torn) and not store.is_committed(torn)
    assert store.latest_committed_checkpoint(tdir) == good
    # the next commit asked for index 1 gets a fresh directory
    nxt = store.commit_checkpoint(make_ckpt(tmp_path, "next"), tdir, 1, {})
    assert posixpath.basename(nxt) == "checkpoint_000002"
    assert store.latest_committed_checkpoint(tdir) == nxt


def test_crash_mid_upload(store, tmp_path, monkeypatch):
    tdir = trial_dir(store)
    good = store.commit_checkpoint(make_ckpt(tmp_path, "good"), tdir, 0, {})
    src = make_ckpt(tmp_path, "big", sizes=(1000, 1000, 1000, 1000))
    with dask.config.set({"dasktune.storage.retries": 0}):
        if store.is_local:
            import shutil
            import types

            def dying_copytree(src_, dst, **kw):
                shutil.copytree(src_, dst, **kw)
                raise InjectedCrash("killed before the rename")

            fake = types.SimpleNamespace(copytree=dying_copytree,
                                         ignore_patterns=shutil.ignore_patterns)
            monkeypatch.setattr("dasktune.storage.shutil", fake)
            with pytest.raises(InjectedCrash):
                store.commit_checkpoint(src, tdir, 1, {})
            monkeypatch.undo()
        else:
            crashing = copy.copy(store)
            crashing.fs = crash_after_files(store.fs, 2)
            with pytest.raises(StorageError, match="writer died"):
                crashing.commit_checkpoint(src, tdir, 1, {})
            part = posixpath.join(tdir, "checkpoint_000001")
            assert not store.is_committed(part)
    assert store.latest_committed_checkpoint(tdir) == good
    nxt = store.commit_checkpoint(make_ckpt(tmp_path, "after"), tdir, 1, {})
    assert store.is_committed(nxt)
    assert store.latest_committed_checkpoint(tdir) == nxt
    if not store.is_local:  # the half-written directory was not reused
        assert posixpath.basename(nxt) == "checkpoint_000002"


def test_broken_manifests_do_not_count(store, tmp_path):
    tdir = trial_dir(store)
    good = store.commit_checkpoint(make_ckpt(tmp_path, "good"), tdir, 0, {})
    torn = store.commit_checkpoint(make_ckpt(tmp_path, "torn"), tdir, 1, {})
    store.write_bytes(posixpath.join(torn, MANIFEST), b'{"files": {"f0.b')
    short = store.commit_checkpoint(make_ckpt(tmp_path, "short"), tdir, 2, {})
    store.write_bytes(posixpath.join(short, "f0.bin"), b"truncated")
    missing = store.commit_checkpoint(make_ckpt(tmp_path, "gone"), tdir, 3, {})
    store.fs.rm(posixpath.join(missing, "sub", "f1.bin"))
    for bad in (torn, short, missing):
        assert not store.is_committed(bad), bad
    assert store.is_committed(good)
    assert store.latest_committed_checkpoint(tdir) == good


# ------------------------------------------------------------ result files
def test_append_file_keeps_every_line(store):
    path = store.path("trial", "result.json")
    store.makedirs(store.path("trial"))
    fh = store.open_append(path)
    fh.write(b'{"i": 1}\n')
    fh.flush(force=True)
    assert store.read_bytes(path) == b'{"i": 1}\n'
    fh.write(b'{"i": 2}\n')
    fh.close()
    again = store.open_append(path)  # a restored experiment continues the file
    again.write(b'{"i": 3}\n')
    again.close()
    lines = store.read_bytes(path).splitlines()
    assert [json.loads(x)["i"] for x in lines] == [1, 2, 3]


def test_local_result_files_are_created_off_the_driver_thread(tmp_path):
    """Creating a file costs a millisecond on a VM disk and more on NFS: the driver hands
    it to the storage's io thread and never waits for it to write, flush or close."""
    store = ExperimentStorage(str(tmp_path / "results"), "exp")
    held = threading.Event()
    store.io.submit(held.wait, 30)  # the io thread is busy: nothing is created yet
    path = store.path("trial_1", "result.json")
    fh = store.open_append(path, header=b"head\n")
    fh.write(b"line 1\n")
    fh.flush()  # not forced: returns at once, the line waits
    assert fh.dirty and not os.path.exists(path)
    store.write_bytes_soon(store.path("trial_1", "params.json"), b"{}")
    fh.write(b"line 2\n")
    fh.close_soon()  # returns at once too: closed after its open, on the io thread
    assert fh.closed and not os.path.exists(path)
    held.set()
    store.drain()
    assert open(path, "rb").read() == b"head\nline 1\nline 2\n"
    assert open(store.path("trial_1", "params.json"), "rb").read() == b"{}"

    again = store.open_append(path, header=b"head\n")  # a restored trial: no second header
    assert not again.was_empty
    again.write(b"line 3\n")
    again.close()  # close() itself waits: the file is whole when it returns
    assert open(path, "rb").read().splitlines() == [b"head", b"line 1", b"line 2", b"line 3"]


def test_storage_with_an_io_thread_still_pickles(tmp_path):
    store = ExperimentStorage(str(tmp_path / "results"), "exp")
    store.drain()
    store.write_bytes_soon(store.path("a"), b"x").result(10)
    copy_ = cloudpickle.loads(cloudpickle.dumps(store))
    assert copy_._io is None and copy_.read_bytes(copy_.path("a")) == b"x"


class OutageFS:
    """A local folder behind a filesystem (not the local one: the spooled, object-store
    path is taken) that refuses every call while ``down`` is set."""

    down = False

    @classmethod
    def make(cls, root: str):
        from fsspec.implementations.dirfs import DirFileSystem
        from fsspec.implementations.local import LocalFileSystem

        def guard(name):
            method = getattr(DirFileSystem, name)

            def call(self, *args, **kwargs):
                if cls.down:
                    raise ConnectionRefusedError(f"{name}: connection refused")
                return method(self, *args, **kwargs)

            return call

        names = ["put_file", "pipe_file", "cat_file", "exists", "makedirs", "info", "ls",
                 "open", "rm"]
        flaky = type("FlakyDirFS", (DirFileSystem,), {n: guard(n) for n in names})
        return flaky(path=root, fs=LocalFileSystem())


def test_logger_outage_past_retry_budget_keeps_every_result(tmp_path, caplog):
    """The store is away for longer than the retry budget while a trial reports, ends
    and a second one starts: no hook raises, and once it is back every line is there."""
    from dasktune.logger import CSVLoggerCallback, JsonLoggerCallback
    from dasktune.trial import Trial

    root = tmp_path / "bucket"
    root.mkdir()
    fs = OutageFS.make(str(root))
    settings = {"dasktune.storage.retries": 1, "dasktune.storage.retry-backoff": "0.01s",
                "dasktune.storage.sync-period": "0s"}
    with dask.config.set(settings):
        store = ExperimentStorage("/runs", "exp", filesystem=fs)
        loggers = [JsonLoggerCallback(), CSVLoggerCallback()]
        trials = [Trial(trial_id=f"t{i}", config={"x": i}) for i in range(3)]
        for t in trials:
            t.path = store.trial_path(f"train_{t.trial_id}")
        for cb in loggers:
            cb.setup(storage=store)

        def hook(name, **kw):
            for cb in loggers:
                getattr(cb, name)(iteration=0, trials=trials, **kw)

        def report(t, i):
            hook("on_trial_result", trial=t, result={"i": i, "training_iteration": i + 1})

        hook("on_trial_start", trial=trials[0])
        report(trials[0], 0)
        hook("on_step_end")
        OutageFS.down = True
        try:
            report(trials[0], 1)
            hook("on_step_end")
            hook("on_trial_complete", trial=trials[0])  # its close cannot upload
            hook("on_trial_start", trial=trials[1])  # params and a new file: no read
            report(trials[1], 0)
            hook("on_step_end")
            hook("on_trial_start", trial=trials[2])
            report(trials[2], 0)
        finally:
            OutageFS.down = False
        hook("on_step_end")  # storage is back: everything pending goes up
        hook("on_trial_complete", trial=trials[1])
        for cb in loggers:
            cb.on_experiment_end(trials=trials)
    assert "uploaded later" in caplog.text

    def read(t, name):
        return (root / "runs" / "exp" / f"train_{t.trial_id}" / name).read_text()

    assert [json.loads(x)["i"] for x in read(trials[0], "result.json").splitlines()] == [0, 1]
    for t in trials[1:]:
        assert [json.loads(x)["i"] for x in read(t, "result.json").splitlines()] == [0]
        assert json.loads(read(t, "params.json")) == t.config
    assert read(trials[0], "progress.csv").splitlines()[1:] == ["0,1", "1,2"]
    # nothing is left spooled once storage took it all
    assert not [cb._closing for cb in loggers if cb._closing]


def test_close_that_never_uploads_keeps_the_spool(tmp_path, caplog):
    fs = OutageFS.make(str(tmp_path))
    with dask.config.set({"dasktune.storage.retries": 0}):
        store = ExperimentStorage("/runs", "exp", filesystem=fs)
        fh = store.open_append(store.path("t", "result.json"))
        fh.write(b'{"i": 0}\n')
        OutageFS.down = True
        try:
            with pytest.raises(StorageError):
                fh.close()  # not final: still open, a later close can upload
            assert not fh.closed
            with pytest.raises(StorageError):
                fh.close(final=True)
        finally:
            OutageFS.down = False
    assert fh.closed
    spool = fh._spool.name
    assert spool in caplog.text and open(spool, "rb").read() == b'{"i": 0}\n'
    os.unlink(spool)


# -------------------------------------------------------------- plain units
def test_retry_backoff_then_storage_error_names_uri():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    assert retry(flaky, "s3://b/p", retries=3, backoff=0.01) == "ok" and len(calls) == 3

    def down():
        raise ConnectionRefusedError("http://key=AKIASECRET@host refused")

    with pytest.raises(StorageError) as info:
        retry(down, "s3://bucket/exp/trial", retries=1, backoff=0.01)
    assert "s3://bucket/exp/trial" in str(info.value) and "AKIASECRET" not in str(info.value)
    with pytest.raises(FileNotFoundError):  # permanent errors are not retried
        retry(lambda: (_ for _ in ()).throw(FileNotFoundError("x")), "p", retries=5)


def test_redact_and_scrub():
    assert redact("s3://user:pw@bucket/p") == "s3://bucket/p"
    assert "sekrit" not in redact("https://h/x?X-Amz-Credential=AK/1&X-Amz-Signature=sekrit")
    opts = {"key": "AK", "secret": "S", "token": "T", "anon": False,
            "client_kwargs": {"endpoint_url": "http://e", "aws_secret_access_key": "S",
                              "aws_session_token": "T", "region_name": "r"}}
    assert scrub_options(opts) == {"anon": False, "client_kwargs": {"endpoint_url": "http://e",
                                                                    "region_name": "r"}}
    assert scrub_options(None) is None
    assert "tok123" not in redact("401: Authorization: Bearer tok123 rejected")


def test_scrub_drops_every_kind_of_credential():
    planted = "PLANTED"
    opts = {"account_name": "acct", "account_key": planted, "connection_string": planted,
            "api_key": planted, "password": planted, "credentials": {"a": planted},
            "sas_token": planted, "client_kwargs": {
                "endpoint_url": f"https://user:{planted}@host:9000",
                "headers": {"Authorization": f"Bearer {planted}", "X-Trace": "t1"}},
            "config_kwargs": {"retries": {"max_attempts": 1}}, "region": "eu"}
    clean = scrub_options(opts)
    assert planted not in repr(clean)
    assert clean == {"account_name": "acct", "region": "eu",
                     "client_kwargs": {"endpoint_url": "https://host:9000",
                                       "headers": {"X-Trace": "t1"}},
                     "config_kwargs": {"retries": {"max_attempts": 1}}}


def test_storage_error_does_not_chain_the_raw_message():
    import traceback

    def down():
        raise ConnectionRefusedError("refused: https://user:PLANTEDpw@host/x?Signature=PLANTED")

    with pytest.raises(StorageError) as info:
        retry(down, "s3://bucket/exp", retries=0, backoff=0.0)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    text = "".join(traceback.format_exception(info.value))
    assert "PLANTED" not in text and "s3://bucket/exp" in text


def test_transfers_have_bounded_memory(moto_s3):
    """Large checkpoints stream: uploads send bounded parts, downloads one streaming GET
    per file, whatever the file size (see benchmarks/storage.py for the figures)."""
    from fsspec.implementations.memory import MemoryFileSystem

    from dasktune.transfer import transfer_kwargs

    fs = ExperimentStorage("s3://b/p", "e", storage_options=s3_options(moto_s3.endpoint)).fs
    put = transfer_kwargs(fs, "put")
    assert put["chunksize"] * put["max_concurrency"] * put["batch_size"] <= 256 * 2**20
    assert transfer_kwargs(fs, "get")["max_concurrency"] == 1
    with dask.config.set({"dasktune.storage.transfer.part-size": 2**20}):
        assert transfer_kwargs(fs, "put")["chunksize"] == 2**20
    assert transfer_kwargs(MemoryFileSystem(), "put") == {}
    with pytest.raises(ValueError, match="op"):
        transfer_kwargs(fs, "copy")


moto_s3_process = test_s3_support.moto_s3_process


class PeakRss:
    """This process's peak RSS growth while the block runs, sampled in a thread."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.growth = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.growth = max(self.growth, self.proc.memory_info().rss - self.base)
            self._stop.wait(0.005)

    def __enter__(self) -> PeakRss:
        self.base = self.proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.growth = max(self.growth, self.proc.memory_info().rss - self.base)


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.mark.parametrize("part_mib", [16, 64])  # multipart with parallel parts; one PUT
def test_large_s3_checkpoint_streams_with_bounded_memory(moto_s3_process, tmp_path, part_mib):
    """A 64 MiB file among small ones commits to S3 and restores byte for byte while
    this process's memory grows by a fraction of the file (moto runs in another
    process, so its copy of the objects does not count)."""
    MiB = 2**20
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    with open(src / "model.bin", "wb") as f:
        for _ in range(64):
            f.write(os.urandom(MiB))
    for i, size in enumerate((10, 300_000, 3 * MiB)):
        (src / "sub" / f"small{i}.bin").write_bytes(os.urandom(size))
    store = ExperimentStorage(f"s3://{moto_s3_process.new_bucket()}/runs", "exp",
                              storage_options=s3_options(moto_s3_process.endpoint))
    tdir = trial_dir(store)
    warm = make_ckpt(tmp_path, "warm")  # sessions, imports, pools: not the transfer's
    Checkpoint(store.commit_checkpoint(warm, tdir, 0, {}), store.fs).to_directory(
        str(tmp_path / "warm-out"))
    with dask.config.set({"dasktune.storage.transfer.s3-part-size": part_mib * MiB}):
        with PeakRss() as save:
            path = store.commit_checkpoint(str(src), tdir, 1, {"iter": 1})
    assert store.is_committed(path)
    assert store.latest_committed_checkpoint(tdir) == path
    out = tmp_path / "out"
    with PeakRss() as restore:
        Checkpoint(path, store.fs).to_directory(str(out))
    fetched = tmp_path / "fetched"  # the store's own download
    with dask.config.set({"dasktune.storage.transfer.s3-part-size": part_mib * MiB}):
        with PeakRss() as download:
            store.download(path, str(fetched))
    files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == files
    for rel in files:
        assert _digest(str(out / rel)) == _digest(str(src / rel)), rel
        assert _digest(str(fetched / rel)) == _digest(str(src / rel)), rel
    assert (fetched / MANIFEST).is_file()
    # s3fs's own put would hold the 64 MiB file (or 50 MiB parts) in memory
    assert save.growth < 24 * MiB, f"save grew RSS by {save.growth / MiB:.1f} MiB"
    assert restore.growth < 24 * MiB, f"restore grew RSS by {restore.growth / MiB:.1f} MiB"
    assert download.growth < 24 * MiB, f"download grew RSS by {download.growth / MiB:.1f} MiB"


def test_checkpoint_folder_names_round_trip():
    """One home for the ``checkpoint_000003`` name: what storage writes, readers parse."""
    from dasktune.layout import checkpoint_dir_name, checkpoint_index

    assert checkpoint_dir_name(3) == "checkpoint_000003"
    assert checkpoint_dir_name(1234567) == "checkpoint_1234567"
    assert checkpoint_index("s3://b/exp/trial/checkpoint_000003/") == 3
    assert checkpoint_index(checkpoint_dir_name(1234567)) == 1234567
    for other in (".tmp_checkpoint_000001_ab12cd", "checkpoint_3", "params.json", "checkpoint_"):
        assert checkpoint_index(other) is None
    with pytest.raises(ValueError, match="index"):
        checkpoint_dir_name(-1)
