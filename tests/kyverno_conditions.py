"""A rendered rule's context and conditions evaluated in Python, as Kyverno evaluates them: each
``{{ }}`` by JMESPath (the jmespath library, the language go-jmespath implements) and the
operators the bundle's policies use. It lets the fast tier run a rendered rule's decision on
request fixtures; the Kyverno CLI tier (test_policies_kyverno.py) runs the real engine.

Only what the bundle uses is modelled: a variable entry's ``jmesPath`` (or ``value``), an
``apiCall`` entry answered by the caller, and Equals, NotEquals, AnyIn, AllIn, AnyNotIn and
AllNotIn on literal values (no wildcards). Anything else raises, so a rule changed to use
something new fails its test rather than being judged wrongly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jmespath

# Kyverno's variable syntax (RegexVariables in pkg/engine/variables/regex): {{ ... }}, where the
# expression may hold single-brace pairs but no nested double braces.
VARIABLE = re.compile(r"\{\{((?:\{[^{}]*\}|[^{}])*)\}\}")


class Unmodelled(Exception):
    """The rule uses something this evaluator does not model."""


def substitute(value: Any, data: Mapping[str, Any]) -> Any:
    """value with each {{ expression }} replaced by its JMESPath result over data; a string that is
    one variable and nothing else becomes the result itself, typed (as Kyverno substitutes it)."""
    if isinstance(value, list):
        return [substitute(item, data) for item in value]
    if isinstance(value, dict):
        return {key: substitute(item, data) for key, item in value.items()}
    if not isinstance(value, str):
        return value
    whole = VARIABLE.fullmatch(value.strip())
    if whole:
        return jmespath.search(whole[1].strip(), data)
    return VARIABLE.sub(lambda m: _text(jmespath.search(m[1].strip(), data)), value)


def _text(result: Any) -> str:
    if result is None:
        return ""
    return result if isinstance(result, str) else str(result)


def load_context(entries: list[dict], data: dict[str, Any], answers: Mapping[str, Any]) -> dict[str, Any]:
    """data with each context entry added under its name: a variable evaluated over data as it is
    so far, an apiCall taken from answers (what the API server would answer)."""
    data = dict(data)
    for entry in entries or []:
        name = entry["name"]
        if "variable" in entry:
            # Kyverno (loadVariable): the jmesPath, its own {{ }} substituted first, applied to the
            # value when one is given, else to the whole context; the default when that gives null.
            variable = entry["variable"]
            found = substitute(variable["value"], data) if "value" in variable else data
            if "jmesPath" in variable:
                found = jmespath.search(substitute(variable["jmesPath"], data), found)
            data[name] = variable.get("default") if found is None else found
        elif "apiCall" in entry:
            if name not in answers:
                raise Unmodelled(f"context {name!r} is an apiCall: give its answer")
            data[name] = answers[name]
        else:
            raise Unmodelled(f"context entry {name!r}: {sorted(entry)}")
    return data


def _members(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def condition_holds(condition: Mapping[str, Any], data: Mapping[str, Any]) -> bool:
    """One condition (key, operator, value) after substitution."""
    key, value = substitute(condition["key"], data), substitute(condition["value"], data)
    operator = condition["operator"]
    if operator == "Equals":
        return key == value
    if operator == "NotEquals":
        return key != value
    keys, values = _members(key), _members(value)
    if operator == "AnyIn":
        return any(k in values for k in keys)
    if operator == "AllIn":
        return all(k in values for k in keys)
    if operator == "AnyNotIn":
        return any(k not in values for k in keys)
    if operator == "AllNotIn":
        return all(k not in values for k in keys)
    raise Unmodelled(f"operator {operator!r}")


def conditions_hold(conditions: Mapping[str, Any] | None, data: Mapping[str, Any]) -> bool:
    """A preconditions block: every one of ``all`` and, when given, at least one of ``any``."""
    if not conditions:
        return True
    unknown = set(conditions) - {"all", "any"}
    if unknown:
        raise Unmodelled(f"conditions {sorted(unknown)}")
    every = all(condition_holds(c, data) for c in conditions.get("all") or [])
    some = "any" not in conditions or any(condition_holds(c, data) for c in conditions["any"] or [])
    return every and some
