"""What AWS and GCP share: start through dask-cloudprovider with a bounded wait, keep the
VMs after the command exits, top a running cluster up with dask-cloudprovider's own worker
VMs, and run head-node work (:mod:`dasktune.cluster.head_jobs`) through the scheduler
process."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dasktune.cluster._base import ClusterProvider, Progress, quiet
from dasktune.cluster.head_jobs import read_job, run_shell, start_driver, stop_job

if TYPE_CHECKING:
    from distributed.security import Security

__all__ = ["CloudProvider", "check_cli_options"]

TAG = "dasktune-cluster"


def check_cli_options(options: dict[str, Any], where: str) -> dict[str, Any]:
    """dask-cloudprovider renders scheduler/worker options with ``str()`` on a command line,
    so a list would arrive as ``"['a', 'b']"``: refuse it here, with its name."""
    for key, value in options.items():
        if isinstance(value, (list, tuple, dict, set)):
            raise ValueError(f"{where}.{key}: only scalar values can be passed "
                             f"(dask-cloudprovider renders them with str()), got {value!r}")
    return options


class CloudProvider(ClusterProvider):
    """Subclasses say how to build the dask-cloudprovider cluster and how to find and
    terminate this cluster's instances by their tag (so ``down`` works after a partial ``up``).

    The dask-cloudprovider cluster object lives only as long as one command: ``up`` records
    what a later ``up`` needs to add workers to the same cluster (the address workers dial,
    the cluster id in the VM names, the TLS files) and builds a fresh, never-started cluster
    object just to construct worker VMs from it.
    """

    def cluster_kwargs(self) -> dict[str, Any]:
        raise NotImplementedError

    def cluster_class(self) -> type:
        raise NotImplementedError

    def instances(self, *, role: str | None = None) -> list[str]:
        """Ids of this cluster's live instances (``role``: "scheduler" or "worker")."""
        raise NotImplementedError

    def terminate(self, ids: Sequence[str]) -> None:
        raise NotImplementedError

    @property
    def spot(self) -> bool:
        raise NotImplementedError

    def worker_contact(self, cluster: Any) -> str:
        """The scheduler address the cluster's worker VMs dial (what SpecCluster passes)."""
        return getattr(cluster.scheduler, "contact_address", None) or cluster.scheduler.address

    def worker_vm(self, cluster: Any, contact: str) -> Any:
        """A new, unstarted worker VM of ``cluster`` (dask-cloudprovider's own class)."""
        return cluster.worker_class(contact, **cluster.worker_options)

    # -- lifecycle --------------------------------------------------------------------
    def up(self, *, restart_only: bool = False, timeout: float = 600.0,
           progress: Progress = quiet) -> dict[str, Any]:
        if restart_only:
            state = self.state.read()
            with self.connect() as client:
                client.restart_workers(list(client.scheduler_info(n_workers=-1)["workers"]))
            return state
        if self.state.exists() and self.instances():
            return self._top_up(timeout, progress)
        self.state.write({"name": self.name, "provider": self.kind})
        deadline = time.monotonic() + timeout
        try:
            progress(f"creating the scheduler and {self.config.min_workers} worker VM(s)")
            info = asyncio.run(self._create(timeout))
            self.state.update(**info)
            n = self.config.min_workers
            self.wait_for_workers(n, max(1.0, deadline - time.monotonic()), progress)
            if self.spot:
                self._install_spot_plugin()
        except BaseException as e:
            progress("up failed; terminating what was created")
            self.down()
            if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
                raise TimeoutError(f"cluster {self.name!r}: not up within {timeout:.0f}s "
                                   "(no scheduler answered?); nothing is left running") from None
            raise
        if self.config.adaptive:
            progress(f"note: started min_workers={n}; adaptive scaling to max_workers needs a "
                     "manager process and is not kept after `up` exits")
        return self.state.read()

    def _install_spot_plugin(self) -> None:
        """Every worker, now and later, watches its VM's interruption notice."""
        import dask.config
        from dask.utils import parse_timedelta

        from dasktune.cluster.spot import SpotInterruptionPlugin

        url = dask.config.get("dasktune.cluster.spot-notice-url", None)
        interval = dask.config.get("dasktune.cluster.spot-poll-interval", "5s")
        plugin = SpotInterruptionPlugin(url=url, provider=self.kind,
                                        interval=parse_timedelta(interval, default="s"))
        with self.connect() as client:
            client.register_plugin(plugin)

    async def _create(self, timeout: float) -> dict[str, Any]:
        cls = self.cluster_class()
        cluster = cls(asynchronous=True, shutdown_on_close=False, **self.cluster_kwargs())

        async def start() -> None:
            await cluster._start()
            # Create the worker VMs now: a background scale would die with this command.
            await cluster._correct_state()

        await asyncio.wait_for(start(), timeout)
        info: dict[str, Any] = {"scheduler_address": cluster.scheduler_address,
                                "worker_contact": self.worker_contact(cluster),
                                "cluster_id": cluster.uuid}
        host = cluster.scheduler_address.split("://")[-1].rsplit(":", 1)[0]
        info["dashboard_url"] = f"http://{host}:8787/status"
        sec = cluster.security
        if sec is not None and sec.require_encryption:
            info["tls"] = self.state.write_tls(sec.tls_ca_file, sec.tls_client_cert,
                                               sec.tls_client_key)
        # Deliberately not closed: the VMs outlive this command; `down` terminates them.
        return info

    def _top_up(self, timeout: float, progress: Progress) -> dict[str, Any]:
        """``up`` on a running cluster: add worker VMs up to ``min_workers``, keep the rest."""
        state = self.state.read()
        if not self.instances(role="scheduler"):
            raise ValueError(f"cluster {self.name!r}: its scheduler instance is gone (only "
                             "workers are left); run `dasktune down` then `dasktune up`")
        deadline = time.monotonic() + timeout
        with self.connect():  # the scheduler must answer before anything is added
            pass
        n = self.config.min_workers
        live = len(self.instances(role="worker"))
        missing = max(0, n - live)
        progress(f"cluster {self.name!r} is already up at {state['scheduler_address']} with "
                 f"{live} worker instance(s); " + (f"creating {missing} worker VM(s)"
                                                   if missing else "nothing to add"))
        if missing:
            try:
                asyncio.run(self._create_workers(missing, timeout))
            except (TimeoutError, asyncio.TimeoutError):
                raise TimeoutError(f"cluster {self.name!r}: {missing} worker VM(s) not created "
                                   f"within {timeout:.0f}s; `up` again retries") from None
        self.wait_for_workers(n, max(1.0, deadline - time.monotonic()), progress)
        return state

    async def _create_workers(self, count: int, timeout: float) -> list[Any]:
        """Create ``count`` worker VMs for the recorded scheduler, as ``up`` would."""
        state = self.state.read()
        kwargs = {**self.cluster_kwargs(), "n_workers": 0, "security": self._security(state)}
        cluster = self.cluster_class()(asynchronous=True, shutdown_on_close=False, **kwargs)
        try:
            # Same cluster id as the first `up`: it is in the VM names and tags.
            cluster.uuid = state.get("cluster_id", cluster.uuid)
            cluster.prepare_options()
            contact = state.get("worker_contact") or state["scheduler_address"]
            vms = [self.worker_vm(cluster, contact) for _ in range(count)]
            await asyncio.wait_for(asyncio.gather(*(vm.start() for vm in vms)), timeout)
            return vms
        finally:
            cluster.status = cluster.status.closed  # never started: nothing of it to close

    def _security(self, state: dict[str, Any]) -> Security | bool:
        """The cluster's own TLS credentials, from the files ``up`` wrote (False: plain tcp).

        As PEM text, not paths: dask-cloudprovider puts them in the new VMs' user data.
        dask's temporary credentials use one certificate and key for every role.
        """
        tls = state.get("tls")
        if not tls:
            return False
        from distributed.security import Security

        ca, cert, key = (Path(tls[k]).read_text() for k in ("ca", "cert", "key"))
        return Security(require_encryption=True, tls_ca_file=ca,
                        tls_client_cert=cert, tls_client_key=key,
                        tls_scheduler_cert=cert, tls_scheduler_key=key,
                        tls_worker_cert=cert, tls_worker_key=key)

    def down(self, *, progress: Progress = quiet) -> None:
        ids = self.instances()
        if ids:
            progress(f"terminating {len(ids)} instance(s): {', '.join(ids)}")
            self.terminate(ids)
        left = self.instances()
        if left:
            raise RuntimeError(f"instances still running after terminate: {left}")
        self.state.remove()

    def kill_worker_hard(self, *, rng: random.Random | None = None) -> str:
        ids = self.instances(role="worker")
        if not ids:
            raise ValueError(f"cluster {self.name!r} has no running worker instance")
        victim = (rng or random).choice(ids)
        self.terminate([victim])
        return f"instance {victim}"

    # -- head-node work, through the scheduler process -------------------------------------
    def exec(self, command: str) -> int:
        with self.connect() as client:
            code, out = client.run_on_scheduler(run_shell, command)
        print(out, end="")
        return code

    def submit(self, script: str, args: Sequence[str], *, detach: bool = False,
               then_down: bool = False) -> tuple[int, str | None]:
        """Run the driver on the head as a job (log file, exit status file); without
        ``detach``, print its output as it comes and return its exit status."""
        if not os.path.isfile(script):
            raise ValueError(f"submit: no such script: {script}")
        with open(script, "rb") as f:
            body = f.read()
        if then_down and detach:
            raise ValueError("--stop with --detach is only supported on local clusters")
        argv = [*args, "--address", self.address]
        with self.connect() as client:
            job, cmd = client.run_on_scheduler(start_driver, os.path.basename(script),
                                               body, argv)
            if detach:
                self.state.update(jobs=[*self.state.read().get("jobs", []), job])
                print(f"started {cmd}")
                return 0, job
            return self._follow(client, job, stop_on_interrupt=True), None

    def logs(self, job: str | None = None) -> tuple[str, bool]:
        job = self._job(job)
        with self.connect() as client:
            chunk, running, _ = client.run_on_scheduler(read_job, job, 0, 0.0, None)
        return chunk.decode(errors="replace"), running

    def follow(self, job: str | None = None) -> int:
        """Print a detached job's output (the latest by default) until it ends."""
        job = self._job(job)
        with self.connect() as client:
            return self._follow(client, job, stop_on_interrupt=False)

    def _job(self, job: str | None) -> str:
        jobs = self.state.read().get("jobs", [])
        if not jobs:
            raise ValueError(f"cluster {self.name!r} has no detached job")
        return job or jobs[-1]

    def _follow(self, client: Any, job: str, *, stop_on_interrupt: bool) -> int:
        """Print the job's output from the head by offset until it ends; its exit status.

        Ctrl-C with ``stop_on_interrupt`` stops the job's process group on the head (a
        non-detached driver must not outlive its terminal); else it only stops reading.
        """
        import codecs

        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        offset = 0
        try:
            while True:
                # A long poll: the head answers as soon as there is output, or after 1 s.
                chunk, running, rc = client.run_on_scheduler(read_job, job, offset, 1.0)
                offset += len(chunk)
                print(decoder.decode(chunk, final=not running), end="", flush=True)
                if not running:
                    return _exit_status(rc, job)
        except KeyboardInterrupt:
            if not stop_on_interrupt:
                raise
            stopped = client.run_on_scheduler(stop_job, job)
            print(f"\ninterrupted: {'stopped' if stopped else 'could not find'} the driver "
                  f"({job}) on the head", file=sys.stderr, flush=True)
            return 130
        except (OSError, TimeoutError) as e:
            # The driver may well run on: remember it, so that `logs` can find it.
            jobs = self.state.read().get("jobs", [])
            if job not in jobs:
                self.state.update(jobs=[*jobs, job])
            raise ValueError(f"lost the scheduler while following {job} ({e}); it may still "
                             f"run on the head: read it with `dasktune logs ... {job}`") from None


def _exit_status(rc: int | None, job: str) -> int:
    """A shell's view of the recorded status: 128+N for a signal; 1 when none was recorded."""
    if rc is None:
        print(f"{job} ended without an exit status (killed?)", file=sys.stderr)
        return 1
    return 128 - rc if rc < 0 else rc
