"""The live engine: ``explorer`` (the loop: record what the views say is due, run the turns), ``decisions``
(the views' rows made events), ``turns`` (the pool of Teacher turns in slots), ``spool`` (finished turns kept
on disk until the log holds them) and ``cluster`` (turns on a Ray cluster)."""
