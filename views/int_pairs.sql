-- Per rule, every preference pair: two finished attempts from one node whose values differ by the margin (ALGORITHM §3).
-- grain: run_id, selection_seq, tree_id, node_id, chosen_id, rejected_id
-- sources: int_attempts__valued, int_supervision_rules
--
-- Attempts from the same node started from the same conversation. chosen has the
-- higher value; the pair holds when value(chosen) - value(rejected) >= min_margin
-- (both rounded to 12 decimals, so a difference equal to the margin pairs, and equal
-- values never do: min_margin > 0). margin is that difference. against_verdict: the
-- chosen attempt failed the tree's prune test (verdict pruned, retry or kept_exempt)
-- and the rejected one passed it (kept); the rule's against_verdict 'drop' makes no
-- such pair, 'keep' makes it.
select
    c.run_id,
    c.selection_seq,
    c.tree_id,
    c.node_id,
    c.edge_id as chosen_id,
    r.edge_id as rejected_id,
    round(c.value - r.value, 12) as margin,
    c.layer - 1 as depth,
    c.task,
    c.stage,
    c.value as chosen_value,
    r.value as rejected_value,
    c.verdict as chosen_verdict,
    r.verdict as rejected_verdict,
    c.edge_score as chosen_score,
    r.edge_score as rejected_score,
    c.soft as chosen_soft,
    r.soft as rejected_soft,
    c.improved as chosen_improved,
    r.improved as rejected_improved,
    against_verdict(c.verdict, r.verdict) as against_verdict,
    c.recorded and r.recorded as recorded
from int_attempts__valued as c
inner join int_attempts__valued as r
    on c.run_id = r.run_id and c.selection_seq = r.selection_seq and c.tree_id = r.tree_id and c.node_id = r.node_id
inner join int_supervision_rules as rule on c.run_id = rule.run_id and c.selection_seq = rule.selection_seq
where
    c.value > r.value and round(c.value - r.value, 12) >= round(rule.min_margin, 12)
    and (rule.against_verdict = 'keep' or not against_verdict(c.verdict, r.verdict))
