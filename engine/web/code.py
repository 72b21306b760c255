"""The code each attempt changed: the diff between its node's recorded code state and the attempt's.

A turn's recorded state (``TurnFinished.state``) names the tree's repository and the
commit its worktree ended at; a node's code is its creating edge's last turn's commit,
a root's the repository's own commit (made from the snapshot's code when the tree
started). The diff is read from that repository with git: a run whose backend records
no code (the simulator), or whose repository is not on this machine any more, says so.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from ingest.text import sql_text

COMMIT = re.compile(r"[0-9a-f]{7,64}")  # a git object name, as the backend records it
MAX_CHARS = 200_000  # of a diff shown (the rest is cut, and said so)


# A repository a log names may come with a data directory from elsewhere: its config must run nothing
# here (a textconv or external diff driver, an fsmonitor hook would run as the reader).
SAFE = ("-c", "core.quotepath=off", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")


def _git(repo: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", repo, *SAFE, *args], capture_output=True, text=True, errors="replace")


def _code(state: Any) -> tuple[str, str] | None:
    """The (repository, commit) a recorded state names, or None."""
    held = json.loads(state) if isinstance(state, str) else state
    if isinstance(held, dict) and held.get("repo") and COMMIT.fullmatch(str(held.get("commit") or "")):
        return str(held["repo"]), str(held["commit"])
    return None  # (a commit that is not an object name is never handed to git: it could be an option)


def node_code(query, tree_id: str, node_id: str) -> tuple[str, str] | None:
    """The (repository, commit) of a node's code: its creating edge's last turn's; a root's, its repository's
    own commit (None: the run recorded no code, or the repository is gone). ``query(sql)``: the run's rows."""
    if node_id != tree_id:
        scope = f"tree_id = {sql_text(tree_id)} and node_id = {sql_text(node_id)}"
        made = query(f"select state from int_nodes__created where {scope}")
        return _code(made[0]["state"]) if made and made[0]["state"] else None
    for row in query(f"select state from stg_turn_finished where tree_id = {sql_text(tree_id)} order by seq limit 1"):
        found = _code(row["state"])
        if found is not None:
            head = _git(found[0], "rev-parse", "HEAD")
            return (found[0], head.stdout.strip()) if head.returncode == 0 else None
    return None


def changes(query, tree_id: str, node_id: str, edge_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each attempt's code change from the node: ``files`` (git's numstat rows), ``diff`` (text) or ``why`` not.

    ``query(sql)``: the run's rows (its catalog's, or the collection's of that run alone).
    """
    ends = {
        r["edge_id"]: _code(r["state"])
        for r in query(
            "select edge_id, arg_max(state, turn) as state from stg_turn_finished "
            f"where tree_id = {sql_text(tree_id)} group by all"
        )
        if r["edge_id"] in edge_ids
    }
    start = node_code(query, tree_id, node_id)
    return {edge_id: diff(start, ends.get(edge_id)) for edge_id in edge_ids}


def diff(before: tuple[str, str] | None, after: tuple[str, str] | None) -> dict[str, Any]:
    """The change from one recorded code state to another: ``files``, ``diff`` (text), or ``why`` there is none."""
    if after is None:
        return {"why": "this run's backend recorded no code state (the simulator records none)"}
    if before is None:
        return {"why": f"the starting code is not in {after[0]} any more (removed, or not on this machine)"}
    return _diff(after[0], before[1], after[1])


def _diff(repo: str, before: str, after: str) -> dict[str, Any]:
    for commit in (before, after):
        if _git(repo, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            return {"why": f"commit {commit[:12]} is not in {repo} (removed, or not on this machine)"}
    stat = _git(repo, "diff", "--numstat", "--no-renames", "--no-ext-diff", "--no-textconv", before, after)
    patch = _git(repo, "diff", "--no-color", "--no-renames", "--no-ext-diff", "--no-textconv", before, after)
    if stat.returncode != 0 or patch.returncode != 0:
        return {"why": f"git diff failed in {repo}: {(stat.stderr or patch.stderr).strip()[:300]}"}
    files = []
    for line in stat.stdout.splitlines():
        added, removed, name = line.split("\t", 2)
        files.append({"file": name, "added": added, "removed": removed})
    text = patch.stdout
    cut = len(text) > MAX_CHARS
    return {"before": before, "after": after, "files": files, "diff": text[:MAX_CHARS], "cut": cut, "chars": len(text)}
