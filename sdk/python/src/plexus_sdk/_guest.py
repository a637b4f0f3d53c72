"""The component's exports: the three interfaces' classes componentize-py looks for in the app module, each calling
the function `plexus_sdk.export` named for its kind, or passing through (admit / unchanged / unchanged) when none
was. The test harness calls hooks through the same functions, so a hook behaves natively as it does in the host.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Callable, List, Optional

from componentize_py_types import Err

from . import Admit, Decision, HookError, Pod, Selection, StatusEntry, _exports


def _fault(e: BaseException) -> Err:
    if isinstance(e, Err):
        return e
    if isinstance(e, HookError):
        return Err(str(e))
    return Err(f"{type(e).__name__}: {e}")


def _conforms(value: Any, hint: Any, where: str) -> None:
    """Raises HookError unless `value` has the WIT-generated type `hint`: what the component could not lower
    would otherwise be a trap without a word about which field was wrong."""
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return
        for arg in args:
            if arg is not type(None) and (
                not dataclasses.is_dataclass(arg) or isinstance(value, arg)
            ):
                return _conforms(value, arg, where)
        names = " or ".join(getattr(a, "__name__", str(a)) for a in args)
        raise HookError(f"{where}: expected {names}, got {type(value).__name__}")
    if origin is list:
        if not isinstance(value, list):
            raise HookError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(hint)
        for i, v in enumerate(value):
            _conforms(v, item, f"{where}[{i}]")
        return
    if origin is tuple:
        items = typing.get_args(hint)
        if not isinstance(value, tuple) or len(value) != len(items):
            raise HookError(f"{where}: expected a tuple of {len(items)}, got {value!r}")
        for i, (v, h) in enumerate(zip(value, items)):
            _conforms(v, h, f"{where}[{i}]")
        return
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            raise HookError(f"{where}: expected {hint.__name__}, got {type(value).__name__}")
        for f in dataclasses.fields(hint):
            _conforms(getattr(value, f.name), f.type, f"{where}.{f.name}")
        return
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif hint is str:
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        raise HookError(f"{where}: expected {hint.__name__}, got {value!r}")


def call_policy(fn: Optional[Callable[..., Any]], pod: Pod, selections: List[Selection]) -> Decision:
    try:
        out = Admit() if fn is None else fn(pod, selections)
        _conforms(out, Decision, "the decision")
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
        _conforms(out, List[StatusEntry], "the entries")
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
