"""CI's covering selection over built-ins that share a compile path (``compile_path``)."""

from __future__ import annotations

from collections import defaultdict

from suite.conformance import catalog, cover
from suite.plugins.declarations import MASK_FORMS

DTYPES = ("bfloat16", "float32")
EVERY_FEATURE = frozenset().union(*(c.problem().features() for c in catalog.ALL))
VARIANT_FEATURES = frozenset({"softcap", "alibi", "rel_bias", "sinks", "score_mod",
                              "value_width"})


def _plugin(name: str, module: str = "implementations.fake", **attrs):
    return type(name, (), {"__module__": module, "name": name,
                           "mask_forms": frozenset(list(MASK_FORMS)[:4]), **attrs})()


def _items(impls) -> list:
    cases = [(c.family, c.name) for c in catalog.ALL] + [("hypothesis", "random_shapes"),
                                                          ("contracts", "agrees")]
    return [cover.Item(f"test_case[{name}-cpu-{dtype}-{fam}/{case}]", impl, name, "cpu", dtype,
                       fam, case)
            for name, impl in impls for dtype in DTYPES for fam, case in cases]


def _families(items, keep) -> dict:
    """name -> the families CI's selection keeps of it."""
    out = defaultdict(set)
    for it, k in zip(items, keep):
        if k:
            out[it.impl_name].add(it.family)
    return out


def test_siblings_split_the_families_their_contracts_among_them():
    names = ("a", "b", "c")
    sibs = [(n, _plugin(n, compiles_per_shape=True, compile_path="one exporter",
                        features=EVERY_FEATURE)) for n in names]
    alone = [(n, _plugin(n, compiles_per_shape=True, features=EVERY_FEATURE)) for n in names]
    items, lone = _items(sibs), _items(alone)
    keep, keep_alone = cover.choose(items, [], MASK_FORMS), cover.choose(lone, [], MASK_FORMS)
    fams, fams_alone = _families(items, keep), _families(lone, keep_alone)
    every = fams_alone["a"]
    assert every == fams_alone["b"] == fams_alone["c"]  # without a path: all on each
    assert "contracts" in every
    for family in every - {"lanes"}:
        assert sum(family in fams[n] for n in names) == 1, family  # once per path
    lanes = defaultdict(set)  # the sample's lanes cases: each on one of them
    for it, k in zip(items, keep):
        if k and it.family == "lanes":
            lanes[it.case].add(it.impl_name)
    assert lanes and all(len(v) == 1 for v in lanes.values()), lanes
    assert set().union(*fams.values()) == every  # no family lost
    assert all(len(fams[n]) > 1 for n in names)  # spread, not all on one
    assert sum(keep) < sum(keep_alone) / 2


def test_a_family_goes_to_a_sibling_that_declares_what_its_cases_need():
    plain = EVERY_FEATURE - VARIANT_FEATURES
    sibs = [("a", _plugin("a", compiles_per_shape=True, compile_path="p", features=plain)),
            ("b", _plugin("b", compiles_per_shape=True, compile_path="p", features=plain)),
            ("capped", _plugin("capped", compiles_per_shape=True, compile_path="p",
                               features=EVERY_FEATURE))]
    items = _items(sibs)
    fams = _families(items, cover.choose(items, [], MASK_FORMS))
    assert "variants" in fams["capped"]
    assert "variants" not in fams["a"] | fams["b"]


def test_a_users_plugin_on_a_builtins_path_keeps_every_family():
    builtin = _plugin("builtin", compiles_per_shape=True, compile_path="p",
                      features=EVERY_FEATURE)
    users = _plugin("mine", module="my_plugin", compiles_per_shape=True, compile_path="p",
                    features=EVERY_FEATURE)
    alone = _plugin("mine", module="my_plugin", compiles_per_shape=True, features=EVERY_FEATURE)
    items, lone = _items([("builtin", builtin), ("mine", users)]), _items([("mine", alone)])
    fams = _families(items, cover.choose(items, [], MASK_FORMS))
    assert fams["mine"] == _families(lone, cover.choose(lone, [], MASK_FORMS))["mine"]


def test_lanes_run_once_per_path_and_the_other_families_stay_on_each():
    names = ("x", "y")
    sibs = [(n, _plugin(n, compile_path="XLA", features=EVERY_FEATURE)) for n in names]
    alone = [(n, _plugin(n, features=EVERY_FEATURE)) for n in names]
    items, lone = _items(sibs), _items(alone)
    keep, keep_alone = cover.choose(items, [], MASK_FORMS), cover.choose(lone, [], MASK_FORMS)
    lanes = defaultdict(set)  # lane case -> the names it runs on (in one dtype or several)
    for it, k in zip(items, keep):
        if k and it.family == "lanes":
            lanes[it.case].add(it.impl_name)
    every_lane = {c.name for c in catalog.of_family("lanes")}
    assert set(lanes) == every_lane and all(len(v) == 1 for v in lanes.values()), lanes
    assert set().union(*lanes.values()) == set(names)
    others = [(it.test, k) for it, k in zip(items, keep) if it.family != "lanes"]
    assert others == [(it.test, k) for it, k in zip(lone, keep_alone) if it.family != "lanes"]


def test_a_known_failure_entry_still_runs_on_the_sibling_it_names():
    sibs = [(n, _plugin(n, compiles_per_shape=True, compile_path="p", features=EVERY_FEATURE))
            for n in ("a", "b")]
    items = _items(sibs)
    fams = _families(items, cover.choose(items, [], MASK_FORMS))
    family = next(f for f in sorted(fams["a"]) if f not in fams["b"])
    entry = f"test_case[[]b-cpu-*-{family}/*]"
    keep = cover.choose(items, [entry], MASK_FORMS)
    assert any(k and it.impl_name == "b" and it.family == family
               for it, k in zip(items, keep))
