"""The HTML report of runs: every tree drawn, and the audit's figures as charts, in one file.

Everything shown is a row of a view, read through a :class:`~engine.collection.Collection`
(the numbers `audit` prints); this module only lays it out. The file is self-contained:
inline SVG and CSS, a few lines of inline script for the details panel, nothing fetched
when it is opened. A tree is drawn left to right, root at the left: a node's colour is
its score against the root's (green above, red below, grey without a score), a line's
style its edge's verdict, the selected paths in blue; attempts that made no node
(pruned, retried) hang off their parent as small crosses. Hovering a node or a cross
shows its details (an SVG title), clicking one puts them in the panel.
"""

from __future__ import annotations

import functools
import html
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.collection import Collection
from engine.trees import DRAWN, TreeRows, trees_by_run
from ingest.paths import write_atomically
from ingest.text import sql_text

Row = dict[str, Any]
ROW_PX, DEPTH_PX, LEFT_PX, TOP_PX = 16, 130, 14, 12
VERDICT_STYLE = {"kept": "k", "kept_exempt": "x", "pruned": "p", "retry": "r", None: "f"}
LEAF_MARK = {"depth": "d", "token": "t", "exhausted": "e", "stopped": "s"}

CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222;background:#fff}
h1{font-size:20px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ccc}h3{font-size:14px;margin:14px 0 4px}
table{border-collapse:collapse;margin:6px 0}td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.trees,.charts{display:flex;flex-wrap:wrap;gap:18px}.card{border:1px solid #ddd;padding:6px;border-radius:4px}
svg.tree line{stroke:#999;stroke-width:1.3}svg.tree line.x{stroke-dasharray:4 3}
svg.tree line.sel{stroke:#1f5fbf;stroke-width:3}svg.tree g{cursor:pointer}
svg.tree circle{stroke:#333;stroke-width:.8}
svg.tree g.sel circle{stroke:#1f5fbf;stroke-width:2.4}
svg.tree text{font-size:9px;fill:#444}
svg.tree path.p{stroke:#c62828;stroke-width:2}
svg.tree path.r{stroke:#ef8f00;stroke-width:2}svg.tree path.f{stroke:#777;stroke-width:2}
svg.chart text{font-size:10px;fill:#333}svg.chart rect.a{fill:#7aa6e0}svg.chart rect.b{fill:#1f5fbf}
svg.chart polyline{fill:none;stroke:#1f5fbf;stroke-width:2}svg.chart line{stroke:#bbb}
#panel{position:fixed;right:12px;bottom:12px;max-width:380px;white-space:pre-wrap;background:#fffbe6;
border:1px solid #e0c060;padding:8px;font:12px monospace;display:none}
.legend span{margin-right:14px}.sw{display:inline-block;width:10px;height:10px;border-radius:5px;margin-right:3px}
"""
SCRIPT = """
document.addEventListener('click',function(e){
var g=e.target.closest('svg.tree g');var p=document.getElementById('panel');
if(!g){p.style.display='none';return;}
var t=g.querySelector('title');p.textContent=t?t.textContent:'';p.style.display='block';});
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}f}"
    return str(value)


def _table(rows: list[Row], columns: list[str]) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_e(_num(r.get(c)))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


# ---------------------------------------------------------------- charts


def bar_chart(title: str, rows: list[tuple[str, float, float | None]], fmt: str = "{:.0f}") -> str:
    """Horizontal bars: (label, value[, second value drawn beside it])."""
    if not rows:
        return (
            f'<svg class="chart" data-chart="{_e(title)}" width="360" height="20">'
            '<text x="0" y="14">no data</text></svg>'
        )
    top = max(max(v, w or 0) for _, v, w in rows) or 1
    h = 18 * len(rows) + 6
    out = [f'<svg class="chart" data-chart="{_e(title)}" width="420" height="{h}">']
    for i, (label, value, second) in enumerate(rows):
        y = 4 + 18 * i
        out.append(f'<text x="0" y="{y + 11}">{_e(label)}</text>')
        out.append(f'<rect class="a" x="120" y="{y}" width="{220 * value / top:.1f}" height="7"/>')
        if second is not None:
            out.append(f'<rect class="b" x="120" y="{y + 7}" width="{220 * second / top:.1f}" height="7"/>')
        shown = fmt.format(value) + ("" if second is None else " / " + fmt.format(second))
        out.append(f'<text x="346" y="{y + 11}">{_e(shown)}</text>')
    out.append("</svg>")
    return "".join(out)


def curve_chart(points: list[tuple[int, float]]) -> str:
    """N_eff(N), with the line N_eff = N (independent paths) for reference."""
    w, h, pad = 360, 200, 30
    if not points:
        return '<svg class="chart" data-chart="neff" width="360" height="20"><text x="0" y="14">no paths</text></svg>'
    top = max(n for n, _ in points)
    sx = lambda n: pad + (w - pad - 8) * n / top  # noqa: E731
    sy = lambda v: h - pad - (h - pad - 8) * v / top  # noqa: E731
    line = " ".join(f"{sx(n):.1f},{sy(v):.1f}" for n, v in [(0, 0.0), *points])
    return (
        f'<svg class="chart" data-chart="neff" width="{w}" height="{h}">'
        f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(top)}" y2="{sy(top)}" stroke-dasharray="4 3"/>'
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - 8}" y2="{h - pad}"/>'
        f'<line x1="{pad}" y1="8" x2="{pad}" y2="{h - pad}"/>'
        f'<polyline points="{line}"/><text x="{pad}" y="{h - 10}">N = 0</text>'
        f'<text x="{w - 70}" y="{h - 10}">N = {top}</text>'
        f'<text x="{pad + 4}" y="18">N_eff = {points[-1][1]:.1f} at N = {points[-1][0]}</text></svg>'
    )


# ------------------------------------------------------------------ trees


def _colour(score: float | None, root: float | None, spread: float, sign: float) -> str:
    if score is None or root is None:
        return "#cccccc"
    x = max(-1.0, min(1.0, sign * (score - root) / spread)) if spread else 0.0
    if x >= 0:
        return f"#{int(255 - 150 * x):02x}{int(255 - 60 * x):02x}{int(255 - 150 * x):02x}"
    return f"#{int(255 + 20 * x):02x}{int(255 + 150 * x):02x}{int(255 + 150 * x):02x}"


def tree_svg(tree: Row, drawn: TreeRows, sign: float) -> str:
    """One tree as inline SVG (see the module docstring)."""
    nodes, turns, on_path = drawn.nodes, drawn.turns_by_edge, drawn.on_path
    children: dict[str, list[Row]] = defaultdict(list)
    by_id = {n["node_id"]: n for n in nodes}
    for n in nodes:
        if n["parent_id"]:
            children[n["parent_id"]].append(n)
    failed, creating = drawn.failed, drawn.creating
    rows: dict[str, float] = {}
    marks: list[tuple[Row, float]] = []
    counter = [0]

    def place(node_id: str) -> float:  # leaves and crosses take rows in id order; a parent sits between
        ys = [place(c["node_id"]) for c in children[node_id]]
        for e in failed[node_id]:
            marks.append((e, float(counter[0])))
            ys.append(float(counter[0]))
            counter[0] += 1
        if not ys:
            ys = [float(counter[0])]
            counter[0] += 1
        rows[node_id] = sum(ys) / len(ys)
        return rows[node_id]

    root_id = tree["tree_id"]
    place(root_id)
    root_score = tree["root_score"]
    scored = [n["score"] for n in nodes if n["score"] is not None]
    spread = max((abs(s - root_score) for s in scored), default=0.0) if root_score is not None else 0.0
    xy = {k: (LEFT_PX + DEPTH_PX * by_id[k]["depth"], TOP_PX + ROW_PX * y) for k, y in rows.items()}
    height = TOP_PX * 2 + ROW_PX * max(counter[0], 1)
    width = LEFT_PX + DEPTH_PX * (max(n["depth"] for n in nodes) + 1)
    out = [f'<svg class="tree" data-tree="{_e(root_id)}" width="{width}" height="{height}">']
    for node_id, (x, y) in xy.items():
        parent = by_id[node_id]["parent_id"]
        if parent:
            px, py = xy[parent]
            edge = creating.get(node_id, {})
            cls = " ".join(
                c
                for c in (
                    VERDICT_STYLE.get(edge.get("verdict")),
                    "sel" if node_id in on_path and parent in on_path else "",
                )
                if c
            )
            out.append(f'<line class="{cls}" x1="{px}" y1="{py}" x2="{x}" y2="{y}"/>')
    for e, y in marks:
        px, py = xy[e["parent_id"]]
        cx, cy = px + 36, TOP_PX + ROW_PX * y
        out.append(f'<line class="x" x1="{px}" y1="{py}" x2="{cx}" y2="{cy}"/>')
        tip = _edge_tip(e, turns.get(e["edge_id"], []))
        cross = f'<path class="{VERDICT_STYLE.get(e["verdict"])}" d="M{cx - 4} {cy - 4}l8 8m0 -8l-8 8"/>'
        out.append(f'<g class="a" data-edge="{_e(e["edge_id"])}"><title>{_e(tip)}</title>{cross}</g>')
    for node_id, (x, y) in xy.items():
        n = by_id[node_id]
        sel = " sel" if node_id in on_path else ""
        tip = _node_tip(n, creating.get(node_id), turns, root_score)
        colour = _colour(n["score"], root_score, spread, sign) if n["depth"] else "#ffffff"
        label = node_id[len(root_id) :] or root_id
        mark = f" {LEAF_MARK[n['leaf_reason']]}" if n["leaf_reason"] in LEAF_MARK else ""
        out.append(
            f'<g class="n{sel}" data-node="{_e(node_id)}"><title>{_e(tip)}</title>'
            f'<circle cx="{x}" cy="{y}" r="5.5" fill="{colour}"/>'
            f'<text x="{x + 7}" y="{y - 4}">{_e(label + mark)}</text></g>'
        )
    out.append("</svg>")
    return "".join(out)


def _edge_tip(e: Row, turns: list[Row]) -> str:
    lines = [
        f"edge {e['edge_id']}: {e['verdict'] or 'in flight'}, tok {e['tok']}",
        f"soft {_num(e['soft'], 3)}: outcome {_num(e['outcome'], 2)}, clean {_num(e['cleanliness'], 2)}, "
        f"know {_num(e['knowledge'], 2)}, stability {_num(e['regression_stability'], 2)}",
        f"tools {e['tool_calls']}, errors {e['tool_errors']}",
    ]
    for t in sorted(turns, key=lambda t: t["turn"]):
        if t["skipped"]:
            lines.append(f"turn {t['turn']}: skipped")
        else:
            lines.append(
                f"turn {t['turn']}: eval {_num(t['score'])} {t['eval_status']}, "
                f"{t['knowledge_actions']} knowledge, {t['steps']} steps"
            )
    return "\n".join(lines)


def _node_tip(n: Row, edge: Row | None, turns: dict[str, list[Row]], root_score: float | None) -> str:
    head = f"node {n['node_id']}: score {_num(n['score'])}"
    if n["score"] is not None and root_score is not None:
        head += f" ({n['score'] - root_score:+.4f} vs root)"
    lines = [head + (f", leaf: {n['leaf_reason']}" if n["leaf_reason"] else "")]
    if edge:
        lines.append(_edge_tip(edge, turns.get(edge["edge_id"], [])))
    return "\n".join(lines)


# ----------------------------------------------------------------- report


def drawn_trees(runs: Collection, run_id: str, tree_id: str | None = None) -> list[tuple[Row, str, int]]:
    """The trees of a run (or its one tree ``tree_id``) that have nodes, each with its drawing and node count."""
    where = f"run_id = {sql_text(run_id)}" + ("" if tree_id is None else f" and tree_id = {sql_text(tree_id)}")
    return _drawings(lambda sql: runs.query(sql, run_id), where).get(run_id, [])  # that run's files alone


def _drawings(query: Callable[[str], list[Row]], where: str) -> dict[str, list[tuple[Row, str, int]]]:
    """By run: the trees matching ``where`` that have nodes, each with its drawing and node count (``query``
    reads the rows of the runs drawn alone)."""
    signs = {r["run_id"]: float(r["sign"]) for r in query("select run_id, sign from run_config")}  # (query's runs)
    rows_of = trees_by_run(query, where)
    out: dict[str, list[tuple[Row, str, int]]] = defaultdict(list)
    for t in query(f"select * from trees where {where} order by run_id, tree_id"):
        drawn = rows_of.get(t["run_id"], {}).get(t["tree_id"])
        if drawn is not None:
            out[t["run_id"]].append((t, tree_svg(t, drawn, signs[t["run_id"]]), len(drawn.nodes)))
    return out


LEGEND = (
    '<p class="legend"><span><i class="sw" style="background:#69c369"></i>above the root</span>'
    '<span><i class="sw" style="background:#eb6969"></i>below</span><span><i class="sw" '
    'style="background:#ccc"></i>no score</span><span>blue: selected paths</span><span>dashed: kept '
    "exempt</span><span>crosses: pruned (red), retried (orange)</span><span>leaves: d depth, t token, "
    "e exhausted, s stopped</span></p>"
)


# What a run's section shows, each read for a batch of runs at once (``{runs}``: their ids): a
# query a view for the batch, not one a run (100 runs: 1,500 queries took 9.5 of the 14 s).
SECTION_QUERIES = {
    "trees": "select run_id, tree_id from trees where run_id in ({runs})",
    "stages": "select * from coverage where run_id in ({runs}) and stratum = 'stage' "
    "order by run_id, stage_order(stratum_key), stratum_key",
    "overall": "select * from coverage where run_id in ({runs}) and stratum = 'all'",
    "curve": "select run_id, n, n_eff from coverage_curve where run_id in ({runs}) and scope = 'pooled' "
    "order by run_id, n",
    "tools": "select * from tool_error_rates where run_id in ({runs}) and dimension = 'tool' "
    "order by run_id, calls desc, key",
    "knowledge": "select * from knowledge_usage where run_id in ({runs}) and dimension = 'all' "
    "order by run_id, area, access",
    "costs": "select * from cost_roots where run_id in ({runs}) order by run_id, tree_id",
    "phases": "select * from phase_times where run_id in ({runs}) order by run_id, node, phase_order",
    "pairs": "select * from supervision_counts where run_id in ({runs}) order by run_id, selection_id, task, stage",
}
BATCH_RUNS = 16  # runs read by one query a view: a few queries a collection, the rows of 16 runs held at once


def _sections(runs: Collection) -> list[str]:
    """Every run's section, in run order, read a batch of runs at a time."""
    out = []
    for at in range(0, len(runs.run_ids), BATCH_RUNS):
        batch = tuple(runs.run_ids[at : at + BATCH_RUNS])
        listed = ", ".join(sql_text(r) for r in batch)
        rows: dict[str, dict[str, list[Row]]] = {r: defaultdict(list) for r in batch}
        for name, sql in SECTION_QUERIES.items():
            for row in runs.query(sql.format(runs=listed), batch):  # (their files alone)
                rows[row["run_id"]][name].append(row)
        drawings = _drawings(functools.partial(runs.query, run_id=batch), f"run_id in ({listed})")
        out += [_run_section(run_id, rows[run_id], drawings.get(run_id, [])) for run_id in batch]
    return out


def _run_section(run_id: str, rows: dict[str, list[Row]], drawings: list[tuple[Row, str, int]]) -> str:
    trees, stages, overall, curve, tools = rows["trees"], rows["stages"], rows["overall"], rows["curve"], rows["tools"]
    knowledge, costs, phases, pairs = rows["knowledge"], rows["costs"], rows["phases"], rows["pairs"]
    o = overall[0] if overall else {}
    parts = [
        f'<section class="run" data-run="{_e(run_id)}"><h2>run {_e(run_id)}</h2>',
        f"<p>{len(trees)} trees; {o.get('selected_paths', 0)} selected paths, N_eff {_num(o.get('n_eff'), 2)}, "
        f"N_eff/N {_num(o.get('n_eff_ratio'), 3)}</p>",
        '<div class="charts"><div><h3>stage coverage: roots (light), selected paths (dark)</h3>',
        bar_chart("stages", [(s["stratum_key"], s["roots"], s["selected_paths"]) for s in stages]),
        "</div><div><h3>N_eff(N): paths added by PathScore (dashed: all independent)</h3>",
        curve_chart([(c["n"], c["n_eff"]) for c in curve]),
        "</div><div><h3>tool-error rate by tool (%)</h3>",
        bar_chart("tool errors", [(t["key"], 100 * t["error_rate"], None) for t in tools], "{:.1f}"),
        "</div><div><h3>knowledge actions by area and access</h3>",
        bar_chart("knowledge", [(f"{k['area']} {k['access']}", k["actions"], None) for k in knowledge]),
        f"</div></div><details{' open' if len(costs) <= 40 else ''}><summary>tokens and cost per root</summary>",
        _table(
            costs,
            ["tree_id", "stage", "turns", "steps", "tokens", "cost", "selected_paths", "tokens_per_selected_path"],
        ),
        "</details>",
        *(
            [
                "<details open><summary>where the turns' time goes (seconds; node * is every node)</summary>",
                _table(phases, ["node", "phase", "turns", "p50_seconds", "p95_seconds", "share"]),
                "</details>",
            ]
            if phases
            else []
        ),
        *(
            [
                "<details open><summary>preference pairs and labels, by recorded rule (pair_n_eff: the pairs' "
                "independent comparisons; export --format dpo|kto|steps)</summary>",
                _table(
                    pairs,
                    [
                        "selection_id",
                        "task",
                        "stage",
                        "pairs",
                        "fork_points",
                        "pair_n_eff",
                        "good",
                        "bad",
                        "step_paths",
                    ],
                ),
                "</details>",
            ]
            if pairs
            else []
        ),
        f'<h3>trees</h3>{LEGEND}<div class="trees">',
    ]
    for t, drawing, _nodes in drawings:
        parts.append(
            f'<div class="card"><b>{_e(t["tree_id"])}</b> {_e(t["stage"] or "")} · root '
            f"{_num(t['root_score'])} → best {_num(t['best_score'])} · {_e(t['stop_reason'] or t['status'])}"
            f"<br>{drawing}</div>"
        )
    parts.append("</div></section>")
    return "".join(parts)


def build(runs: Collection) -> str:
    """The report of every run of the collection, as one HTML document."""
    summary = (
        "select c.run_id, r.task, c.roots, c.selected_paths, c.n_eff, c.n_eff_ratio, k.tokens, k.cost "
        "from coverage as c join run_config as r using (run_id) "
        "left join run_cost as k using (run_id) where c.stratum = 'all' order by c.run_id"
    )
    section = [q.format(runs="''") for q in SECTION_QUERIES.values()]
    runs.read_ahead([summary, *section, *(f"select * from {view}" for view in ("trees", *DRAWN))])  # (one evaluation)
    overview = runs.query(summary)
    sections = _sections(runs)
    collection = ""
    if len(runs.run_ids) > 1:
        collection = "<h2>collection</h2>" + _table(
            overview, ["run_id", "task", "roots", "selected_paths", "n_eff", "n_eff_ratio", "tokens", "cost"]
        )
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>teacher-mcts report</title>"
        f"<style>{CSS}</style></head><body><h1>teacher-mcts report: {_e(', '.join(runs.run_ids))}</h1>"
        f"{collection}{''.join(sections)}<div id=panel></div><script>{SCRIPT}</script></body></html>"
    )


def write_report(runs: Collection, out: Path) -> int:
    """Write the report to ``out`` atomically; its size in bytes."""
    text = build(runs).encode()
    write_atomically(Path(out), text, "the report")
    return len(text)
