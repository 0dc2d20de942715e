"""fnsysid.config.fast_configs: copies and parses within the block equal OmegaConf's own."""

import copy
import dataclasses
import enum
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf, grammar_parser, open_dict
from omegaconf._utils import get_omega_conf_dumper
from omegaconf.base import Container, Node
from omegaconf.errors import GrammarParseError

from fnsysid.config import fast_configs
from fnsysid.config.fast_configs import faster_configs
from fnsysid.config.groups import CONF_DIR

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


class Colour(enum.Enum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass
class Inner:
    colour: Colour = Colour.BLUE
    path: Path = Path("/tmp/x")
    data: bytes = b"ab"
    ratio: float = 0.5
    flag: bool = True


@dataclasses.dataclass
class Outer:
    inner: Inner = dataclasses.field(default_factory=Inner)
    items: list[int] = dataclasses.field(default_factory=lambda: [1, 2])
    maybe: int | None = None
    missing: str = MISSING
    name: str = "n"
    link: str = "${name}-x"
    stamp: Any = "${fc_test_now:}"


def _fields(meta) -> dict:
    return {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}


def _assert_same(a: Node, b: Node, a_parent, b_parent) -> None:
    """``b`` is a copy of ``a`` as OmegaConf's own deep copy makes it: same class and state,
    its own metadata and flags, children parented to their copy."""
    assert type(a) is type(b)
    assert set(a.__dict__) == set(b.__dict__)
    ma, mb = a.__dict__["_metadata"], b.__dict__["_metadata"]
    assert type(ma) is type(mb) and ma is not mb
    assert _fields(ma) == _fields(mb)
    if ma.flags is not None:
        assert ma.flags is not mb.flags
    if hasattr(ma, "resolver_cache"):
        assert ma.resolver_cache is not mb.resolver_cache
    assert a.__dict__["_flags_cache"] == b.__dict__["_flags_cache"]
    assert a.__dict__["_parent"] is a_parent and b.__dict__["_parent"] is b_parent
    if isinstance(a, Container):
        ca, cb = a.__dict__["_content"], b.__dict__["_content"]
        if isinstance(ca, dict):
            assert list(ca) == list(cb)
            for k in ca:
                _assert_same(ca[k], cb[k], a, b)
        elif isinstance(ca, list):
            assert len(ca) == len(cb)
            for x, y in zip(ca, cb, strict=True):
                _assert_same(x, y, a, b)
        else:
            assert ca == cb
    else:
        assert a.__dict__["_val"] is b.__dict__["_val"]
        for key in set(a.__dict__) - {"_metadata", "_flags_cache", "_parent", "_val"}:
            assert a.__dict__[key] == b.__dict__[key]     # an enum node's type and fields


def _compare(cfg) -> None:
    stock = copy.deepcopy(cfg)
    with faster_configs():
        fast = copy.deepcopy(cfg)
    _assert_same(stock, fast, cfg.__dict__["_parent"], cfg.__dict__["_parent"])
    assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(cfg)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_copies_of_every_experiment_are_omegaconfs(name):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
    _compare(cfg)
    _compare(cfg.hydra)                 # a sub-tree keeps its parent, as HydraConfig copies it


def test_copies_of_typed_nodes_flags_and_caches():
    calls = iter(range(1, 100))
    OmegaConf.register_new_resolver("fc_test_now", lambda: [next(calls)], use_cache=True,
                                    replace=True)
    cfg = OmegaConf.structured(Outer)
    assert list(cfg.stamp) == [1]                    # cached in the root's resolver cache
    OmegaConf.set_readonly(cfg.inner, True)
    OmegaConf.set_struct(cfg, True)
    cfg._get_flag("readonly")                        # fills flags caches
    _compare(cfg)
    with faster_configs():
        c = copy.deepcopy(cfg)
    # the resolver's cache is copied with the config: the copy does not resolve again ...
    assert list(c.stamp) == [1]
    c._metadata.resolver_cache.clear()
    assert list(c.stamp) == [2]                      # resolved anew
    assert list(cfg.stamp) == [1]                    # ... and its cache is its own
    # flags and values are the copy's own
    OmegaConf.set_readonly(c.inner, False)
    c.inner.ratio = 2.0
    assert OmegaConf.is_readonly(cfg.inner) and cfg.inner.ratio == 0.5
    c["items"].append(3)
    assert list(cfg["items"]) == [1, 2]


def test_interpolation_results_still_refuse_to_be_copied():
    cfg = OmegaConf.create({"a": 1, "b": "x${a}"})
    node = cfg._get_node("b")._dereference_node()
    assert type(node).__name__ == "InterpolationResultNode"
    with faster_configs(), pytest.raises(NotImplementedError):
        copy.deepcopy(node)


def test_parse_is_kept_per_text_and_errors_still_raise():
    fast_configs._parse.cache_clear()
    with faster_configs():
        cfg = OmegaConf.create({"a": 2, "b": "${a}", "c": "x${b}y", "d": "${oc.select:a,1}"})
        assert (cfg.b, cfg.c, cfg.d) == (2, "x2y", 2)
        cfg.a = 5
        assert (cfg.b, cfg.c, cfg.d) == (5, "x5y", 5)    # same trees, resolved again
        assert fast_configs._parse.cache_info().hits >= 3
        for _ in range(2):                               # an error is not kept
            with pytest.raises(GrammarParseError):
                OmegaConf.create({"bad": "${a"})


def test_the_block_restores_omegaconf():
    before = (DictConfig.__deepcopy__, ListConfig.__deepcopy__)
    with faster_configs():
        with faster_configs():
            pass
        assert DictConfig.__deepcopy__ is fast_configs._copy_container  # nested: still on
    assert (DictConfig.__deepcopy__, ListConfig.__deepcopy__) == before
    assert "__deepcopy__" not in vars(type(OmegaConf.create({})._metadata))
    import omegaconf.base
    assert omegaconf.base.parse is grammar_parser.parse


def _yaml_both(cfg, **kw) -> tuple[str, str]:
    stock = OmegaConf.to_yaml(cfg, **kw)
    with faster_configs():
        fast = OmegaConf.to_yaml(cfg, **kw)
    return stock, fast


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_yaml_of_every_experiment_is_omegaconfs(name):
    """The files Hydra writes for jobs that differ in a value: each the same text."""
    fast_configs._ENTRIES.clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for m in (3, 4):                         # the second job reuses most entries' texts
            cfg = compose("config", overrides=[f"experiment={name}", f"M={m}"],
                          return_hydra_config=True)
            hydra_cfg = OmegaConf.create({"hydra": cfg.hydra})
            job_cfg = copy.deepcopy(cfg)
            with open_dict(job_cfg):
                del job_cfg["hydra"]
            for x, kw in [(cfg, {}), (hydra_cfg, {}), (job_cfg, {}), (job_cfg, {"resolve": True}),
                          (cfg.hydra.overrides.task, {})]:
                stock, fast = _yaml_both(x, **kw)
                assert fast == stock


def test_yaml_of_awkward_entries_is_omegaconfs():
    fast_configs._ENTRIES.clear()
    tricky = {
        "true": {"a": 1, "b": 2},                # a key YAML would read as a bool: quoted
        "k" * 130: {"a": 1, "b": 2},             # a key too long for a simple key
        "empty": {}, "none": None, "list": [], "nested": {"x": {}, "y": [1, {"z": "1"}]},
        "one": {"only": 1},
        "text": {"long": "word " * 40, "emoji": "\U0001F600 tab\tend", "lines": "a\nb",
                 "num": "1e3", "bool": "yes", "float": 1.0, "int": 1, "flag": True},
        "x": "${one.only}",
    }
    cfg = OmegaConf.create(tricky)
    for kw in ({}, {"resolve": True}, {"sort_keys": True}):
        for _ in range(2):                       # emitted, then from the kept texts
            stock, fast = _yaml_both(cfg, **kw)
            assert fast == stock
    for other in (OmegaConf.create({}), OmegaConf.create([1, {"a": 2}]),
                  OmegaConf.create({"a": {"b": 1, "c": 2}}),
                  OmegaConf.create({"a": {"b": 1, "c": "2"}})):   # c: 2 and '2' differ
        stock, fast = _yaml_both(other)
        assert fast == stock


def test_yaml_of_objects_is_emitted_every_time():
    """An object's repr need not tell its YAML apart: such entries are not kept."""

    class Same:
        def __init__(self, v):
            self.v = v

        def __repr__(self):
            return "Same"

    yaml.add_representer(Same, lambda d, o: d.represent_int(o.v),
                         Dumper=get_omega_conf_dumper())
    flags = {"allow_objects": True}
    for v in (1, 2):
        for parent in (False, True):
            data = {"x": {"v": Same(v), "w": 0}} if parent else {"v": Same(v)}
            stock, fast = _yaml_both(OmegaConf.create(data, flags=flags))
            assert fast == stock and f"v: {v}" in fast
