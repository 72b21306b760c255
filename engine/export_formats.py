"""The export formats, the one list of them (light: the command line builds its choices from it).

``chat`` and ``atif`` write the selected paths; the supervised formats write pairs (``dpo``),
labelled attempts (``kto``) or each path's edges with step labels (``steps``).
"""

PATH_FORMATS = ("chat", "atif")
SUPERVISED_FORMATS = ("dpo", "kto", "steps")
FORMATS = (*PATH_FORMATS, *SUPERVISED_FORMATS)
