"""How serve's pages lay out what they show (engine/web/pages.py), checked without a browser."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from engine.web.pages import _arguments

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text()
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3)
)


@given(st.dictionaries(st.text(), VALUES, max_size=6))
def test_arguments_are_laid_out_as_json_indented_by_two(arguments):
    """The fast layout of a flat object is the text ``indent=2`` gives; any other value is laid out by it."""
    text = json.dumps(arguments)
    assert _arguments(text) == json.dumps(arguments, indent=2, ensure_ascii=False)


def test_arguments_that_are_not_json_are_shown_as_they_came():
    assert _arguments('{"filePath": "a.py"') == '{"filePath": "a.py"'
    assert _arguments(None) == "None"


def test_a_repository_a_log_names_runs_none_of_its_config_when_its_diff_is_shown(tmp_path):
    """A data directory from elsewhere holds its trees' repositories, their config too: a textconv,
    an external diff driver or an fsmonitor hook in it would run as the reader of the compare page."""
    import shutil
    import subprocess

    from engine.web.code import _diff

    repo, marks = tmp_path / "repo", tmp_path / "ran"

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout

    repo.mkdir()
    git("init", "-q")
    (repo / ".gitattributes").write_text("* diff=evil\n")
    (repo / "f").write_text("a\n")
    git("add", "-A")
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "1")
    (repo / "f").write_text("b\n")
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qam", "2")
    before, after = git("rev-parse", "HEAD~1").strip(), git("rev-parse", "HEAD").strip()
    for key, name in (("diff.evil.textconv", "textconv"), ("diff.external", "external"), ("core.fsmonitor", "fsmon")):
        git("config", key, f"sh -c 'mkdir -p {marks}; touch {marks}/{name}; cat \"$0\"'")
    git("diff", before, after)  # git as a user runs it: the repository's driver runs (so the check can fail)
    assert marks.is_dir() and list(marks.iterdir())
    shutil.rmtree(marks)
    shown = _diff(str(repo), before, after)
    assert [f["file"] for f in shown["files"]] == ["f"] and "-a\n+b\n" in shown["diff"]
    assert not marks.exists(), sorted(p.name for p in marks.iterdir())  # showing the diff ran nothing of it
