"""Signals while a command runs: a clean message and exit code, wherever they land."""

from __future__ import annotations

import os
import signal

import click
import duckdb
import pyarrow as pa
import pytest
from click.testing import CliRunner

from cli import _Group

SIGNALS = [(signal.SIGINT, "Interrupted."), (signal.SIGTERM, "Terminated by SIGTERM."),
           (signal.SIGHUP, "Terminated by SIGHUP.")]  # fmt: skip


def run(body) -> click.testing.Result:
    group = _Group(name="t")
    group.add_command(click.Command("go", callback=body))
    return CliRunner().invoke(group, ["go"])


@pytest.mark.parametrize(("sig", "message"), SIGNALS, ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_in_python_code_exits_cleanly(sig, message):
    def body() -> None:
        os.kill(os.getpid(), sig)
        for _ in range(10**6):  # the handler runs between bytecodes
            pass
        raise AssertionError("the signal was not handled")

    before = {s: signal.getsignal(s) for s, _ in SIGNALS}
    r = run(body)
    assert r.exit_code == 128 + sig and r.stderr.strip() == message
    assert {s: signal.getsignal(s) for s, _ in SIGNALS} == before  # restored after the command


@pytest.mark.parametrize(("sig", "message"), SIGNALS, ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_inside_a_duckdb_callback_still_exits_cleanly(sig, message):
    """A scan of Arrow data runs Python code; the exception comes out as a DuckDB error."""

    def batches():
        yield pa.record_batch({"x": [0]})
        os.kill(os.getpid(), sig)
        for i in range(1, 10**5):
            yield pa.record_batch({"x": [i]})

    def body() -> None:
        reader = pa.RecordBatchReader.from_batches(pa.schema([("x", pa.int64())]), batches())  # noqa: F841 - read by DuckDB
        con = duckdb.connect()
        con.execute("select sum(x) from reader").fetchall()
        raise AssertionError("the signal was not handled")

    r = run(body)
    assert r.exit_code == 128 + sig and r.stderr.strip() == message, r.output
    assert "Traceback" not in r.output
