-- GrantsClosed facts: the campaign grants this run nothing more.
-- grain: run_id, seq
-- sources: log_grants_closed
select
    run_id,
    seq,
    reason
from log_grants_closed
where in_prefix(seq)
