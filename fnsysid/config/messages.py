"""One-line messages for settings that pydantic refuses: the setting's dotted key, the value
given and what is allowed, in words read from the schema itself (its JSON schema)."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Union

from pydantic import BaseModel, Tag, TypeAdapter

from fnsysid.config.errors import show


def message(error: dict, root, data: Mapping, meanings: Mapping[str, str],
            system_keys: tuple = (), tag_keys: Mapping[str, str] | None = None) -> str:
    """One line for a pydantic error of model ``root`` checking ``data``: the setting, its
    value and what is allowed (``meanings``: words for top-level keys; ``system_keys``: the
    sections a system YAML must have, named with the keys they need when missing;
    ``tag_keys``: the key that chooses the model of a group, e.g. ``data`` -> ``source``)."""
    key, holder, field, info, path = _locate(error["loc"], root)
    kind = error["type"]
    if kind == "extra_forbidden":
        names = [f.alias or n for n, f in holder.model_fields.items()]
        parent = key.rpartition(".")[0]
        return f"unknown setting '{key}'; {parent or 'top level'} has: {', '.join(names)}"
    what = field_words(info) if info is not None else "a value"
    if kind == "missing":
        parent = key.rpartition(".")[0]
        if parent.startswith("system.") or parent == "system" and field in system_keys:
            names = [f.alias or n for n, f in holder.model_fields.items() if f.is_required()]
            return (f"{key} is missing: {parent} needs {', '.join(names)} "
                    "(see docs/EXTENDING.md)")
        return f"setting '{key}' is missing (removed with ~?); it is required: {what}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        name = (tag_keys or {}).get(key, "_target_")
        given = error["input"]
        if not isinstance(given, Mapping):
            return not_allowed(key, given, f"a group of settings with {name}: "
                                           + ", ".join(_tags(info.annotation)))
        return (f"{key}.{name}={show(given.get(name))} is not allowed; allowed: "
                + ", ".join(_tags(info.annotation)))
    return not_allowed(key, _value_at(data, path), what, meanings.get(key))


def not_allowed(key: str, value, what: str, meaning: str | None = None) -> str:
    """``M=0 is not allowed: M (number of clients) must be an integer >= 1``."""
    meaning = f" ({meaning})" if meaning else ""
    # the command line reads nan, inf, true, 123 ... as values, not as the names they spell
    quote = (f"; {show(value)} was read as a "
             f"{'boolean' if isinstance(value, bool) else 'number'}: quote a name that "
             f"spells one ({key}='{show(value)}' on the command line)"
             if what == "a non-empty string" and isinstance(value, (bool, int, float)) else "")
    return f"{key}={show(value)} is not allowed: {key}{meaning} must be {what}{quote}"


def field_words(info) -> str:
    """What a field allows, in words (its own ``allowed`` text if it has one)."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return extra.get("allowed") or allowed(info.rebuild_annotation())


def _locate(loc: tuple, root):
    """(dotted key, model holding it, field name, its FieldInfo, path of the value) of a
    pydantic location.

    A location holds field names, list indices and the tags of unions (``custom``, a class
    path, ``constrained-int``); the walk follows the fields and the list items of groups and
    skips the tags. It stops at a field that holds no group: a wrong item of a list of numbers
    is reported as the whole field (``system.A0``), whose allowed values are known.
    """
    model: Any = root
    info = None
    key, holder, field, path = "", root, None, []
    for part in loc:
        model = _optional(model)
        fields = getattr(model, "model_fields", None) if isinstance(model, type) else None
        if isinstance(part, int):
            key += f"[{part}]"
            path.append(part)
            model = _member(model, None)
            info = _item_info(model) or info
            continue
        if fields is not None:
            by_alias = {f.alias or n: n for n, f in fields.items()}
            holder, field = model, part
            key = f"{key}.{part}" if key else str(part)
            path.append(part)
            if part not in by_alias:
                return key, holder, field, None, path
            info = fields[by_alias[part]]
            model = info.annotation
            if not _holds_group(model):
                break
            continue
        model = _member(model, part)        # a union's tag: the member it names
    return key, holder, field, info, path


def _item_info(tp):
    """The FieldInfo of a list's item type that says what it allows in words, or None."""
    if typing.get_origin(tp) is not Annotated:
        return None
    return next((m for m in typing.get_args(tp)[1:] if isinstance(
        getattr(m, "json_schema_extra", None), dict) and "allowed" in m.json_schema_extra), None)


def _holds_group(tp) -> bool:
    """Whether a value of type ``tp`` can be (or contain) a group of settings."""
    if isinstance(tp, type):
        return issubclass(tp, BaseModel)
    return any(_holds_group(arg) for arg in typing.get_args(tp))


def _value_at(data, path: list):
    """The value at ``path`` (keys and indices) of ``data``, or None."""
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _tags(tp) -> list[str]:
    """The tags of the members of a tagged union (the values that choose a member)."""
    if typing.get_origin(tp) is Annotated:
        return _tags(typing.get_args(tp)[0])
    return [m.tag for arg in typing.get_args(tp) if typing.get_origin(arg) is Annotated
            for m in typing.get_args(arg)[1:] if isinstance(m, Tag)]


def _optional(tp):
    """``X`` for ``X | None``; other types as they are."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _member(tp, tag):
    """The member of union (or list of unions) ``tp`` that ``tag`` names (the list's item
    for ``None``); ``tp`` itself if there is none."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _member(typing.get_args(tp)[0], tag)
    if origin is list and tag is None:
        return typing.get_args(tp)[0]
    if origin is Union:
        for arg in typing.get_args(tp):
            meta = typing.get_args(arg)[1:] if typing.get_origin(arg) is Annotated else ()
            base = typing.get_args(arg)[0] if meta else arg
            if any(isinstance(m, Tag) and m.tag == tag for m in meta):
                return base
            if isinstance(base, type) and getattr(base, "__name__", None) == tag:
                return base
        return tp
    return tp


def allowed(annotation) -> str:
    """What a value of ``annotation`` may be, in words (from its JSON schema): ``an integer
    >= 1``, ``true or false``, ``a finite number in (0, 1)``, ``one of sum, mean``."""
    schema = TypeAdapter(annotation).json_schema()
    return _words(schema, schema.get("$defs", {}))


def _words(s: dict, defs: dict) -> str:
    if "allowed" in s:
        return s["allowed"]
    if "$ref" in s:
        return _words(defs[s["$ref"].split("/")[-1]], defs)
    for union in ("anyOf", "oneOf"):
        if union in s:
            parts = list(dict.fromkeys(_words(x, defs) for x in s[union]))
            return ", or ".join(parts)
    if "enum" in s or "const" in s:
        values = s.get("enum", [s.get("const")])
        return "one of " + ", ".join(show(v) for v in values)
    kind = s.get("type")
    if kind == "boolean":
        return "true or false"
    if kind == "null":
        return "null"
    if kind == "string":
        return "a non-empty string"
    if kind == "integer":
        lo, hi = s.get("minimum"), s.get("maximum")
        if lo is not None and hi is not None:
            return f"an integer in {lo}..{hi}"
        return f"an integer >= {lo}" if lo is not None else "an integer"
    if kind == "number":
        return "a finite number" + _interval(s)
    if kind == "array":
        n = s.get("minItems") if s.get("minItems") == s.get("maxItems") else None
        return (f"a list of {f'{n} ' if n else ''}values, each "
                f"{_words(s.get('items', {}), defs)}")
    if kind == "object":
        keys = list(s.get("properties", {}))
        return f"a group of settings ({', '.join(keys)})" if keys else "a group of settings"
    return "a value"


def _interval(s: dict) -> str:
    lo, lo_open = (s["exclusiveMinimum"], True) if "exclusiveMinimum" in s else \
        (s.get("minimum"), False)
    hi, hi_open = (s["exclusiveMaximum"], True) if "exclusiveMaximum" in s else \
        (s.get("maximum"), False)
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        return f" {'<' if hi_open else '<='} {hi:g}"
    return ""
