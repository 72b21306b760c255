"""Teacher turns on a Ray cluster: the engine and the log's one writer stay here, turns run on workers.

``explore --executor ray`` hands the turn pool a runner (:meth:`RayExecutor.run_turn`)
that sends each turn to a ``TurnWorker`` actor and waits for its facts; the pool,
the engine, the log and replay are those of a local run, so a run on Ray replays
like a local one. There is one actor per slot (``parallel``), each taking one unit
of the custom resource ``teacher_slot``: a node offers as many turns at once as the
units it was started with (``ray start --resources '{"teacher_slot": 8}'``), which
is how a user says that a node has the memory and CPU for 8 OpenCode sessions and
their graders.

Where the state lives (docs/DECISIONS.md, "Turns on a Ray cluster"): the run
directory (worktrees, shared-knowledge copies, the exported sessions) is on storage
every node mounts at the same path, so any node can fork any node's state; each
node's OpenCode store is its own (an OpenCode database must not be shared over a
network file system), and a session moves between stores as the JSON file each
turn exports beside its edge.

Faults: a worker process or node that dies mid-turn costs that turn only. Ray
restarts the actor (on any node with a free slot) and the turn is run again from
its start state, as a resume would; its facts reach the writer once, so no
finished turn is lost or recorded twice. The processes of the lost turn die with
its worker (the supervisor's watchdog, see ``engine.teachers.opencode.processes``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any

from engine.config import RunConfig
from engine.mcts.turns import TeacherFailedError
from engine.teachers import TurnCancelled, TurnRequest
from engine.teachers.opencode.processes import Supervisor, descendants
from ingest.errors import InputError, ProjectError
from ingest.events import Event

RESOURCE = "teacher_slot"
ROOT = Path(__file__).resolve().parents[2]  # the checkout: on every node at the same path
LOSSES = 3  # a turn whose worker is lost this many times fails the run
POLL_S = 0.5  # how often a waiting slot looks at the cancel flag
STOP_GRACE_S = 60.0  # a cancelled turn's time to stop before its worker is killed
RESTART_S = 600.0  # how long a lost worker may take to be running again


class TurnWorker:
    """One slot of the cluster: a Teacher on the node Ray placed it, running one turn at a time."""

    def __init__(self, config: RunConfig, run_dir: str) -> None:
        import ray

        from engine.teachers import make_teacher

        self.node = ray.get_runtime_context().get_node_id()
        self.run_dir = Path(run_dir)
        self.problem = (
            None
            if self.run_dir.is_dir()
            else (
                f"{run_dir}: the run directory is not on the node at {ray.util.get_node_ip_address()} - "
                "put --data on storage every node mounts at the same path"
            )
        )
        self.teacher = None
        if not self.problem:
            try:  # what keeps this node's Teacher from starting (its endpoint, its opencode) is said, not raised
                self.teacher = make_teacher(config, self.run_dir, self.node)
            except ProjectError as err:
                self.problem = f"the node at {ray.util.get_node_ip_address()}: {err}"
        self.cancel = threading.Event()

    def ready(self) -> tuple[str, str | None]:
        """The node the worker is on, and what keeps it from running turns (None: nothing)."""
        return self.node, self.problem

    def run_turn(self, request: TurnRequest) -> list[Event]:
        self.cancel.clear()
        return self.teacher.run_turn(request, self.cancel)  # type: ignore[union-attr]

    def stop(self) -> None:
        """Ask the turn in flight to stop (it returns or raises TurnCancelled)."""
        self.cancel.set()

    def close(self) -> None:
        if self.teacher is not None:
            self.teacher.close()


@contextlib.contextmanager
def marked_environment(marks: dict[str, str]):
    """``os.environ`` with ``marks`` while the body runs (the processes it starts inherit them)."""
    saved = {k: os.environ.get(k) for k in marks}
    os.environ.update(marks)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class RayExecutor:
    """Runs the turn pool's turns on a Ray cluster: ``address`` (or ``$RAY_ADDRESS``), else a local one.

    ``slots``: the teacher slots the cluster must offer (a new local one is made with as
    many), default ``config.parallel``; a campaign's runs share one cluster, the first
    executor joining (or making) it with every run's slots and leaving it last.
    """

    def __init__(self, config: RunConfig, run_dir: Path, address: str | None = None, slots: int | None = None) -> None:
        try:
            import ray
        except ImportError as err:
            raise InputError("--executor ray needs Ray: pip install 'ray[default]'") from err
        self._ray = ray
        address = address or os.environ.get("RAY_ADDRESS") or None
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}}
        # ray.init puts a handler of its own on SIGTERM (sys.exit, without our message or
        # deadline): the command's is put back (see cli.py, _unwind_on_signals).
        main = threading.current_thread() is threading.main_thread()
        ours = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
        self._owner = not ray.is_initialized()
        slots = slots or config.parallel
        try:
            if self._owner and address:  # (not the owner: another run of its campaign joined already)
                ray.init(address=address, runtime_env=env, log_to_driver=False, logging_level="warning")
            elif self._owner:  # a cluster of this machine alone, for as long as the run
                # Its processes are handed to a watchdog (the ones it starts later inherit its
                # mark): after a kill -9 of this process two of Ray's agents outlived it by a minute.
                self._guard = Supervisor()
                marks = self._guard.guard()  # (its watchdog started first: not one of Ray's)
                before = descendants()
                with marked_environment(marks):
                    ray.init(  # "local": a new one, even where a cluster's address file (/tmp/ray) names another
                        address="local",
                        resources={RESOURCE: slots},
                        runtime_env=env,
                        include_dashboard=False,
                        log_to_driver=False,
                        logging_level="warning",
                    )
                self._guard.adopt(descendants() - before)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise InputError(f"cannot connect to the Ray cluster at {address or 'a new local cluster'}: {err}") from err
        finally:
            for sig, handler in ours.items():
                signal.signal(sig, handler)
        self.address = address or "local"
        try:
            offered = int(ray.cluster_resources().get(RESOURCE, 0))
            if self._owner and offered < slots:
                raise InputError(
                    f"the Ray cluster at {self.address} offers {offered} teacher slot(s) (resource {RESOURCE!r}) "
                    f"and the run needs parallel = {slots}: start its nodes with "
                    f"`ray start ... --resources '{{\"{RESOURCE}\": N}}'` or lower parallel"
                )
            actor = ray.remote(TurnWorker).options(
                num_cpus=0, resources={RESOURCE: 1}, max_restarts=-1, max_task_retries=0, max_concurrency=2
            )
            self.workers = [actor.remote(config, str(run_dir)) for _ in range(config.parallel)]
            self.nodes: list[str] = []
            for node, problem in ray.get([w.ready.remote() for w in self.workers]):
                if problem:
                    raise InputError(problem)
                self.nodes.append(node)
        except BaseException:
            self.close()
            raise
        self._idle: queue.Queue = queue.Queue()
        for w in self.workers:
            self._idle.put(w)

    def run_turn(self, request: TurnRequest, cancel: threading.Event) -> list[Event]:
        """Run a turn on an idle worker and return its facts (the pool's runner)."""
        worker = self._idle.get()
        try:
            return self._run_on(worker, request, cancel)
        finally:
            self._idle.put(worker)

    def _run_on(self, worker: Any, request: TurnRequest, cancel: threading.Event) -> list[Event]:
        ray = self._ray
        errors = ray.exceptions
        lost = (
            errors.RayActorError,
            errors.WorkerCrashedError,
            errors.NodeDiedError,
            errors.ObjectLostError,
            errors.OutOfMemoryError,
        )
        where = f"{request.edge_id} turn {request.turn}"
        for _ in range(LOSSES):
            ref = worker.run_turn.remote(request)
            while not ray.wait([ref], timeout=POLL_S)[0]:
                if cancel.is_set():
                    self._stop(worker, ref)
                    raise TurnCancelled(f"{where}: cancelled")
            try:
                return ray.get(ref)
            except errors.RayTaskError as err:  # the Teacher raised: as a local run would
                raise err.as_instanceof_cause() from None
            except lost:  # Ray restarts the worker; the turn runs again from its start state
                self._await_restart(worker, cancel, where)
        raise TeacherFailedError(f"{where}: its Ray worker was lost {LOSSES} times")

    def _await_restart(self, worker: Any, cancel: threading.Event, where: str) -> None:
        """Wait until Ray has the lost worker running again (a call meanwhile fails at once)."""
        ray = self._ray
        deadline = time.monotonic() + RESTART_S
        while time.monotonic() < deadline:
            if cancel.is_set():
                raise TurnCancelled(f"{where}: cancelled")
            try:
                ray.get(worker.ready.remote(), timeout=POLL_S)
                return
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayActorError:
                time.sleep(POLL_S)
        raise TeacherFailedError(
            f"{where}: its Ray worker was lost and not back within {RESTART_S:.0f} s "
            "(is a node with a free teacher_slot left?)"
        )

    def _stop(self, worker: Any, ref: Any) -> None:
        """Stop a cancelled turn: ask, give it STOP_GRACE_S, then kill its worker (its processes die with it)."""
        ray = self._ray
        try:
            worker.stop.remote()
            deadline = time.monotonic() + STOP_GRACE_S
            while time.monotonic() < deadline and not ray.wait([ref], timeout=POLL_S)[0]:
                pass
            if not ray.wait([ref], timeout=0)[0]:
                ray.kill(worker, no_restart=False)
        except ray.exceptions.RayError:
            pass  # the worker is gone already

    def close(self) -> None:
        """Close the workers' Teachers, end the workers, and leave the cluster (a local one ends)."""
        ray = self._ray
        workers = getattr(self, "workers", [])
        try:
            done = [w.close.remote() for w in workers]
            if done:  # (none when the cluster was refused)
                ray.wait(done, num_returns=len(done), timeout=STOP_GRACE_S)
        except ray.exceptions.RayError:
            pass
        for w in workers:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(w, no_restart=True)
        if getattr(self, "_owner", True):
            ray.shutdown()
