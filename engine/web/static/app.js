// The web app's one script: no build step, nothing fetched but this server's pages.
"use strict";

// Every link of a page keeps its prefix: /t/<token> under the capability prefix (engine/web/gate.py).
const BASE = ((document.currentScript && document.currentScript.getAttribute("src")) || "")
  .replace(/\/static\/app\.js$/, "");

// This origin's own storage (no other port's page can read it, and it is never sent) keeps the token, so
// that an address typed without it is forwarded by the gate page to the same page under the prefix.
if (BASE.startsWith("/t/")) {
  try { localStorage.setItem("teacher-mcts-token", BASE.slice(3)); } catch (e) { /* storage refused: no forwarding */ }
}

// Run page: follow the run as parts land (server-sent events), replacing the part of
// the page that shows it, without a reload; stop once the run has finished.
function followRun(live) {
  const run = live.dataset.run;
  const state = document.getElementById("state");
  const base = BASE + "/run/" + encodeURIComponent(run);
  let chain = Promise.resolve();
  const refresh = () => {
    chain = chain.then(() => fetch(base + "/live", {cache: "no-store"}))
      .then((r) => r.text()).then((html) => { live.innerHTML = html; })
      .catch(() => { state.textContent = "disconnected"; });
    return chain;
  };
  const finished = () => live.querySelector('.live-section[data-finished="true"]') !== null;
  // (a static bundle, opened from disk: engine/web/bundle.py, has no server to follow)
  if (finished() || location.protocol === "file:") { state.textContent = ""; return; }
  state.textContent = "updating as parts land";
  const events = new EventSource(base + "/events");
  events.addEventListener("frame", refresh);
  events.addEventListener("end", () => {
    events.close();
    refresh().then(() => { state.textContent = ""; });
  });
  events.addEventListener("problem", (e) => {
    events.close();
    state.textContent = "stopped following: " + JSON.parse(e.data).message;
  });
  events.onerror = () => { if (events.readyState === EventSource.CLOSED) state.textContent = "disconnected"; };
}

// Tree page: a node (in the drawing, or its row) opens the turns of the edge that made it.
function openNode(id, scroll) {
  const body = document.getElementById("node-" + id);
  if (!body) return false;
  const row = body.querySelector("tr.turns");
  const button = body.querySelector("button.open");
  const open = row.hidden;
  row.hidden = !open;
  button.setAttribute("aria-expanded", String(open));
  document.querySelectorAll("tbody.node.current").forEach((b) => b.classList.remove("current"));
  body.classList.add("current");
  if (scroll) body.scrollIntoView({block: "start", behavior: "smooth"});
  return true;
}

// A sortable table: a click on a column's name sorts its rows by that column (numbers as numbers,
// "-" last), a second click the other way.
function sortBy(th) {
  const table = th.closest("table");
  const body = table.tBodies[0];
  const col = [...th.parentNode.children].indexOf(th);
  const down = th.getAttribute("aria-sort") === "ascending";
  const key = (row) => {
    const text = (row.cells[col] || {textContent: ""}).textContent.trim();
    const n = Number(text.replace(/,/g, ""));
    return text === "-" || text === "" ? null : (Number.isNaN(n) ? text : n);
  };
  const rows = [...body.rows].filter((r) => r.cells.length > 1);
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === null || y === null) return (x === null) - (y === null);
    const c = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === "number" ? -1 : 1);
    return down ? -c : c;
  });
  rows.forEach((r) => body.appendChild(r));
  table.querySelectorAll("th[aria-sort]").forEach((h) => h.removeAttribute("aria-sort"));
  th.setAttribute("aria-sort", down ? "descending" : "ascending");
}

document.addEventListener("click", (e) => {
  const heading = e.target.closest("table.sortable thead th");
  if (heading) { sortBy(heading); return; }
  const node = e.target.closest("svg.tree g[data-node]");
  if (node) {
    const id = node.dataset.node;
    if (!openNode(id, true)) {  // the run page: go to the tree's page (its card's link)
      const card = node.closest(".card[data-tree]");
      const link = card && card.querySelector("a[href]");
      if (link) location.href = link.href.replace(/#.*$/, "") + "#node-" + encodeURIComponent(id);
    }
    return;
  }
  const cross = e.target.closest("svg.tree g[data-edge]");
  const panel = document.getElementById("panel");
  if (cross) {
    const title = cross.querySelector("title");
    panel.textContent = title ? title.textContent : "";
    panel.style.display = "block";
    return;
  }
  if (panel) panel.style.display = "none";
  const button = e.target.closest("button.open");
  if (button) openNode(button.closest("tbody.node").dataset.node, false);
});

document.addEventListener("DOMContentLoaded", () => {
  const live = document.getElementById("live");
  if (live) followRun(live);
  if (location.hash.startsWith("#node-")) openNode(decodeURIComponent(location.hash.slice(6)), true);
});

// A link to something inside a folded turn (the outline, a "next failure") opens its folds first
// (without this script the browser still jumps to the fold's heading; a click opens it).
function openTarget() {
  const id = decodeURIComponent(location.hash.slice(1));
  const target = id && document.getElementById(id);
  if (!target) return;
  let opened = false;
  for (let d = target.closest("details"); d; d = d.parentElement && d.parentElement.closest("details")) {
    if (!d.open) { d.open = true; opened = true; }
  }
  if (opened) target.scrollIntoView();
}
window.addEventListener("hashchange", openTarget);
document.addEventListener("DOMContentLoaded", openTarget);
