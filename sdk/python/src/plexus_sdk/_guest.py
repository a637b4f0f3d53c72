"""The component's exports: the three interfaces' classes componentize-py looks for in the app module, each calling
the function `plexus_sdk.export` named for its kind, or passing through (admit / unchanged / unchanged) when none
was. The test harness calls hooks through the same functions, so a hook behaves natively as it does in the host.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple

from componentize_py_types import Err

from . import Admit, Decision, HookError, Pod, Selection, StatusEntry, _exports


def _fault(e: BaseException) -> Err:
    if isinstance(e, Err):
        return e
    if isinstance(e, HookError):
        return Err(str(e))
    return Err(f"{type(e).__name__}: {e}")


Checker = Callable[[Any, str], None]
_checkers: Dict[Any, Checker] = {}


def _checker(hint: Any) -> Checker:
    """A function that raises HookError unless a value has the WIT-generated type `hint`: what the component could
    not lower would otherwise be a trap without a word about which field was wrong. Made once per type, at import
    (so in the pre-initialized component), leaving each call plain isinstance checks."""
    found = _checkers.get(hint)
    if found is not None:
        return found
    check: Checker
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        args = typing.get_args(hint)
        optional = type(None) in args
        choices = [a for a in args if a is not type(None)]
        names = " or ".join(getattr(a, "__name__", str(a)) for a in args)
        if len(choices) == 1:
            inner = _checker(choices[0])

            def check(value: Any, where: str) -> None:
                if value is None and optional:
                    return
                inner(value, where)

        else:
            classes = [(c, _checker(c)) for c in choices]

            def check(value: Any, where: str) -> None:
                if value is None and optional:
                    return
                for c, inner in classes:
                    if isinstance(value, c):
                        return inner(value, where)
                raise HookError(f"{where}: expected {names}, got {type(value).__name__}")

    elif origin is list:
        (item_hint,) = typing.get_args(hint)
        item = _checker(item_hint)

        def check(value: Any, where: str) -> None:
            if not isinstance(value, list):
                raise HookError(f"{where}: expected a list, got {type(value).__name__}")
            for i, v in enumerate(value):
                item(v, f"{where}[{i}]")

    elif origin is tuple:
        items = [_checker(h) for h in typing.get_args(hint)]

        def check(value: Any, where: str) -> None:
            if not isinstance(value, tuple) or len(value) != len(items):
                raise HookError(f"{where}: expected a tuple of {len(items)}, got {value!r}")
            for i, (v, c) in enumerate(zip(value, items)):
                c(v, f"{where}[{i}]")

    elif dataclasses.is_dataclass(hint):
        # Filled in below: a record may be reached again through its own fields.
        fields: List[Tuple[str, Checker]] = []

        def check(value: Any, where: str) -> None:
            if not isinstance(value, hint):
                raise HookError(f"{where}: expected {hint.__name__}, got {type(value).__name__}")
            for name, c in fields:
                c(getattr(value, name), f"{where}.{name}")

        _checkers[hint] = check
        fields.extend((f.name, _checker(f.type)) for f in dataclasses.fields(hint))
        return check
    elif hint is bool:

        def check(value: Any, where: str) -> None:
            if not isinstance(value, bool):
                raise HookError(f"{where}: expected bool, got {value!r}")

    elif hint is int:

        def check(value: Any, where: str) -> None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise HookError(f"{where}: expected int, got {value!r}")

    elif hint is str:

        def check(value: Any, where: str) -> None:
            if not isinstance(value, str):
                raise HookError(f"{where}: expected str, got {value!r}")

    else:

        def check(value: Any, where: str) -> None:
            pass

    _checkers[hint] = check
    return check


_decision = _checker(Decision)
_entries = _checker(List[StatusEntry])


def call_policy(fn: Optional[Callable[..., Any]], pod: Pod, selections: List[Selection]) -> Decision:
    try:
        out = Admit() if fn is None else fn(pod, selections)
        _decision(out, "the decision")
        return out
    except Exception as e:
        raise _fault(e) from None


def call_resolver(
    fn: Optional[Callable[..., Any]],
    pod: Pod,
    selection: Selection,
    nad: Optional[str],
    config: Optional[str],
) -> Optional[str]:
    try:
        if fn is None:
            return None
        nad_value = None if nad is None else json.loads(nad)
        config_value = None if config is None else json.loads(config)
        out = fn(pod, selection, nad_value, config_value)
        return None if out is None else json.dumps(out, separators=(",", ":"))
    except Exception as e:
        raise _fault(e) from None


def call_status(
    fn: Optional[Callable[..., Any]], pod: Pod, entries: List[StatusEntry]
) -> List[StatusEntry]:
    try:
        out = entries if fn is None else fn(pod, entries)
        _entries(out, "the entries")
        return out
    except Exception as e:
        raise _fault(e) from None


class Policy:
    def check(self, pod: Pod, selections: List[Selection]) -> Decision:
        return call_policy(_exports.policy, pod, selections)


class Resolver:
    def resolve(
        self, pod: Pod, selection: Selection, nad: Optional[str], config: Optional[str]
    ) -> Optional[str]:
        return call_resolver(_exports.resolver, pod, selection, nad, config)


class Status:
    def shape(self, pod: Pod, entries: List[StatusEntry]) -> List[StatusEntry]:
        return call_status(_exports.status, pod, entries)
