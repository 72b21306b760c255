-- Shared SQL macros, created before every view.

-- Mid-rank percentile of ALGORITHM §2: (#{v<x} + 0.5·(#{v=x} − 1)) / (|P| − 1), 0.5 when |P| = 1.
-- Arguments are the counts, usually window aggregates over the population.
create or replace macro pct(n_less, n_equal, n_total) as
    case
        when n_total <= 1 then 0.5
        else (n_less + 0.5 * (n_equal - 1)) / (n_total - 1)
    end;

-- The oriented score o(s) of ALGORITHM §0: s for maximize, -s for minimize (the one rule of
-- orientation: run_config.sign, which views multiply by to orient back, is oriented(1.0, direction)).
create or replace macro oriented(s, direction) as
    case when direction = 'minimize' then -s else s end;

-- The stages of a root's snapshot in their order (ALGORITHM §1.7): the one stage order of the views
-- and of the SQL Python runs (ingest.snapshots.STAGES is the same list in Python, and tests check
-- that the two agree).
create or replace macro stages() as ['early', 'middle', 'late'];

-- A stage's position in that order: 1 for early ... (null for what is not a stage).
create or replace macro stage_order(stage) as list_position(stages(), stage);

-- The layer of an edge from its parent node id: the parent's depth (its dots) + 1.
create or replace macro edge_layer(parent_id) as
    length(parent_id) - length(replace(parent_id, '.', '')) + 1;

-- The id of an edge attempt: <parent>/e<slot>-<attempt> (ALGORITHM §6; ingest.events.edge_id is
-- the same format in Python, and tests check that the two agree).
create or replace macro edge_id(parent_id, slot, attempt) as
    parent_id || '/e' || slot || '-' || attempt;

-- The parts of an edge attempt id: a struct of parent_id, slot and attempt.
create or replace macro edge_parts(edge_id) as
    cast(
        regexp_extract(edge_id, '^(.+)/e(\d+)-(\d+)$', ['parent_id', 'slot', 'attempt'])
        as struct(parent_id varchar, slot integer, attempt integer)
    );

-- Whether a preference pair goes against the tree's verdicts (ALGORITHM §3): its chosen attempt
-- failed the prune test (verdict pruned, retry, or kept only by an exemption) and its rejected one
-- passed it (kept).
create or replace macro against_verdict(chosen_verdict, rejected_verdict) as
    chosen_verdict in ('pruned', 'retry', 'kept_exempt') and rejected_verdict = 'kept';

-- Whether a selection decision's row is the one its selection id stands for: a selection id
-- recorded twice (a reselection under the same id) keeps its latest record.
create or replace macro latest_record(run_id, selection_id, seq) as
    row_number() over (partition by run_id, selection_id order by seq desc) = 1;

-- Numeric ordering key of a node id "T.2.10" -> [2, 10] so that T.2 < T.10.
create or replace macro node_key(node_id) as
    list_transform(string_split(node_id, '.')[2:], lambda x: cast(x as integer));

-- Whether two recorded numbers differ beyond float noise (1e-9). Equal values never
-- differ, infinities and NaN included (DuckDB holds NaN = NaN; inf - inf is NaN).
create or replace macro differs(a, b) as
    a <> b and abs(a - b) > 1e-9;

-- Whether an event belongs to the log prefix the catalog shows: seq <= the
-- watermark variable (every event when it is unset). Staging views filter with it.
create or replace macro in_prefix(seq) as
    seq <= coalesce(getvariable('watermark'), 9223372036854775807);

-- Whether a tree's events are in scope: always, except while the catalog refreshes
-- the materialized rows of some trees (variable refresh_trees), when staging views
-- return only those trees' events so that nothing else is scanned or joined.
create or replace macro in_scope(tree_id) as
    coalesce(list_contains(getvariable('refresh_trees'), tree_id), true);

-- Whether two recorded numbers that may be missing differ: one missing and not the
-- other, or both present and differing (the macro differs).
create or replace macro differs_or_missing(a, b) as
    coalesce(differs(a, b), (a is null) <> (b is null));

-- An error message with what varies from call to call (paths, hex ids, numbers, quoted
-- text) replaced by placeholders, so that messages of one kind group together.
create or replace macro normalized_message(message) as
    trim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        coalesce(message, ''),
        '(''[^'']*''|"[^"]*")', '<text>', 'g'),
        '[^\s:,;()<>]*/[^\s:,;()<>]+', '<path>', 'g'),
        '\b[0-9a-fA-F]{7,}\b', '<hex>', 'g'),
        '\b\d+(\.\d+)?\b', '<n>', 'g'));
