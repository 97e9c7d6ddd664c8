"""The training process of a ``@task.spot_training`` function::

    python -m airflow_spot.decorators.entry PAYLOAD

``PAYLOAD`` is the JSON :func:`airflow_spot.decorators.source.payload` made: the function's
source and its arguments. The function is compiled under its own file name and line numbers
(a traceback points at the DAG file's lines), then called with its arguments by name and
``session``: a :class:`TrainingSession` built from the environment the backend set (the
checkpoint location, the notice and progress channels, the rank), with the task's
``total_steps``, ``save_every`` and ``keep``. Its return value is written beside the
checkpoints (:mod:`.result`), by rank 0 of a gang.

Exit codes: what the function's own code ends with (an exception is 1: an application
failure, retried within ``max_failures``), the session's (143 after a preemption notice, 73
when the location takes no writes), and 78 (a configuration error: the operator fails the task
at once) for a payload that cannot be read, a function that cannot be defined, or a return value
that is no small JSON value. Nothing here imports Airflow.
"""

from __future__ import annotations

import json
import linecache
import logging
import sys
from collections.abc import Callable
from typing import Any

from airflow_spot.checkpoint.training import CONFIG_EXIT, TrainingSession
from airflow_spot.decorators import result
from airflow_spot.exceptions import ConfigError

log = logging.getLogger("airflow_spot.decorators.entry")


def load(doc: dict[str, Any]) -> Callable[..., Any]:
    """Define the function from its source, under its own file name and line numbers."""
    filename, line, name = str(doc["file"]), int(doc["line"]), str(doc["name"])
    text = "\n" * (line - 1) + str(doc["source"])
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    # annotations stay unevaluated (a type the function names may not be imported here):
    # ``annotations`` is the __future__ feature imported above
    code = compile(text, filename, "exec", flags=annotations.compiler_flag, dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": "__airflow_spot_task__"}
    exec(code, namespace)  # noqa: S102 - the task's own function, sent by its operator
    return namespace[name]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = sys.argv[1:] if argv is None else argv
    try:
        doc = json.loads(args[0])
        fn = load(doc)
        kwargs, opts = dict(doc["kwargs"]), dict(doc["session"])
    except Exception as e:  # noqa: BLE001 - nothing can run: say why and fail the task
        log.error("Could not define the task's function (exit %d): %r", CONFIG_EXIT, e)
        return CONFIG_EXIT
    session = TrainingSession.from_env(
        total_steps=int(opts["total_steps"]),
        save_every=int(opts.get("save_every", 50)),
        keep=int(opts.get("keep", 3)),
    )
    log.info("Running %s() (total steps %d).", doc["name"], session.total_steps)
    value = fn(session=session, **kwargs)
    if session.rank != 0:  # a gang keeps rank 0's result
        return 0
    latest = session.checkpoints.latest_manifest()
    try:
        result.write(
            session.checkpoints.store, value, latest.name if latest else None, session.last_saved
        )
    except ConfigError as e:
        log.error("%s (exit %d)", e, CONFIG_EXIT)
        return CONFIG_EXIT
    log.info("%s() returned; its result is kept for the task's XCom.", doc["name"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
