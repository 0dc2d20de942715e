"""The command line's arguments: Hydra's flags and commands, the overrides, values as
override text. Parsed and checked here without composing a config (one-line
:class:`~fnsysid.config.errors.ConfigError` for an unknown option or an argument that is not a
setting).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from fnsysid.config.errors import ConfigError, one_line

#: Hydra flags followed by a value
VALUE_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
               "--cfg", "-c", "--package", "-p", "--info", "-i", "--experimental-rerun"}
#: Hydra flags without a value
FLAGS = {"-m", "--multirun", "--resolve", "--run", "-r", "--version", "-h", "--help",
         "--hydra-help", "--shell-completion", "-sc"}
#: Hydra's commands (a run when none is given): a command line takes one of them
COMMANDS = {"-r": "--run", "--run": "--run", "-m": "-m", "--multirun": "-m", "-c": "--cfg",
            "--cfg": "--cfg", "-i": "--info", "--info": "--info", "-sc": "--shell-completion",
            "--shell-completion": "--shell-completion"}


def flag_value(argv: list[str], *names: str) -> str | None:
    """Value of the last Hydra flag among ``names`` in ``argv`` (``--flag v`` or ``--flag=v``)."""
    value = None
    for i, a in enumerate(argv):
        if a in names and i + 1 < len(argv):
            value = argv[i + 1]
        elif "=" in a and a.split("=", 1)[0] in names:
            value = a.split("=", 1)[1]
    return value


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags with their values, everything else) in their order."""
    flags, rest, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a in VALUE_FLAGS and i + 1 < len(argv):
            flags += argv[i:i + 2]
            i += 2
            continue
        (flags if a in FLAGS or a.split("=", 1)[0] in VALUE_FLAGS else rest).append(a)
        i += 1
    return flags, rest


def override_args(argv: list[str]) -> list[str]:
    """The overrides of ``argv`` (``key=value``, ``~key``), without Hydra's flags."""
    return [a for a in split_args(argv)[1] if not a.startswith("-") or a.startswith("~")]


def check_args(argv: list[str]) -> None:
    """Every argument is a known Hydra flag or an override ``key=value`` / ``~key``."""
    for a in split_args(argv)[1]:
        if a.startswith("-") and not a.startswith("~"):
            raise ConfigError(f"unknown option '{a}'; see --help")
        if "=" not in a and not a.startswith("~"):
            raise ConfigError(f"argument '{a}' is not a setting: write key=value (e.g. M=20), "
                              "group=option (e.g. system=pendulum) or ~key; see --help")


def check_commands(argv: list[str]) -> None:
    """At most one of Hydra's commands (Hydra raises a ValueError for more); ``--resolve`` only
    with the config it resolves."""
    names = [a.split("=", 1)[0] for a in split_args(argv)[0]]
    given = list(dict.fromkeys(COMMANDS[a] for a in names if a in COMMANDS))
    if len(given) > 1:
        hint = ("; to see the config of one job of a sweep, drop -m and give one value per "
                "swept setting (e.g. --cfg job M=1)" if {"-m", "--cfg"} <= set(given) else "")
        raise ConfigError(f"{' and '.join(given)} cannot be used together: a command takes one "
                          "of --run, -m (--multirun), --cfg, --info, --shell-completion" + hint)
    if given == ["--cfg"]:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException

        try:
            parsed = OverridesParser.create().parse_overrides(override_args(argv))
        except HydraException as exc:
            raise grammar_error(exc, override_args(argv)) from exc
        for o in parsed:
            if o.is_sweep_override():
                first = sweep_values(o, o.key_or_group)[0]
                raise ConfigError(f"{o.input_line} is a sweep: --cfg prints the config of one "
                                  f"job; give one value (e.g. {o.key_or_group}="
                                  f"{first if isinstance(first, str) else encode(first)})")
    if "--resolve" in names and not {"--cfg", "-c", "--help", "-h"} & set(names):
        raise ConfigError("--resolve works only with --cfg or --help (it resolves the config "
                          "they print), e.g. --cfg job --resolve")


def grammar_error(exc: BaseException, args: list[str]) -> ConfigError:
    """The one-line refusal of overrides Hydra's grammar cannot parse (``exc``), naming the
    override that fails and how to quote a value that holds spaces, brackets or commas (a
    column name such as ``pos [m]``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    bad = None
    for a in args:
        try:
            parser.parse_overrides([a])
        except HydraException:
            bad = a
            break
    if bad is None:
        return ConfigError(one_line(exc))
    return ConfigError(
        f"{bad}: {one_line(exc).split('; See ')[0]}; allowed: Hydra's override grammar "
        "(https://hydra.cc/docs/advanced/override_grammar/basic/): a value with spaces, "
        "brackets, commas or '=' goes in quotes, in a list each such name, e.g. "
        "'data.states=[\"pos [m]\",\"vel [m/s]\"]' (the single quotes for the shell)")


def sweep_values(override, key: str) -> list:
    if override.is_interval_sweep():
        raise ConfigError(f"{override.input_line} is an interval sweep, which needs an optimizing "
                          f"sweeper; list the values instead (e.g. {key}=0.1,0.5 or "
                          f"{key}=range(1,5))")
    if override.is_sweep_override():
        from hydra.core.override_parser.types import QuotedString

        # a quoted item of a sweep ("uniform",samples) is a string like the others
        return [v.text if isinstance(v, QuotedString) else v for v in override.sweep_iterator()]
    return [override.value()]


def is_multirun(argv: list[str]) -> bool:
    return "-m" in argv or "--multirun" in argv


def encode(v) -> str:
    """A Python value as override text that Hydra parses back to the same value (strings and
    paths quoted, so ``'1'`` stays a string; lists and mappings nested)."""
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(encode(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ",".join(f"{k}:{encode(x)}" for k, x in v.items()) + "}"
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (str, Path)):
        v = str(v)
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(v)


def absolute_config_path(argv: list[str]) -> list[str]:
    """``argv`` with a relative ``--config-path`` made absolute: a folder relative to the
    working folder (Hydra would look for it inside the package)."""
    out = list(argv)
    for i, a in enumerate(out):
        if a in ("--config-path", "-cp") and i + 1 < len(out):
            out[i + 1] = os.path.abspath(out[i + 1])
        elif a.split("=", 1)[0] in ("--config-path", "-cp") and "=" in a:
            flag, value = a.split("=", 1)
            out[i] = f"{flag}={os.path.abspath(value)}"
    return out


def flags_first(argv: list[str]) -> list[str]:
    """Hydra's argument parser wants its flags before the overrides: put them there."""
    flags, rest = split_args(argv)
    return flags + rest
