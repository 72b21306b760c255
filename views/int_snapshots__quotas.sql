-- The root quota of each stage for R = num_roots roots (ALGORITHM §1.7), and the fill order.
-- grain: run_id, stage
-- sources: run_config
--
-- early = floor(R/6 + 0.5) = (R+3)//6, middle = floor(R/2 + 0.5) = (R+1)//2,
-- late = R - early - middle (30 -> 5/15/10). Fills go middle -> late -> early.
-- Computed in HUGEINT: R may be any 64-bit count (R + 3 must not overflow).
with stages as (
    select
        stage,
        stage_order(stage) as stage_order,
        list_position(['middle', 'late', 'early'], stage) as fill_order
    from (select unnest(stages()) as stage)
),

final as (
    select
        c.run_id,
        s.stage,
        s.stage_order,
        s.fill_order,
        cast(case s.stage
            when 'early' then (c.r + 3) // 6
            when 'middle' then (c.r + 1) // 2
            else c.r - (c.r + 3) // 6 - (c.r + 1) // 2
        end as bigint) as quota
    from stages as s
    cross join (select run_id, cast(num_roots as hugeint) as r from run_config) as c
)

select * from final
