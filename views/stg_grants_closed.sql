-- GrantsClosed facts: the campaign grants this run nothing more.
-- grain: seq
-- sources: log_grants_closed
select
    seq,
    reason
from log_grants_closed
where in_prefix(seq)
