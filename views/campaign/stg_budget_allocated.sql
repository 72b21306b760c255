-- BudgetAllocated decisions: a round's blocks of budget, and the runs' tails it read them at.
-- grain: seq
-- sources: log_budget_allocated
select
    seq,
    watermark,
    round,
    rule,
    marks,
    grants
from log_budget_allocated
