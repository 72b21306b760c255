"""The real Teacher: OpenCode sessions in forked git worktrees, scored by ``coral eval``.

A turn, in the rooms of this package:

1. ``worktrees``: the edge's worktree at its parent's commit (turn 1; turn 2 resets
   the same worktree to turn 1's end), and a copy of the parent's shared-knowledge
   dir at ``.opencode/`` (where CORAL exposes it to OpenCode agents; never committed);
2. ``sessions``: the session it forks is pointed at that worktree (a fresh session
   from a root), or brought in from another node's store (a cluster);
3. ``server`` and ``served`` (the default): a session of one of the store's ``opencode serve``
   processes, created or forked, runs the prompt until it ends, its timeout or a
   cancel (then it is aborted), and nothing it started in the worktree outlives it;
   its stored messages become the lines ``opencode run`` prints. With ``serve =
   false``, ``processes`` runs ``opencode run --format json [--session S --fork]``
   instead, with the prompt on stdin, in the ``environment`` of the run;
4. the lines are parsed (``ingest.opencode_stream``) and the eval result read from
   what ``coral eval`` left (``ingest.coral_eval``);
5. ``recorder``: with an endpoint, OpenCode's requests pass through a recording
   server on loopback, and the turn records what the model received. A turn the
   model never answered is a backend error (``outcome = error``), however it ended (with what
   OpenCode reported, e.g. a model it does not know); a score that came back before a timeout stands.

With an endpoint, ``endpoint`` checks before anything else that it answers the
run's model (a run with nothing listening is refused at once).

With ``coral_dir`` (the Student run's ``.coral``), ``coral`` gives every edge a CORAL run of its own
around its worktree, and CORAL's grader daemon runs beside the turn's OpenCode process, so that the
real ``coral eval`` grades there. Before the first turn, ``check_grader`` has the same daemon grade a
root's own commit in a throwaway edge layout (``grader``: ``GraderChecked``; the engine stops the run when it
fails).

Every recorded state - commit, session, shared-dir snapshot - stays immutable and
can be forked again (by turn 2, the node's children, a resumed run). Paths are absolute.

On a cluster node (``node``: ``explore --executor ray``) the run directory is shared
by every node, and OpenCode's store is the node's own (``environment.node_store``):
each turn's session is exported next to its worktree (``session_file`` in its state),
and a turn whose source session another node made imports it first.
"""

from __future__ import annotations

import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.teachers.opencode.coral import CoralLayout, check_daemon
from engine.teachers.opencode.endpoint import check_endpoint
from engine.teachers.opencode.environment import Environment, api_key, node_store
from engine.teachers.opencode.grader import grade_root, grader_output
from engine.teachers.opencode.options import (  # noqa: F401 - re-exported
    TURN1,
    TURN2,
    GraderTolerance,
    OpenCodeOptions,
    check_eval_command,
    resolve_options,
    sized_width,
)
from engine.teachers.opencode.processes import RUN_ENV, Companion, Finished, Supervisor, kill_marked
from engine.teachers.opencode.recorder import (
    Recorder,
    agent_exchanges,
    conversation_facts,
    model_phases,
    unreported_steps,
)
from engine.teachers.opencode.served import run_served
from engine.teachers.opencode.server import Servers
from engine.teachers.opencode.sessions import bring_session, export_session, holding
from engine.teachers.opencode.worktrees import Worktrees, copy_dir, git
from engine.teachers.protocol import RootInfo, TurnCancelled, TurnRequest
from ingest import coral_eval
from ingest.events import EvalFinished, Event, GraderChecked, MessageWritten, StepFinished, ToolCalled, TurnFinished
from ingest.opencode_stream import StreamParser, session_lines


class OpenCodeTeacher:
    """Runs turns with ``opencode run --format json`` (see the module docstring)."""

    name = "opencode"

    def __init__(self, config: Any, run_dir: Path, node: str | None = None) -> None:
        self.opts = OpenCodeOptions.model_validate(resolve_options(dict(config.backend_options)))
        self.task = config.task or "task"
        self.node, self.parallel = node, getattr(config, "parallel", 1)
        check_eval_command(self.opts.eval_command)  # before anything is created
        if self.opts.endpoint:
            check_endpoint(
                self.opts.endpoint, self.opts.model.split("/", 1)[1], api_key(self.opts), self.opts.turn_timeout_s
            )
        made = [p for p in dict.fromkeys([Path(run_dir), Path(self.opts.worktree_root or run_dir)]) if not p.exists()]
        try:
            self._open(run_dir, node)
        except BaseException:
            for path in made:  # refused before the run began: nothing it made stays (a resume's or a node's is left)
                shutil.rmtree(path, ignore_errors=True)
            raise

    def _open(self, run_dir: Path, node: str | None) -> None:
        """The run's OpenCode store, worktrees, CORAL layout and servers (created under ``run_dir``)."""
        self.run_store = Environment(run_dir, self.opts)
        self.environment = (
            Environment(run_dir, self.opts, node_store(self.opts.node_store, run_dir, node)) if node else self.run_store
        )
        self.worktrees = Worktrees(
            Path(self.opts.worktree_root) if self.opts.worktree_root else self.environment.run_dir / "worktrees",
            self.opts.shared_dir,
        )
        self.processes = Supervisor()
        # Sessions a killed process of this run left running (kill -9 skips every cleanup) would go on writing into
        # worktrees its turns are re-run in. Only this run's writer starts them, so whatever carries the run's mark
        # is left over (a cluster node's Teacher runs beside others of the run: it leaves them).
        if node is None:
            kill_marked(str(self.environment.run_dir), RUN_ENV)
        self.environment.init_database()
        self.version = f"opencode {self.run_store.version()}"
        self.coral = None
        if self.opts.coral_dir:
            check_daemon(self.opts.coral_python, self.environment.env)
            self.coral = CoralLayout(
                Path(self.opts.coral_dir), self.environment.run_dir, self.opts.coral_python, self.opts.coral_agent_id
            )
        self.recorder = Recorder(self.opts.endpoint, self.opts.turn_timeout_s) if self.opts.endpoint else None
        self.servers = None
        self._discarded: list[Path] = []  # edge dirs of discarded worktrees (served turns)
        self._lost: dict[tuple[str, int], str | None] = {}  # a turn's server that died under it
        if self.opts.serve:
            url = self.recorder.served_url() if self.recorder else None
            width = sized_width(self.parallel, self.opts.server_width)
            self.servers = Servers(self.environment, self.processes, width, self.opts.server_turns, url)
            if self.recorder is not None:
                self.recorder.parent_of = self.servers.parent_of

    # -- Teacher interface

    def root_state(self, root: RootInfo) -> dict[str, Any]:
        """A git repository with the snapshot's code (made once per tree)."""
        snapshot = Path(root.path).resolve()
        repo, commit = self.worktrees.root_repo(root.tree_id, snapshot / "code")
        return {"repo": str(repo), "commit": commit, "session": None, "shared": str(snapshot / "shared")}

    def discard(self, state: dict[str, Any]) -> None:
        """Remove the worktree (and shared snapshots) of a pruned or retried edge."""
        if state.get("worktree"):
            self.worktrees.discard(Path(state["repo"]), Path(state["worktree"]))
            if self.servers is not None:  # removed again at close (below)
                self._discarded.append(Path(state["worktree"]).parent)

    def close(self) -> None:
        """Stop every process of the turns; a node's store goes too (each session is in its exported file)."""
        if self.servers is not None:
            self.servers.stop()
            # A server's detached plugin install can recreate an empty ``.opencode/`` after a discard.
            for edge_dir in self._discarded:
                shutil.rmtree(edge_dir, ignore_errors=True)
        self.processes.stop_all()
        if self.recorder is not None:
            self.recorder.stop()
        if self.node:
            shutil.rmtree(self.environment.home, ignore_errors=True)

    def run_turn(self, request: TurnRequest, cancel: threading.Event) -> list[Event]:
        start = request.start_state
        repo = Path(start["repo"])
        edge_dir = self.worktrees.edge_dir(request.tree_id, request.edge_id)
        worktree = edge_dir / "wt"
        shared = worktree / self.opts.shared_dir
        self.worktrees.prepare(repo, worktree, start["commit"], fresh=request.turn == 1)
        copy_dir(Path(start["shared"]) if start.get("shared") else None, shared)
        source = start.get("session")
        # A session of the store is brought to a served turn's lane by its server pool (it moves the fork).
        if source and (self.servers is None or self.servers.home(source) is None):
            file, moved = start.get("session_file"), self.servers is None
            bring_session(self.environment, self.run_store, source, file, worktree, edge_dir, move=moved)
        before = git("rev-parse", "HEAD", cwd=worktree)
        prompt = (self.opts.prompt_turn1 if request.turn == 1 else self.opts.prompt_turn2).format(
            task=self.task,
            edge_id=request.edge_id,
            turn=request.turn,
            eval_command=self.opts.eval_command,
        )
        companions: tuple[Companion, ...] = ()
        grader_log = edge_dir / f"grader-t{request.turn}.log"
        if self.coral:
            coral = self.coral.prepare(edge_dir, worktree, shared, request.turn)
            companions = (self.coral.daemon(coral, self.environment.env, grader_log),)
        started_at = datetime.now(UTC)
        t0 = time.monotonic()
        token = self.recorder.open(request.edge_id, request.turn) if self.recorder else None
        try:
            parser, lines, facts, outcome, error = self._run(
                request, edge_dir, worktree, source, prompt, cancel, companions, token
            )
        finally:
            if self.coral:
                self.coral.finish(edge_dir, worktree, shared, request.turn)
            # A cancelled turn's requests are cut off at once (Ctrl-C should not wait).
            exchanges = self.recorder.close(token, 0.0 if cancel.is_set() else 5.0) if token else None
        wall = time.monotonic() - t0
        startup, model = model_phases(exchanges, t0) if exchanges is not None else (None, None)
        after = git("rev-parse", "HEAD", cwd=worktree)
        result = self._eval_result(shared, before, after, parser)
        if outcome == "timeout" and result.score is None:  # a score that came back stands (graded in time)
            result = coral_eval.EvalResult(None, "timeout", result.feedback, result.source)
        snapshot = edge_dir / f"shared-t{request.turn}"
        copy_dir(shared, snapshot)
        ids = {"tree_id": request.tree_id, "edge_id": request.edge_id, "turn": request.turn}
        conversation = start.get("conversation")
        context_tokens = parser.summary.context_tokens
        if outcome != "error" and not _answered(facts, exchanges):
            # Not a rollout: a backend failure (int_turns__failing), never an edge the tree keeps.
            where = f" at {self.opts.endpoint}" if self.opts.endpoint else ""
            outcome, error = "error", f"the model never answered{where}: {error or 'opencode ended without an answer'}"
        error = None if outcome == "completed" else error
        if exchanges is not None:
            recorded, conversation = conversation_facts(
                exchanges, ids, conversation, str(worktree), parser.summary.results
            )
            facts += recorded
            # A model call whose tokens the stream never printed (killed during its tool
            # calls): the endpoint's usage stands in, and the last call's is the context.
            reported = {f.step for f in facts if isinstance(f, StepFinished)}
            unreported = unreported_steps(exchanges, ids, reported)
            facts += unreported
            if unreported and unreported[-1].step > max(reported, default=0):
                context_tokens = unreported[-1].tokens_total
        facts.append(
            EvalFinished(
                **ids,
                score=result.score,
                eval_status=result.status,
                commit_hash=after,
                source=result.source,
                feedback=result.feedback,
                error=result.error if outcome == "completed" else None,
                grader_log=grader_output(grader_log) if self.coral else None,
            )
        )
        state = {
            "repo": str(repo),
            "worktree": str(worktree),
            "commit": after,
            "session": parser.summary.session_id or source,
            "shared": str(snapshot),
            "conversation": conversation,
        }
        if self.node:  # where it ran, and its session for the other nodes
            state["node"] = self.node
            state["session_file"] = start.get("session_file")
            if parser.summary.session_id:
                state["session_file"] = str(edge_dir / f"session-t{request.turn}.json")
                store = holding([self.environment], parser.summary.session_id) or self.environment  # its lane's
                export_session(store.bin, store.env, parser.summary.session_id, Path(state["session_file"]))
        facts.append(
            TurnFinished(
                **ids,
                session_id=parser.summary.session_id,
                context_tokens=context_tokens,
                outcome=outcome,
                error=error,
                state=state,
                started_at=started_at.isoformat(),
                wall_seconds=round(wall, 3),
                startup_seconds=startup,
                model_seconds=model,
                tool_seconds=parser.summary.tool_seconds(),
                eval_seconds=coral_eval.eval_seconds(parser.summary.shell_calls, self.opts.eval_command.split()[0]),
                lost_server=self._lost.pop((request.edge_id, request.turn), None),
                prompt=prompt,
                transcript="".join(lines),
            )
        )
        return facts

    def check_grader(self, root: RootInfo, start: dict[str, Any]) -> GraderChecked | None:
        """Grade the root's own code unchanged with CORAL's grader, as a turn's eval is graded
        (:mod:`engine.teachers.opencode.grader`); None without ``coral_dir`` or with ``grader_check`` off."""
        if self.coral is None or not self.opts.grader_check:
            return None
        return grade_root(
            root,
            start,
            coral=self.coral,
            worktrees=self.worktrees,
            processes=self.processes,
            env=self.environment.env,
            opts=self.opts,
        )

    # -- the turn

    def _run(
        self,
        request: TurnRequest,
        edge_dir: Path,
        worktree: Path,
        source: str | None,
        prompt: str,
        cancel: threading.Event,
        companions: tuple[Companion, ...],
        token: str | None,
    ):
        parser = StreamParser(request.tree_id, request.edge_id, request.turn)
        lines: list[str] = []
        facts: list[Event] = []

        def on_line(line: str) -> None:
            lines.append(line)
            facts.extend(parser.feed(line))

        stderr = edge_dir / f"stderr-t{request.turn}.log"
        timeout = request.timeout_s or self.opts.turn_timeout_s
        work_started = (lambda: self.recorder.first_request(token)) if self.recorder and token else None
        why = None
        if self.servers is not None:
            label = f"{request.edge_id}#{request.turn}"
            with self.processes.companions(label, companions, self.environment.env):
                served = run_served(
                    self.servers,
                    worktree=worktree,
                    source=source,
                    title=f"{request.edge_id} turn {request.turn}",
                    prompt=prompt,
                    model=self.opts.model,
                    cancel=cancel,
                    timeout_s=timeout,
                    startup_s=self.opts.startup_timeout_s,
                    bind=(lambda session: self.recorder.bind(token, session)) if self.recorder and token else _nothing,
                    work_started=work_started,
                )
            for line in session_lines(served.messages):
                on_line(line)
            parser.summary.session_id = served.session
            finished, why = Finished(served.outcome, 0), served.why
            self._lost[(request.edge_id, request.turn)] = served.lost  # its loss counts once (int_turns__failing)
        else:
            finished = self._process(request, edge_dir, worktree, source, prompt, cancel, companions, token, on_line)
        facts.extend(parser.finish())  # the tool calls a killed turn's stream ended with
        if finished.outcome == "cancelled":
            raise TurnCancelled(f"{request.edge_id} turn {request.turn} cancelled")
        if finished.outcome == "gone":  # the server died under the turn, or could not start it: a backend failure
            return parser, lines, facts, "error", f"opencode serve lost the turn: {why}"
        if finished.outcome == "startup":  # a backend failure: the turn never reached the model
            limit = self.opts.startup_timeout_s
            why = f"opencode sent no request to the model within {limit:g} s of its start (startup_timeout_s)"
            return parser, lines, facts, "error", why
        if finished.outcome == "timeout":
            counted = " of work (from its first request to the model)" if self.recorder else ""
            return parser, lines, facts, "timeout", f"turn timed out after {timeout:.0f} s{counted}"
        if finished.returncode != 0 or parser.summary.errors:
            detail = "; ".join(parser.summary.errors) or stderr.read_text(errors="replace")[-500:]
            who = "opencode serve reported" if self.servers else f"opencode exited with {finished.returncode}"
            return parser, lines, facts, "error", f"{who}: {detail}".strip()
        return parser, lines, facts, "completed", why and f"opencode serve reported: {why}"  # (said if never answered)

    def _process(self, request, edge_dir, worktree, source, prompt, cancel, companions, token, on_line) -> Finished:
        """The turn as one ``opencode run`` process (``serve = false``)."""
        args = [self.environment.bin, "run", "--format", "json", "--model", self.opts.model, "--dir", str(worktree)]
        args += ["--session", source, "--fork"] if source else ["--title", f"{request.edge_id} turn {request.turn}"]
        got: list[str] = []
        prompt_file = edge_dir / f"prompt-t{request.turn}.txt"
        prompt_file.write_text(prompt)
        stderr = edge_dir / f"stderr-t{request.turn}.log"
        for attempt in range(1, LOCKED_ATTEMPTS + 1):
            finished = self.processes.run(
                args,
                label=f"{request.edge_id}#{request.turn}",
                cwd=worktree,
                env=dict(
                    self.environment.through(self.recorder.url(token)) if token else self.environment.env,
                    PWD=str(worktree),
                ),
                stdin=prompt_file,
                stderr=stderr,
                on_line=lambda line: (got.append(line), on_line(line)),
                timeout_s=request.timeout_s or self.opts.turn_timeout_s,
                cancel=cancel,
                companions=companions,
                work_started=(lambda: self.recorder.first_request(token)) if self.recorder and token else None,
                startup_s=self.opts.startup_timeout_s,
            )
            # Sessions starting together in one store can find its SQLite database locked:
            # OpenCode then exits before its first line, nothing done, and the turn starts again.
            locked = (
                finished.outcome == "completed"
                and finished.returncode != 0
                and not got
                and "database is locked" in stderr.read_text(errors="replace")
            )
            if not locked or attempt == LOCKED_ATTEMPTS:
                return finished
            if cancel.wait(0.5 * attempt):
                raise TurnCancelled(f"{request.edge_id} turn {request.turn} cancelled")
        return finished

    def _eval_result(self, shared: Path, before: str, after: str, parser: StreamParser) -> coral_eval.EvalResult:
        """The turn's last eval: the attempt JSON of the new commit, else the printed block."""
        if after != before:
            found = coral_eval.from_attempt(shared / self.opts.attempts_subdir / f"{after}.json")
            if found is not None:
                return found
        eval_word = self.opts.eval_command.split()[0]
        return coral_eval.from_printed(parser.summary.shell_calls, eval_word) or coral_eval.NO_EVAL


def _answered(facts: list[Event], exchanges: list | None) -> bool:
    """Whether the model answered the turn at all: a step, a tool call or text in its stream,
    or (with the recorder) a finished answer the endpoint sent."""
    if any(isinstance(f, (StepFinished, ToolCalled, MessageWritten)) for f in facts):
        return True
    return exchanges is not None and any(x.answer is not None for x in agent_exchanges(exchanges))


def _nothing(_session: str) -> None:
    return None


LOCKED_ATTEMPTS = 3  # starts of a turn whose OpenCode found its database locked
