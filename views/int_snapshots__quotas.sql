-- The root quota of each stage for R = num_roots roots (SPEC §1.7), and the fill order.
-- grain: stage
-- sources: run_config
--
-- early = floor(R/6 + 0.5) = (R+3)//6, middle = floor(R/2 + 0.5) = (R+1)//2,
-- late = R - early - middle (30 -> 5/15/10). Fills go middle -> late -> early.
with stages as (
    select *
    from (values ('early', 1, 3), ('middle', 2, 1), ('late', 3, 2)) as v (stage, stage_order, fill_order)
),

final as (
    select
        s.stage,
        s.stage_order,
        s.fill_order,
        case s.stage
            when 'early' then (c.num_roots + 3) // 6
            when 'middle' then (c.num_roots + 1) // 2
            else c.num_roots - (c.num_roots + 3) // 6 - (c.num_roots + 1) // 2
        end as quota
    from stages as s
    cross join run_config as c
)

select * from final
