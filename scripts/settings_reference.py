"""The settings reference and the settings part of ``--help``, generated from the settings.

Every option file of ``conf/`` gives the keys and their defaults; the typed schema
(``fnsysid/config/schema.py``) gives what each key allows, in the words of the one-line
refusals, and its meaning (the field's ``description``; for a key without one, the comment
beside or above the key in its YAML). Nothing here is a copy: a new key, default, range or
description shows up in the page the next time it is built (``make docs`` calls
:func:`markdown` from ``scripts/docs_hooks.py``).

The knobs and settings that ``fnsysid --help`` lists (conf/hydra/help/fnsysid.yaml, the block
from ``Knobs (`` to ``Exit status:``) are written from the same descriptions by
:func:`help_yaml`; ``tests/test_settings_registry.py`` fails when the committed file differs.

``python scripts/settings_reference.py`` prints the page;
``python scripts/settings_reference.py --write-help`` (``make help-text``) rewrites the help
file.
"""

from __future__ import annotations

import re
import textwrap
import typing
from pathlib import Path

import yaml
from pydantic import TypeAdapter

from fnsysid.config import schema
from fnsysid.config.messages import field_words

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
#: a key line of an option file: indent, key, the rest
KEY_RE = re.compile(r"^(\s*)([A-Za-z_][\w]*):(.*)$")


def comments(path: Path) -> dict[str, str]:
    """Dotted key -> its comment: the text after ``#`` on the key's line, or else the block
    of comment lines right above it."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    above: list[str] = []
    opening = True              # the file's opening comment block describes the file
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if opening and not stripped.startswith("#"):
            opening = False
            above = []
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if not text.startswith("@package"):
                above.append(text)
            continue
        match = KEY_RE.match(line)
        if not match or stripped.startswith("- "):
            above = []
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        inline = _inline_comment(rest)
        text = inline or " ".join(above)
        if text:
            found[dotted] = text
        above = []
    return found


def _inline_comment(rest: str) -> str:
    """The comment after a value (a ``#`` outside quotes, after white space)."""
    quote = None
    for i, ch in enumerate(rest):
        if ch in "'\"":
            quote = None if quote == ch else (quote or ch)
        elif ch == "#" and quote is None and (i == 0 or rest[i - 1].isspace()):
            return rest[i + 1:].strip()
    return ""


def flatten(node, prefix: str = "") -> dict[str, object]:
    """Dotted key -> value of a nested mapping (lists and scalars are leaves)."""
    out: dict[str, object] = {}
    for key, value in (node or {}).items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted))
        else:
            out[dotted] = value
    return out


def _members(annotation) -> dict[str, type]:
    """Tag -> model of a group annotation built by ``_by_target`` or ``_by_value``."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    out = {}
    for member in typing.get_args(annotation):
        if typing.get_origin(member) is not typing.Annotated:
            continue
        model, *meta = typing.get_args(member)
        for m in meta:
            tag = getattr(m, "tag", None)
            if tag is not None:
                out[tag] = model
    return out


def model_of(group: str, node: dict):
    """The schema model that checks an option of ``group`` (None when no model knows it)."""
    field = schema.checked_model().model_fields.get(group)
    if field is None:
        return None
    members = _members(field.annotation)
    if not members:
        return field.annotation if isinstance(field.annotation, type) else None
    for key in ("_target_", "name", "source"):
        if key in node and node[key] in members:
            return members[node[key]]
    return members.get("custom") or members.get("{}")


def allowed(model, dotted: str) -> str:
    """What ``dotted`` (relative to ``model``) allows, in the refusals' words."""
    for part in dotted.split("."):
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return ""
        info = fields[part]
        model = info.annotation
        if isinstance(model, type) and issubclass(model, schema.Section):
            continue
    return field_words(info)


def field_of(model, dotted: str):
    """The FieldInfo of ``dotted`` (relative to ``model``, through plain sections), or None."""
    info = None
    for part in dotted.split("."):
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        info = fields[part]
        model = info.annotation
    return info


def description(model, dotted: str) -> str:
    """The schema's meaning of ``dotted`` (its field's ``description``), or ``""``."""
    info = field_of(model, dotted)
    return (info.description or "") if info is not None else ""


def _cell(value) -> str:
    text = "null" if value is None else yaml.safe_dump(value, default_flow_style=True).strip()
    text = text.removesuffix("...").strip()
    return "`" + text.replace("|", "\\|") + "`" if text else ""


def _row(key: str, value, allowed_words: str, meaning: str) -> str:
    meaning = meaning.replace("|", "\\|")
    return f"| `{key}` | {_cell(value)} | {allowed_words.replace('|', '/')} | {meaning} |"


def top_level() -> list[str]:
    """The knobs and plain sections of ``conf/config.yaml``."""
    config = yaml.safe_load((CONF / "config.yaml").read_text())
    notes = comments(CONF / "config.yaml")
    lines = ["## Knobs and plain sections", "",
             "`conf/config.yaml`; a knob written `${system.knobs.X}` takes the chosen "
             "system's default (its `knobs` node, below).", "",
             "| key | default | allowed | meaning |", "|---|---|---|---|"]
    for key, value in flatten({k: v for k, v in config.items()
                               if k not in ("defaults", "hydra")}).items():
        head, _, rest = key.partition(".")
        field = schema.Settings.model_fields.get(head)
        if field is None:
            words = ""
        elif rest:
            words = allowed(field.annotation, rest)
        else:
            words = field_words(field)
        meaning = description(schema.Settings, key) or notes.get(key, "")
        lines.append(_row(key, value, words, meaning))
    return lines


def group(name: str) -> list[str]:
    """One table per option of a config group."""
    folder = CONF / name
    lines = [f"## `{name}`", ""]
    for path in sorted(folder.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        node = raw.get(name, raw) if name == "data" else raw
        notes = comments(path)
        if name == "data":
            notes = {k.removeprefix("data."): v for k, v in notes.items()}
        head = _head_comment(path)
        lines += [f"### `{name}={path.stem}`", ""]
        if head:
            lines += [head, ""]
        model = model_of(name, node)
        rows = flatten({k: v for k, v in node.items() if k != "defaults"})
        if not rows:
            lines += ["No settings.", ""]
            continue
        lines += ["| key | default | allowed | meaning |", "|---|---|---|---|"]
        for key, value in rows.items():
            words = allowed(model, key) if model is not None else ""
            meaning = (description(model, key) if model is not None else "") \
                or notes.get(key, "")
            lines.append(_row(f"{name}.{key}", value, words, meaning))
        lines.append("")
    return lines


def _head_comment(path: Path) -> str:
    """The comment block that opens an option file (its description)."""
    out = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        text = stripped.lstrip("#").strip()
        if not text.startswith("@package"):
            out.append(text)
    return " ".join(out)


def markdown() -> str:
    """The settings reference page."""
    lines = ["# Settings reference", "",
             "Generated from `conf/` (keys and defaults) and the typed schema "
             "`fnsysid/config/schema.py`: what each key allows, in the words of the one-line "
             "refusals, and its meaning (the field's description; for a key without one, the "
             "comment beside it in its YAML). Set any key on the command line "
             "(`fnsysid output.plot=false`), in `FederatedSysID(config={...})` or in "
             "`fnsysid.run({...})`.", ""]
    lines += top_level() + [""]
    for name in schema.GROUPS:
        if name == "experiment" or not (CONF / name).is_dir():
            continue
        lines += group(name)
    lines += ["## `experiment`", "",
              "One stored sweep per paper figure panel or study (`conf/experiment/`): "
              + ", ".join(f"`{p.stem}`" for p in sorted((CONF / "experiment").glob("*.yaml")))
              + ".", ""]
    return "\n".join(lines)


# --- the settings part of --help -------------------------------------------------------------

HELP = CONF / "hydra" / "help" / "fnsysid.yaml"
#: the settings ``--help`` lists after the knobs, in its order (their meanings are the schema's)
HELP_SETTINGS = ("data.shared_noise", "output.eval_every", "output.trajectories",
                 "optimizer.schedule", "optimizer.reduction", "optimizer.scale_features",
                 "optimizer.affine", "strategy.weighting", "strategy.fraction",
                 "output.per_client", "output.overwrite", "output.resume", "theory.delta",
                 "output.ci_level", "output.model_check", "progress")
_TYPE_NAMES = {"integer": "int", "number": "float", "array": "list", "boolean": "bool",
               "string": "str"}
#: the help block's first line and the line after it
_BLOCK = ("  Knobs (", "  Exit status:")
_WIDTH = 96


def _default_options() -> dict[str, dict]:
    """Group -> the node of its default option (``conf/config.yaml``'s defaults list)."""
    config = yaml.safe_load((CONF / "config.yaml").read_text())
    out = {"": config}
    for entry in config["defaults"]:
        if isinstance(entry, dict) and len(entry) == 1:
            (name, option), = entry.items()
            path = CONF / str(name) / f"{option}.yaml"
            if path.is_file():
                raw = yaml.safe_load(path.read_text()) or {}
                out[name] = raw.get(name, raw) if name == "data" else raw
    return out


def _shown(info, value) -> str:
    """A default as ``--help`` shows it; one taken from elsewhere (``${...}``) as its
    values (``sum|mean``) or type (``<int|list>``)."""
    if not (isinstance(value, str) and value.startswith("${")):
        return _cell(value).strip("`")
    found = TypeAdapter(info.rebuild_annotation()).json_schema()
    kinds, values = [], []
    for s in found.get("anyOf", [found]):
        values += [v for v in s.get("enum", []) if isinstance(v, str)]
        kinds += [_TYPE_NAMES[s["type"]]] if s.get("type") in _TYPE_NAMES else []
    if values:
        return "|".join(values)
    return "<" + "|".join(dict.fromkeys(kinds)) + ">"


def _help_line(left: str, text: str, width: int) -> list[str]:
    """``left`` (a key and its default) and ``text`` wrapped in a column ``width`` on."""
    indent, head = " " * (4 + width), f"    {left}"
    if len(head) > 4 + width - 2:           # no room: the text starts on the next line
        return [head] + textwrap.wrap(text, _WIDTH, initial_indent=indent,
                                      subsequent_indent=indent)
    return textwrap.wrap(text, _WIDTH, initial_indent=head.ljust(4 + width),
                         subsequent_indent=indent)


def help_block() -> list[str]:
    """The knobs and settings of ``--help``: each with its default and its meaning."""
    options = _default_options()
    knobs = ", ".join(schema.SYSTEM_KNOBS)
    lines = [f"  Knobs (defaults of {knobs} come from the chosen system):"]
    for key in schema.KNOBS:
        info = schema.Settings.model_fields[key]
        lines += _help_line(f"{key}={_shown(info, options[''][key])}", info.description, 16)
    for key in HELP_SETTINGS:
        head, _, rest = key.partition(".")
        if head in options and rest:
            model = model_of(head, options[head])
            info, value = field_of(model, rest), options[head].get(rest)
        else:
            info, value = field_of(schema.Settings, key), flatten(options[""])[key]
        if info is None or not info.description:
            raise LookupError(f"{key}: no field with a description in the schema")
        lines += _help_line(f"{key}={_shown(info, value)}", info.description, 31)
    return lines + [""]


def help_yaml() -> str:
    """conf/hydra/help/fnsysid.yaml with its knobs block written from the schema."""
    lines = HELP.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(_BLOCK[0]))
    end = next(i for i, line in enumerate(lines) if line.startswith(_BLOCK[1]))
    return "\n".join(lines[:start] + help_block() + lines[end:]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the page, or rewrite the help file with ``--write-help``; anything else is
    refused in one line (exit 2)."""
    import argparse

    ap = argparse.ArgumentParser(description="The settings reference (printed) or, with "
                                 "--write-help, the knobs block of --help rewritten.")
    ap.add_argument("--write-help", action="store_true",
                    help="rewrite conf/hydra/help/fnsysid.yaml's knobs block from the schema")
    args = ap.parse_args(argv)
    if args.write_help:
        HELP.write_text(help_yaml())
    else:
        print(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
