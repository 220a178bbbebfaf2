"""Failures as the CLI reports them: one line naming the cause, the traceback to the log.

The cause is the innermost exception: an error raised by pyarrow inside pyiceberg inside the
service says what failed (the bucket, the host, the file), the outer ones only where. Spark wraps
what failed in a task or a foreachBatch call as text (a Python traceback inside a JVM exception
inside a Py4J error); the last "SomeError: message" line of that text is the cause.
"""

from __future__ import annotations

import re

# Exit status of a failure whose cause the line names; 130: stopped by Ctrl-C before it finished.
EXIT_FAILURE = 2
EXIT_INTERRUPTED = 130

_RAISED_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception|Failed|Exhausted|GaveUp)): (.+)$")
_WRAPPERS = (
    "Py4JJavaError",
    "StreamingQueryException",
    "PythonException",
    "SparkException",
    "ExecutionException",
    "UncheckedExecutionException",
    "CapturedException",
)


def innermost(exc: BaseException) -> BaseException:
    """The exception at the bottom of the chain of causes (explicit ones first, then context)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None:
            break
        exc = nxt
    return exc


def one_line(exc: BaseException, limit: int = 600) -> str:
    """What failed, in one line: the innermost cause, after the outer message's first line where
    that names the place and not the cause already."""
    cause = innermost(exc)
    found = _cause_in_text(str(cause))
    if found:
        text = found
    elif cause is exc:
        text = _first_line(str(exc)) or type(exc).__name__
    else:
        inner = _first_line(str(cause))
        outer = _first_line(str(exc))
        text = outer if inner and inner in outer else f"{outer}: " * bool(outer) + f"{type(cause).__name__}: {inner}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cause_in_text(text: str) -> str | None:
    """The last raised-exception line of a traceback rendered into a message (Spark's), if any,
    skipping the JVM's and Py4J's own wrappers."""
    if "Traceback (most recent call last)" not in text and "\tat " not in text and "\n" not in text:
        return None
    for line in reversed(text.splitlines()):
        match = _RAISED_LINE.match(line)
        if match and match.group(1) not in _WRAPPERS:
            return f"{match.group(1)}: {match.group(2).strip()}"
    return None


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip() and not line.startswith("Traceback"):
            return line.strip()
    return ""
