"""OmegaConf's deep copies and interpolation parses, made cheaper within :func:`faster_configs`.

A sweep job passes through Hydra with its config copied a dozen times (the composition, the
sweep check, ``run_job``'s copies of the config and of ``hydra``, ``HydraConfig.set_config``'s
masked copies, ``instantiate``), and Hydra parses the same interpolations (``${system.knobs.N}``)
with OmegaConf's ANTLR grammar again for every composition. For this project's config of about
220 nodes, OmegaConf 2.3 spends about 8 ms on one deep copy, most of it in Python's generic
``copy.deepcopy`` of each node's metadata (a dataclass, copied field by field through
``__reduce_ex__``) and in building each new node through its constructor only to overwrite every
attribute; a parse of ``${...}`` costs about 1 ms.

Within :func:`faster_configs`:

- a node's metadata is copied as OmegaConf copies it (a new object with the same field values,
  its ``flags`` dict copied, a container's ``resolver_cache`` deep-copied) without the generic
  machinery: the other fields are types, keys and booleans, which ``copy.deepcopy`` returns as
  they are;
- a value node is copied as OmegaConf's ``_deepcopy_impl`` does (same class, the value shared,
  the parent kept, the metadata copied, no flags cache), without running its constructor;
- a ``DictConfig`` or ``ListConfig`` is copied as OmegaConf's own ``__deepcopy__`` does, with
  the new container made without its constructor (every attribute the constructor would set is
  then set);
- ``omegaconf.grammar_parser.parse`` keeps the parse tree of each text, rule and lexer mode
  (the tree is only read when it is resolved; tokens keep the text they were parsed from);
- ``OmegaConf.to_yaml`` (Hydra's ``.hydra/*.yaml`` and ``multirun.yaml``) keeps the YAML text
  of each top-level entry (of each entry of ``hydra``) and emits only the entries it has not
  emitted before: the jobs of a sweep differ in a few values, and half of ``hydra.yaml`` is
  the ``--help`` text, which PyYAML's emitter scans character by character.

The copies are the same objects, node for node, as OmegaConf's (``tests/test_fast_configs.py``
compares them on every stored experiment's composed configs); about 2.5 times faster. The
block restores OmegaConf's own functions when it ends. ``python run.py`` and
``scripts/make_figure.py`` run inside it; importing :mod:`fnsysid` changes nothing.
"""

from __future__ import annotations

import copy
import functools
from contextlib import contextmanager
from pathlib import PurePath

import omegaconf._utils as oc_utils
import omegaconf.base as oc_base
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, grammar_parser, nodes
from omegaconf._utils import _ensure_container, get_omega_conf_dumper
from omegaconf.base import ContainerMetadata, Metadata

#: value-node classes whose ``__deepcopy__`` is ``res = Cls(); self._deepcopy_impl(res, memo)``
#: (``InterpolationResultNode`` refuses to be copied and keeps doing so)
VALUE_NODES = (nodes.AnyNode, nodes.StringNode, nodes.PathNode, nodes.IntegerNode,
               nodes.BytesNode, nodes.FloatNode, nodes.BooleanNode, nodes.EnumNode)


def _copy_metadata(self: Metadata, memo: dict) -> Metadata:
    new = copy.copy(self)
    if self.flags is not None:
        new.flags = dict(self.flags)
    return new


def _copy_container_metadata(self: ContainerMetadata, memo: dict) -> ContainerMetadata:
    new = _copy_metadata(self, memo)
    new.resolver_cache = copy.deepcopy(self.resolver_cache, memo)
    return new


def _copy_value_node(self, memo: dict):
    res = object.__new__(type(self))
    state = res.__dict__
    state.update(self.__dict__)             # value, parent (and an enum node's enum type)
    state["_metadata"] = _copy_metadata(self.__dict__["_metadata"], memo)
    state["_flags_cache"] = None
    return res


def _copy_children(children, res, memo: dict):
    """Copies of a container's child nodes, each with ``res`` as parent (as OmegaConf does)."""
    for v in children:
        state = v.__dict__
        old_parent = state["_parent"]
        try:
            state["_parent"] = None
            vc = copy.deepcopy(v, memo)
            vc.__dict__["_parent"] = res
            yield vc
        finally:
            state["_parent"] = old_parent


def _copy_container(self, memo: dict):
    """A ``DictConfig`` or ``ListConfig`` copied as its own ``__deepcopy__`` copies it (always
    of that class, as OmegaConf's are)."""
    res = object.__new__(DictConfig if isinstance(self, DictConfig) else ListConfig)
    src, state = self.__dict__, res.__dict__
    state["_metadata"] = copy.deepcopy(src["_metadata"], memo)
    flags = src["_flags_cache"]
    state["_flags_cache"] = None if flags is None else dict(flags)
    content = src["_content"]
    if isinstance(content, dict):
        keys = list(content)
        content = dict(zip(keys, _copy_children(content.values(), res, memo), strict=True))
    elif isinstance(content, list):
        content = list(_copy_children(content, res, memo))
    state["_content"] = content          # None, "???" or an interpolation: shared as it is
    state["_parent"] = src["_parent"]
    return res


def _dump(data) -> str:
    """OmegaConf's ``to_yaml`` of a plain container."""
    return yaml.dump(data, default_flow_style=False, allow_unicode=True, sort_keys=False,
                     Dumper=get_omega_conf_dumper())


#: YAML text of mapping entries, by (parent key or None, key, repr of the value)
_ENTRIES: dict[tuple, str | None] = {}


def _entry_text(parent, key, value) -> str | None:
    """The lines that ``{key: value}`` adds to a YAML mapping (to the mapping of ``parent``,
    a top-level key, if given; None if ``parent``'s own line is not ``parent:``).

    A plain container's ``repr`` tells its emitted text apart: it names every key, value and
    type (``1``, ``1.0``, ``'1'`` and ``True`` differ); ``to_container`` shares no list or
    dict between entries, so no entry refers to another (no YAML aliases). An entry holding
    any other object (a config with ``allow_objects``) is emitted every time."""
    if not (_plain(key) and _plain(value)):
        return _emit_entry(parent, key, value)
    cache_key = (parent, repr(key), repr(value))
    if cache_key not in _ENTRIES:
        if len(_ENTRIES) >= 8192:
            _ENTRIES.clear()
        _ENTRIES[cache_key] = _emit_entry(parent, key, value)
    return _ENTRIES[cache_key]


def _emit_entry(parent, key, value) -> str | None:
    """:func:`_entry_text`, emitted."""
    if parent is None:
        return _dump({key: value})
    text, head = _dump({parent: {key: value}}), f"{parent}:\n"
    return text[len(head):] if text.startswith(head) else None


#: types whose ``repr`` names the value and its type
_PLAIN = (str, bytes, bool, int, float, type(None))


def _plain(value) -> bool:
    """Whether ``value`` holds nothing but dicts, lists, paths and :data:`_PLAIN` values."""
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return type(value) in _PLAIN or isinstance(value, PurePath)


def _to_yaml(cfg, *, resolve: bool = False, sort_keys: bool = False) -> str:
    """``OmegaConf.to_yaml``, the same text, from the kept texts of its entries."""
    if sort_keys:
        return _OMEGACONF_TO_YAML(cfg, resolve=resolve, sort_keys=sort_keys)
    container = OmegaConf.to_container(_ensure_container(cfg), resolve=resolve,
                                       enum_to_str=True)
    if not isinstance(container, dict) or not container:
        return _dump(container)
    parts = []
    for key, value in container.items():
        if isinstance(key, str) and isinstance(value, dict) and len(value) > 1:
            inner = [_entry_text(key, k, v) for k, v in value.items()]  # hydra: entry by entry
            if None not in inner:
                parts += [f"{key}:\n", *inner]
                continue
        parts.append(_entry_text(None, key, value))
    return "".join(parts)


_OMEGACONF_TO_YAML = OmegaConf.to_yaml


@functools.lru_cache(maxsize=4096)
def _parse(value: str, parser_rule: str = "configValue", lexer_mode: str = "DEFAULT_MODE"):
    return _OMEGACONF_PARSE(value, parser_rule, lexer_mode)


_OMEGACONF_PARSE = grammar_parser.parse

#: (object, attribute, this module's replacement)
_PATCHES = [
    (Metadata, "__deepcopy__", _copy_metadata),
    (ContainerMetadata, "__deepcopy__", _copy_container_metadata),
    *((cls, "__deepcopy__", _copy_value_node) for cls in VALUE_NODES),
    (DictConfig, "__deepcopy__", _copy_container),
    (ListConfig, "__deepcopy__", _copy_container),
    (oc_base, "parse", _parse),             # the modules that call parse imported it by name
    (oc_utils, "parse", _parse),
    (OmegaConf, "to_yaml", staticmethod(_to_yaml)),
]

_depth = 0


@contextmanager
def faster_configs():
    """Within the block, OmegaConf copies configs and parses interpolations as described in
    the module's docstring (nested blocks are fine)."""
    global _depth
    saved = [(obj, name, obj.__dict__.get(name)) for obj, name, _ in _PATCHES]
    if _depth == 0:
        for obj, name, new in _PATCHES:
            setattr(obj, name, new)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            for obj, name, old in saved:
                if old is None:
                    delattr(obj, name)
                else:
                    setattr(obj, name, old)
