"""What the pages show: rows of views read through the collection of the data directory.

One collection (``engine.collection.Collection``: every run, its views read from the
runs' stored derived state) serves every page; a page of one run reads that run's
rows alone. The server's one reader (``engine.runset.Reader``) holds the derived state
every collection it opens and every run's catalog a page opens read through (one DuckDB
instance builds the states, a file checked once is not checked again while unchanged).
A page that finds a run's record changed since the last read (a part landed) has the
collection read the runs again (``refresh``: a grown run is caught up from its last
state), and a new run opens it anew, so a page always shows a published prefix of each
log. Pages read at once: each query runs on a cursor of its own (``Collection.result``);
a lock is held only while the collection is opened or brought up to date. A damaged
campaign is one item of the collection page, named with its diagnosis.
This module only chooses rows; every figure is a column of a view.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.collection import Collection, Limits
from engine.runset import Reader
from ingest.errors import InputError, LogError, ProjectError
from ingest.log import EventLog, run_ids
from ingest.paths import command_line
from ingest.text import sql_text

Rows = list[dict[str, Any]]
SAMPLES_KEPT = 64


class Source:
    """The data directory a server reads, through one collection brought up to date as the logs change."""

    def __init__(self, data_dir: Path, limits: Limits | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.limits = limits or Limits.resolve()
        self.reader = Reader(self.data_dir)  # the process's: every page reads derived state through it
        self._lock = threading.Lock()  # held while the collection is opened or brought up to date
        self._open: tuple[tuple, Collection] | None = None
        self._samples: OrderedDict[tuple, Any] = OrderedDict()
        self._opening: threading.Thread | None = None  # the collection's first reading, while it runs
        self._read_once = False  # whether it was read once (its runs' views derived)

    def fingerprint(self, runs: list[str] | None = None) -> tuple:
        """Which runs, and the state of each one's record (it changes whenever a part is published) and of its
        live writer's mark (a collection reads a live run as of its writer's last state: engine/derived/live.py)."""
        return tuple(
            (run_id, *self.reader.stamp(run_id)) for run_id in (runs if runs is not None else run_ids(self.data_dir))
        )

    def collection(self) -> Collection:
        """The collection of every run (but the damaged ones), up to date; LogError when there is no run yet.

        Its queries run at once (each on a cursor of its own): no lock is held while they run.
        """
        with self._lock:
            now = self.fingerprint()
            if self._open is None or [r[0] for r in self._open[0]] != [r[0] for r in now]:
                self._open = (now, Collection(self.data_dir, self.reader.runs(), self.limits))
            elif self._open[0] != now:
                runs = self._open[1]
                with runs.binding_lock:
                    runs.refresh()
                self._open = (now, runs)
            return self._open[1]

    def ready(self, within: float, read: Callable[[Collection], object]) -> bool:
        """Whether the collection's first reading is done, waiting at most ``within`` seconds for it: it runs
        ``read`` (a page's queries) over the collection in a thread of its own - the first reading derives every
        run with nothing stored yet, seconds to minutes at a large collection - so that a page can say what is
        being done meanwhile. A failed reading counts as done: the page's own reading says why."""
        with self._lock:
            if self._read_once:
                return True
            if self._opening is None:
                self._opening = threading.Thread(target=self._read_first, args=(read,), name="collection", daemon=True)
                self._opening.start()
            opening = self._opening
        opening.join(within)
        return not opening.is_alive()

    def _read_first(self, read: Callable[[Collection], object]) -> None:
        done = False
        try:
            with contextlib.suppress(ProjectError, OSError):  # (the page reading it again says what it is)
                read(self.collection())
                done = True
        finally:
            with self._lock:
                self._opening, self._read_once = None, done

    @property
    def transcripts(self):
        """The runs' transcripts to search (:class:`engine.derived.transcripts.Transcripts`), read through the
        server's reader (LogError when there is no run yet)."""
        self.collection()
        return self.reader.transcripts

    def damaged(self, runs: Collection) -> list[str]:
        """What is damaged among the collection's runs (each left out), as messages."""
        with runs.binding_lock:
            return [d.message() for d in runs.damaged]

    def _kept(self, key: tuple, make):
        """What ``make()`` gives, kept under ``key`` (it names the run's log as of now) among the last SAMPLES_KEPT."""
        with self._lock:
            found = self._samples.get(key)
        if found is None:  # made without the lock (two pages may make the same one: the same value)
            found = make()
        with self._lock:
            self._samples[key] = found
            self._samples.move_to_end(key)
            while len(self._samples) > SAMPLES_KEPT:
                self._samples.popitem(last=False)
        return found

    def sample(self, run_id: str, tree_id: str, leaf_id: str, selection: str | None, catalog=None):
        """The export's chat sample of a path and its conversation (a path the selection does not hold: its
        walk as of now, :func:`~engine.export.candidates.candidate_sample`), kept while the run's log is unchanged
        (``catalog``: the run's, open already; else one is opened when the sample is not kept)."""
        from engine.export.candidates import candidate_sample
        from engine.export.paths import sample_in
        from engine.export_formats import DEFAULT_WORKSPACE

        def make():
            log = EventLog(self.data_dir, run_id).require()
            with contextlib.nullcontext(catalog) if catalog else self.reader.open(run_id) as opened:
                try:
                    return sample_in(log, opened, tree_id, leaf_id, selection=selection)
                except (InputError, LogError):  # (no such path in it, or no selection yet)
                    if selection is not None:  # (a path of the selection named, which it does not hold)
                        raise
                # A path no selection holds (not selected, or the run selected none yet): its walk as of now.
                return candidate_sample(log, opened, tree_id, leaf_id, DEFAULT_WORKSPACE)

        return self._kept((self.fingerprint([run_id]), tree_id, leaf_id, selection), make)

    def feedback(self, run_id: str, turns: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """:func:`eval_feedback` of these turns, kept while the run's log is unchanged."""
        key = (self.fingerprint([run_id]), "feedback", frozenset(turns))
        return self._kept(key, lambda: eval_feedback(self.data_dir, run_id, turns))

    def kept_rows(self, run_id: str, what: str, make) -> Any:
        """What ``make()`` gives of a run (``what``), kept while the run's log is unchanged."""
        return self._kept((self.fingerprint([run_id]), what), make)

    def kept(self, run_id: str, tree_id: str, leaf_id: str, selection: str | None) -> bool:
        """Whether a path's sample is kept (as of the run's log now)."""
        with self._lock:
            return (self.fingerprint([run_id]), tree_id, leaf_id, selection) in self._samples

    def attempts(self, run_id: str, tree_id: str, node_id: str) -> dict[str, Any]:
        """The attempts from a node side by side (:func:`~engine.export.attempts.node_attempts`), each with the
        code it changed (:func:`~engine.web.code.changes`), kept while the run's log is unchanged."""
        from engine.export.attempts import node_attempts
        from engine.export_formats import DEFAULT_WORKSPACE
        from engine.web.code import changes

        def make():
            log = EventLog(self.data_dir, run_id).require()
            with self.reader.open(run_id) as catalog:
                shown = node_attempts(catalog, log, tree_id, node_id, DEFAULT_WORKSPACE)
                code = changes(catalog.query, tree_id, node_id, [a["edge_id"] for a in shown["attempts"]])
            for attempt in shown["attempts"]:
                attempt["code"] = code[attempt["edge_id"]]
                attempt["call_names"] = call_names([m["message"] for m in attempt["messages"] or []])
            return shown

        return self._kept((self.fingerprint([run_id]), "attempts", tree_id, node_id), make)

    def paths(self, run_id: str, tree_id: str, leaves: list[str]) -> dict[str, Any]:
        """Selected paths of a tree side by side from where their conversations part: each path's sample as
        ``export`` writes it, and the code each changed from the last node they share (:mod:`engine.web.code`)."""
        from engine.export.conversations import same_content
        from engine.web.code import diff, node_code

        kept = all(self.kept(run_id, tree_id, leaf, None) for leaf in leaves)
        with contextlib.nullcontext() if kept else self.reader.open(run_id) as catalog:
            samples = [self.sample(run_id, tree_id, leaf, None, catalog) for leaf in leaves]
        nodes = [[n["node_id"] for n in sample["metadata"]["nodes"]] for sample, _conv in samples]
        shared_nodes = [n[0] for n in itertools.takewhile(lambda n: len(set(n)) == 1, zip(*nodes, strict=False))]
        fork = shared_nodes[-1] if shared_nodes else tree_id
        runs = self.collection()

        def query(sql: str) -> Rows:
            return runs.query(sql, run_id)

        start = node_code(query, tree_id, fork)
        code = [diff(start, node_code(query, tree_id, leaf)) for leaf in leaves]
        messages = [sample["messages"] for sample, _conv in samples]
        shared = same_content(messages)
        columns = []
        for (sample, conv), leaf, changed in zip(samples, leaves, code, strict=True):
            system = len(sample["messages"]) - len(conv.owners)
            owners = [None] * system + list(conv.owners)
            own = [
                {"message": m, "owner": owners[i], "idx": i} for i, m in enumerate(sample["messages"]) if i >= shared
            ]
            names = call_names(sample["messages"])
            columns.append(
                {"leaf_id": leaf, "meta": sample["metadata"], "messages": own, "code": changed, "call_names": names}
            )
        return {"shared": messages[0][:shared], "fork": fork, "columns": columns}


def call_names(messages: list[dict[str, Any]]) -> dict[str, str | None]:
    """The tool each call of ``messages`` called, by call id (a tool message names the call it answers)."""
    return {c["id"]: (c.get("function") or {}).get("name") for m in messages for c in m.get("tool_calls") or []}


def collection_page(runs: Collection) -> dict[str, Rows]:
    """The runs, their tasks and the audit's tables over every run."""
    q = runs.query
    coverage = q(
        "select * from coverage where stratum in ('all', 'task', 'stage') order by run_id, "
        "list_position(['all', 'task', 'stage'], stratum), stage_order(stratum_key), stratum_key"
    )
    overall = {r["run_id"]: r for r in coverage if r["stratum"] == "all"}  # (coverage is the costly view: read once)
    runs_rows = q(
        "select r.run_id, r.task, r.backend, p.trees, p.trees_done, a.finished, a.started_at, a.run_seconds, "
        "k.tokens, k.cost "
        "from run_config as r join run_progress as p using (run_id) join run_pace as a using (run_id) "
        "left join run_cost as k using (run_id) order by r.run_id"
    )
    for r in runs_rows:
        r.update({k: overall.get(r["run_id"], {}).get(k) for k in ("roots", "selected_paths", "n_eff", "n_eff_ratio")})
    return {
        "runs": runs_rows,
        "coverage": coverage,
        "tasks": q("select * from cost_tasks order by task, run_id"),
        "learnability": q("select * from learnability where flagged order by run_id, tree_id"),
        "tool_errors": q("select * from tool_error_rates where dimension = 'tool' order by run_id, calls desc, key"),
        "tool_messages": q("select * from tool_error_messages order by errors desc, run_id, message limit 10"),
        "knowledge": q("select * from knowledge_usage where dimension = 'all' order by run_id, area, access"),
        "knowledge_improvement": q(
            "select * from knowledge_improvement order by run_id, task, measure, with_knowledge desc"
        ),
    }


def run_page(runs: Collection, run_id: str) -> dict[str, Any]:
    """One run: its config, progress, stop reasons, trees and selected paths."""
    run = sql_text(run_id)

    def q(sql: str) -> Rows:
        return runs.query(sql, run_id)  # that run's rows alone

    page = {
        "config": q(f"select task, backend, direction, seed, num_roots, top_k from run_config where run_id = {run}")[0],
        "progress": q(f"select * from run_progress where run_id = {run}")[0],
        "pace": q(f"select * from run_pace where run_id = {run}")[0],
        "stops": q(f"select stop_reason, trees from tree_stops where run_id = {run} order by stop_reason"),
        "trees": q(f"select * from trees where run_id = {run} order by status = 'done', tree_id"),
        "paths": q(
            "select p.*, c.turns, c.tokens, c.cost, c.wall_seconds from top_paths as p left join cost_paths as c "
            f"using (run_id, tree_id, leaf_id) where run_id = {run} order by tree_id, rank, leaf_id"
        ),
        "costs": q(f"select * from cost_roots where run_id = {run} order by tree_id"),
        "seq": q(f"select asof_seq from stg_log_tail where run_id = {run}")[0]["asof_seq"],
        "phases": q(f"select * from phase_times where run_id = {run} and phase <> 'wall' order by node, phase_order"),
    }
    page["in_flight"] = (
        []
        if page["pace"]["finished"]
        else q(f"select * from turns_in_flight where run_id = {run} order by since, tree_id, edge_id")
    )
    return page


def tree_page(runs: Collection, run_id: str, tree_id: str) -> dict[str, Any]:
    """One tree: its nodes with the edge that made each, their turns and tool calls, its paths and preference pairs."""
    scope = f"run_id = {sql_text(run_id)} and tree_id = {sql_text(tree_id)}"

    def q(sql: str) -> Rows:
        return runs.query(sql, run_id)

    trees = q(f"select * from trees where {scope}")
    nodes = q(
        "select n.*, e.verdict, e.soft, e.outcome, e.cleanliness, e.knowledge, e.regression_stability, "
        "e.tool_calls, e.tool_errors, e.steps, e.s1, e.s2 "
        f"from nodes as n left join edges as e using (run_id, tree_id, edge_id) where {scope} "
        "order by node_key(n.node_id)"
    )
    failed = q(f"select * from edges where {scope} and child_id is null order by started_seq")
    turns = q(f"select * from turns where {scope} order by edge_id, turn")
    calls = q(
        f"select edge_id, turn, step, call_id, tool, status, target, error from tool_calls where {scope} order by seq"
    )
    paths = q(f"select * from paths where {scope} order by rank nulls last, leaf_id")
    pairs = q(f"select * from pairs where {scope} order by node_key(node_id), chosen_id, rejected_id")
    attempts = q(
        f"select parent_id as node_id, count(*) as n from edges where {scope} and verdict is not null group by all"
    )
    cost = q(f"select * from cost_roots where {scope}")
    return {
        "tree": trees[0] if trees else None,
        "cost": cost[0] if cost else None,
        "costs": path_costs(runs, run_id, tree_id),
        "nodes": nodes,
        "failed": failed,
        "turns": turns,
        "calls": calls,
        "paths": paths,
        "pairs": pairs,
        "attempts": {r["node_id"]: r["n"] for r in attempts},
    }


def path_rows(runs: Collection, run_id: str, tree_id: str, leaf_id: str) -> dict[str, Any]:
    """A path's row of ``paths`` (selected or not, its rank), the run's PathScore weights, and the verdict of
    each edge on it with the parts that decided it (``path_turns``)."""
    scope = f"run_id = {sql_text(run_id)} and tree_id = {sql_text(tree_id)} and leaf_id = {sql_text(leaf_id)}"
    found = runs.query(f"select * from paths where {scope}", run_id)
    weights = runs.query(
        f"select w_path_max, w_path_avg, w_path_clean, w_path_know from run_config where run_id = {sql_text(run_id)}",
        run_id,
    )
    edges = runs.query(
        "select distinct node_id, depth, edge_id, verdict, s1, s2, soft, improved, edge_outcome, cleanliness, "
        f"knowledge, regression_stability from path_turns where {scope} and edge_id is not null order by depth",
        run_id,
    )
    return {"path": found[0] if found else None, "weights": weights[0] if weights else {}, "edges": edges}


def failures(runs: Collection, run_id: str, tree_id: str, edge_ids: list[str]) -> dict[tuple, dict[str, Any]]:
    """The ``failures`` of these attempts: a failed tool call under (edge_id, turn, call_id), a crashed or timed
    out eval under (edge_id, turn, None)."""
    if not edge_ids:
        return {}
    listed = ", ".join(sql_text(e) for e in edge_ids)
    rows = runs.query(
        f"select * from failures where run_id = {sql_text(run_id)} and tree_id = {sql_text(tree_id)} "
        f"and edge_id in ({listed}) order by seq",
        run_id,
    )
    return {(r["edge_id"], r["turn"], r["call_id"]): r for r in rows}


def turn_evals(runs: Collection, run_id: str, tree_id: str, edge_ids: list[str]) -> dict[tuple, dict[str, Any]]:
    """The ``turns`` rows of these attempts (each turn's eval: score and status), by (edge_id, turn)."""
    listed = ", ".join(sql_text(e) for e in edge_ids) or "null"
    rows = runs.query(
        f"select * from turns where run_id = {sql_text(run_id)} and tree_id = {sql_text(tree_id)} "
        f"and edge_id in ({listed})",
        run_id,
    )
    return {(r["edge_id"], r["turn"]): r for r in rows}


def mark_failures(items: list[dict[str, Any]], found: dict[tuple, dict[str, Any]], anchor) -> tuple[int, str | None]:
    """Mark the failures among ``items`` (messages, each with its ``owner`` (edge_id, turn) and ``ends`` when it
    is its turn's last): a tool result of a failed call gets ``failure`` (its row of ``failures``), a turn's last
    message ``eval_failure`` when its eval failed; each mark its element's id (``anchor(item)``: the message's)
    and the next mark's (``..._next``: a jump without script). The number of marks and the first one's id."""
    marks = []
    for it in items:
        owner, m = it.get("owner"), it["message"]
        if owner is None:
            continue
        if m.get("role") == "tool" and (row := found.get((*owner, m.get("tool_call_id")))) is not None:
            it["failure"] = row
            marks.append((it, "failure", anchor(it)))
        if it.get("ends") and (row := found.get((*owner, None))) is not None:
            it["eval_failure"] = row
            marks.append((it, "eval_failure", f"{anchor(it)}-eval"))
    following = [mark[2] for mark in marks[1:]] + [None]
    for (it, key, element), after in zip(marks, following, strict=False):
        it[f"{key}_id"], it[f"{key}_next"] = element, after
    return len(marks), marks[0][2] if marks else None


def path_costs(runs: Collection, run_id: str, tree_id: str) -> dict[str, dict[str, Any]]:
    """The ``cost_paths`` row of each selected path of a tree, by leaf."""
    scope = f"run_id = {sql_text(run_id)} and tree_id = {sql_text(tree_id)}"
    return {r["leaf_id"]: r for r in runs.query(f"select * from cost_paths where {scope}", run_id)}


def eval_feedback(data_dir: Path, run_id: str, turns: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """The grader's feedback of these turns' evals (a heavy column: read from the log, not a view)."""
    found: dict[tuple[str, int], str] = {}
    for batch in EventLog(data_dir, run_id).scan_kind("eval_finished", ["edge_id", "turn", "feedback"]):
        for row in batch.to_pylist():
            key = (row["edge_id"], row["turn"])
            if key in turns and row["feedback"]:
                found[key] = row["feedback"]
    return found


def campaigns_table(data_dir: Path, runs: Collection | None) -> tuple[Rows, list[str]]:
    """A row per campaign under ``data_dir`` (its policy, budget, tasks, rounds and state, and what its runs
    spent, from ``runs``), and what is damaged: a campaign whose log cannot be read is named with its
    diagnosis, the others still listed."""
    from engine.campaign.policy import spent as campaign_spent
    from engine.runset import campaign_names, open_campaign

    rows, damaged = [], []
    for name in campaign_names(data_dir):
        try:
            catalog = open_campaign(data_dir, name)
            config = catalog.query("select policy, budget_edges, budget_tokens from campaign_config")
            state = catalog.query("select rounds, stop_reason, finished from campaign_state")[0]
            tasks = [r["task_run"] for r in catalog.query("select task_run from campaign_tasks order by task_run")]
        except ProjectError as err:
            damaged.append(damaged_campaign(data_dir, name, err))
            continue
        spent = {"spent_edges": None, "spent_tokens": None}
        if runs is not None and tasks:
            listed = ", ".join(sql_text(t) for t in tasks)
            found = runs.query(f"select kept_edges, tokens from campaign_spend where run_id in ({listed})")
            if found:  # (the campaign's spend: policy.spent, the one sum over its runs)
                spent = dict(zip(("spent_edges", "spent_tokens"), campaign_spent(found), strict=True))
        rows.append({"campaign": name, **(config[0] if config else {}), "tasks": len(tasks), **state, **spent})
    return rows, damaged


def damaged_campaign(data_dir: Path, name: str, err: Exception) -> str:
    """What a campaign that cannot be read says: what is damaged, and the command that looks at it (the
    error's own, when it names one)."""
    command = command_line(data_dir, "verify", name)
    hint = "" if command in str(err) else f" - look at it: {command}"
    return f"campaign {name} is damaged and was not read: {err}{hint}"


def campaign_page(data_dir: Path, name: str, runs: Collection) -> dict[str, Any]:
    """A campaign: its summary per task (the command's), its budget and its rounds with what the runs had
    spent when each read them (``spend_curve`` at the round's marks), and every block it granted."""
    from engine.campaign.command import campaign_result
    from engine.campaign.policy import spent as campaign_spent
    from engine.runset import open_campaign

    result = campaign_result(data_dir, name, resumed=False, collection=runs)
    catalog = open_campaign(data_dir, name)
    rounds = catalog.query(
        "select seq, round, rule, blocks, edges, granted_edges, reason, marks from campaign_rounds order by seq"
    )
    marks = [(r["seq"], run_id, seq) for r in rounds for run_id, seq in json.loads(r["marks"] or "{}").items()]
    spent: dict[int, dict[str, Any]] = {}
    if marks and all(run_id in runs.run_ids for _seq, run_id, _mark in marks):  # (a run left out: not known)
        values = ", ".join(f"({int(seq)}, {sql_text(run_id)}, {int(mark)})" for seq, run_id, mark in marks)
        found = runs.query(
            f"with m(seq, run_id, mark) as (values {values}) "
            "select m.seq, coalesce(s.kept_edges, 0) as kept_edges, coalesce(s.tokens, 0) as tokens "
            "from m asof left join spend_curve as s on m.run_id = s.run_id and m.mark >= s.seq"  # (none: 0)
        )
        by_round: dict[int, list[dict[str, Any]]] = {}
        for r in found:
            by_round.setdefault(r["seq"], []).append(r)
        spent = {
            seq: dict(zip(("spent_edges", "spent_tokens"), campaign_spent(rows), strict=True))
            for seq, rows in by_round.items()
        }
    for r in rounds:
        r.update({k: spent.get(r["seq"], {}).get(k) for k in ("spent_edges", "spent_tokens")})
    budget = catalog.query("select budget_edges, budget_tokens from campaign_config")
    return {
        "result": result,
        "budget": budget[0] if budget else {},
        "rounds": rounds,
        "grants": catalog.query(
            "select round, rule, task, task_run as run_id, tree_id, edges, gain from campaign_grants "
            "order by seq, task_run, tree_id"
        ),
    }
