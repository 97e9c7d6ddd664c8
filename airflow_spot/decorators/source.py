"""How a ``@task.spot_training`` function travels to the training process: its source and its
arguments as JSON (as ``@task.virtualenv`` and ``@task.kubernetes`` send source and
arguments), never a pickle, so the user's image needs only Python and airflow-spot.

The function runs from its source alone, in a fresh interpreter, so it may use nothing of its
module: it imports what it needs inside its body, and gets values as arguments. That is checked
when the DAG is parsed, from the function's bytecode (no file is read): a name it takes from
its module (a constant, an import, a helper) is refused, naming it. Its parameters are passed
by name: one of them is ``session`` (the bound :class:`~airflow_spot.checkpoint.training.
TrainingSession`); ``*args``, positional-only parameters and Airflow's context names
(``ti``, ``ds``...: the training process has no Airflow context; pass ``"{{ run_id }}"``)
are refused. Its arguments must be JSON values (numbers, strings, lists, dicts): literal ones
are checked at parse time, templated and XCom ones once rendered, before anything launches.
"""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import json
import textwrap
from collections.abc import Callable, Iterator, Mapping
from types import CodeType
from typing import Any

from airflow_spot.exceptions import ConfigError

SESSION = "session"  # the parameter that receives the bound TrainingSession
ENTRY = "airflow_spot.decorators.entry"  # python -m ENTRY PAYLOAD
MAX_PAYLOAD = 100_000  # bytes of JSON: one argv string may hold 128 KiB on Linux
PAYLOAD_VERSION = 1


def check_function(fn: Callable[..., Any]) -> inspect.Signature:
    """Refuse a function that cannot run from its source with arguments by name; returns its
    signature without ``session`` (what the task is called with)."""
    name = getattr(fn, "__name__", repr(fn))
    field = f"{name}()"
    if inspect.iscoroutinefunction(fn) or not inspect.isfunction(fn):
        raise ConfigError(field, "decorate a plain function (def, not async def or a callable)")
    sig = inspect.signature(fn)
    if SESSION not in sig.parameters:
        raise ConfigError(
            field,
            f"takes no {SESSION!r} parameter: add one; it receives the TrainingSession bound to "
            "the job's checkpoint location (session.resume(), session.step_done(...))",
        )
    from airflow.sdk.definitions.context import KNOWN_CONTEXT_KEYS

    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY):
            raise ConfigError(
                field,
                f"parameter {p.name!r} is {'*args' if p.kind is p.VAR_POSITIONAL else 'positional-only'}: "
                "arguments reach the training process by name; use named parameters",
            )
        if p.name in KNOWN_CONTEXT_KEYS:
            raise ConfigError(
                field,
                f"parameter {p.name!r} is an Airflow context name, and the training process has "
                "no Airflow context: rename it and pass the value as an argument (e.g. "
                "run_id='{{ run_id }}')",
            )
    outside = sorted(outside_names(fn.__code__) - {name} - set(dir(builtins)))
    if outside:
        raise ConfigError(
            field,
            f"uses {', '.join(outside)} from outside its body; it runs from its source alone in "
            "the training process: import inside the function and pass values as arguments",
        )
    return sig.replace(parameters=[p for p in sig.parameters.values() if p.name != SESSION])


def outside_names(code: CodeType) -> set[str]:
    """The global names a function's code (and the code nested in it) looks up."""
    names: set[str] = set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            names.add(str(ins.argval))
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= outside_names(const)
    return names


def check_session_options(
    save_every: Any, keep: Any, total_steps: Any, *, required: bool = True
) -> None:
    """The session's own settings, and the total steps it must be built with (``required``:
    every argument is known, as when the task is built)."""
    for field, v in (("save_every", save_every), ("keep", keep)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(field, f"must be an integer >= 1, got {v!r}")
    if total_steps is None and required:
        raise ConfigError(
            "total_steps",
            "give the job's total steps: the function's TrainingSession is built with them",
        )


def check_literal_arguments(sig: inspect.Signature, args: Any, kwargs: Mapping[str, Any]) -> None:
    """Arguments known now (not a template or an XComArg) must be JSON values."""
    for name, value in named(sig, args, kwargs, partial=True).items():
        if not _later(value):
            _check_json(name, value)


def named(sig: inspect.Signature, args: Any, kwargs: Mapping[str, Any], *, partial: bool = False):
    """The arguments by parameter name (``**kwargs`` spread out); defaults filled unless
    ``partial`` (a mapped task's arguments, some still to come from ``expand()``)."""
    bound = sig.bind_partial(*args, **kwargs) if partial else sig.bind(*args, **kwargs)
    if not partial:
        bound.apply_defaults()
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if sig.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[name] = value
    return out


def function_source(fn: Callable[..., Any]) -> tuple[str, str, int]:
    """(the function's text from its ``def`` line, decorators left out; its file; the line of
    ``def`` there). Default values must be literals: the training process evaluates them."""
    fn = inspect.unwrap(fn)
    field = f"{fn.__name__}()"
    lines, first = inspect.getsourcelines(fn)
    text = textwrap.dedent("".join(lines))
    node = ast.parse(text).body[0]
    if not isinstance(node, ast.FunctionDef):
        raise ConfigError(field, "decorate a plain function defined with def")
    for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
        try:
            ast.literal_eval(default)
        except ValueError:
            raise ConfigError(
                field,
                f"the default {ast.unparse(default)!r} is not a literal; the training process "
                "evaluates it without the DAG's module: write the value, or pass it as an argument",
            ) from None
    body = "".join(text.splitlines(keepends=True)[node.lineno - 1 :])
    return body, inspect.getsourcefile(fn) or f"<{fn.__name__}>", first + node.lineno - 1


def payload(fn: Callable[..., Any], arguments: dict[str, Any], session: dict[str, Any]) -> str:
    """The JSON the training process gets (:mod:`.entry` reads it): source and arguments."""
    for name, value in arguments.items():
        _check_json(name, value)
    source, filename, line = function_source(fn)
    doc = {
        "v": PAYLOAD_VERSION,
        "name": inspect.unwrap(fn).__name__,
        "file": filename,
        "line": line,
        "source": source,
        "kwargs": arguments,
        "session": session,
    }
    text = json.dumps(doc)
    if len(text.encode()) > MAX_PAYLOAD:
        raise ConfigError(
            f"{doc['name']}()",
            f"its source and arguments take {len(text.encode()) // 1000} KB as JSON, over "
            f"{MAX_PAYLOAD // 1000} KB (a command-line argument's limit): pass big inputs as a "
            "path or URI the function reads",
        )
    return text


def _check_json(name: str, value: Any) -> None:
    bad = next(_not_json(value), None)
    if bad is not None:
        raise ConfigError(
            f"argument {name!r}",
            f"is (or holds) a {type(bad).__name__}; the function runs in another process and "
            "gets its arguments as JSON: pass numbers, strings, booleans, lists and dicts "
            "(a path or URI for anything bigger)",
        )


def _not_json(value: Any) -> Iterator[Any]:
    """Every part of ``value`` that JSON cannot carry as is."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _not_json(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                yield k
            yield from _not_json(v)
    elif not _later(value):
        yield value


def _later(value: Any) -> bool:
    """Resolved when the task starts: an XComArg (a template is a string, checked as one)."""
    from airflow.sdk.definitions._internal.mixins import ResolveMixin

    return isinstance(value, ResolveMixin)
