"""Campaigns (``campaign CAMPAIGN.toml``): many tasks, one budget, spent where it adds independent supervision.

A campaign is a log of its own, ``<data>/campaigns/runs/<name>/log`` (the same writer
and guarantees as a run's), and one exploration run per task, ``<name>-<task>``, under
``<data>/runs`` as any other. Its log holds its config (``RunStarted``, command
``campaign``), its tasks (``CampaignTaskAdded``) and its decisions: each round's
blocks of budget (``BudgetAllocated``) and its stop (``CampaignStopped``). A run of
the ``coverage`` policy records each block it was given as a fact (``BlockGranted``)
and the end of its grants (``GrantsClosed``), so the run's own views (and replay)
see every bound its trees grew under::

    record the tasks; create (or open) every task's run
    fixed:    grow every run by its own rules, at once, to the end
    coverage: until the campaign stops:
                  copy every recorded grant into its run
                  grow every run, at once, until each tree has used its grants
                  read every run's campaign_gains and campaign_spend at its tail
                  record the round's grants (policy.decide), or the stop
              close every run's grants; grow and finish every run

The runs share ``parallel`` slots: a turn of any task waits for a free one. Each
run keeps its own ``parallel`` (its batch in rounds mode, a decision parameter), so
a run of a campaign grows as a separate ``explore`` of it would. Every step is in a
log before the next one reads it, in an order a kill -9 cannot break:
``campaign --resume`` copies what a round recorded and its runs did not, resumes
every run, and goes on; in rounds mode it reaches the same campaign.

The package imports nothing: ``config`` (the campaign's file) and ``log`` (its log and
views) hold no engine; where runs are read, a campaign's log is read by :mod:`engine.runset`
(``views/campaign``), and its name stands for its runs in every command that reads runs. ``command`` starts, resumes
and sums up a campaign; ``loop`` grows its runs; ``policy`` decides its rounds;
``replay`` re-derives them; ``watch`` follows one; ``integrity`` verifies and
quarantines its logs and its runs'.
"""
