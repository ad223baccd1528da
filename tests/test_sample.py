"""The main job's sample (suite.conformance.sample): every family, fewer cases, and what it left said."""

from __future__ import annotations

import json
import types
from collections import Counter

import numpy as np
import pytest

from suite.conformance import sample
from suite.plugins.declarations import MASK_FORMS
from suite.spec import oracle
from suite.sweep.point import Point

PLAIN = types.SimpleNamespace(mask_forms=frozenset())
COMPILER = types.SimpleNamespace(mask_forms=frozenset(), compiles_per_shape=True)


def test_every_family_is_sampled_and_a_per_shape_compiler_takes_the_first_of_each():
    for family, names in sample.SAMPLE.items():
        assert all(sample.sampled(PLAIN, "cpu", family, n) for n in names), family
        assert sample.sampled(COMPILER, "cpu", family, names[0])
        assert not any(sample.sampled(COMPILER, "cpu", family, n) for n in names[1:])
    # an interpreted kernel is sampled as a per-shape compiler
    assert not sample.sampled(PLAIN, "cpu-interpret", "masking", sample.SAMPLE["masking"][1])
    assert not sample.sampled(PLAIN, "cpu", "masking", "none")  # a case outside the sample
    assert sample.sampled(PLAIN, "cpu", "a_new_family", "anything")  # unknown: all of it


def test_property_based_examples_fall_with_what_a_new_shape_costs():
    """Ten draws on an eager plugin, three where a built-in's code generator compiles each
    shape (``compile_path``: XLA's jit, an exporter), one on a per-shape compiler or an
    interpreted kernel; never more than the full count (CI's selection calls the same)."""
    jit_builtin = type("Jit", (), {"compile_path": "XLA", "__module__": "implementations.x"})()
    users_jit = type("UsersJit", (), {"compile_path": "XLA", "__module__": "my_plugin"})()
    counts = {name: sample.examples(impl, device, 25) for name, impl, device in [
        ("plain", PLAIN, "cpu"), ("jit", jit_builtin, "cpu"), ("users_jit", users_jit, "cpu"),
        ("compiler", COMPILER, "cpu"), ("interpreted", PLAIN, "cpu-interpret")]}
    assert counts == {"plain": sample.SAMPLE_EXAMPLES, "jit": sample.SAMPLE_EXAMPLES_COMPILE_PATH,
                      "users_jit": sample.SAMPLE_EXAMPLES, "compiler": 1, "interpreted": 1}
    assert sample.SAMPLE_EXAMPLES > sample.SAMPLE_EXAMPLES_COMPILE_PATH > 1
    assert sample.examples(jit_builtin, "cpu", 2) == 2  # at most the full count


def test_mask_forms_sample_spreads_over_the_declared_forms():
    declared = [f for f in MASK_FORMS if f.startswith(("bool", "kpm"))]
    impl = types.SimpleNamespace(mask_forms=frozenset(declared))
    chosen = [f for f in MASK_FORMS if sample.sampled(impl, "cpu", "mask_forms", f, MASK_FORMS)]
    assert len(chosen) == sample.MASK_FORMS_SAMPLED and set(chosen) <= set(declared)
    assert chosen[0] != declared[0] and any(f.startswith("kpm") for f in chosen)  # spread
    compiled = types.SimpleNamespace(mask_forms=frozenset(declared), compiles_per_shape=True)
    assert sum(sample.sampled(compiled, "cpu", "mask_forms", f, MASK_FORMS)
               for f in MASK_FORMS) == 1
    # a plugin that declares none runs the first form (recorded unsupported), counts none left
    runs = [f for f in MASK_FORMS if sample.sampled(PLAIN, "cpu", "mask_forms", f, MASK_FORMS)]
    assert runs == [next(iter(MASK_FORMS))]
    assert not sample.counted(PLAIN, "mask_forms", runs[0])


def test_sweep_sample_leaves_a_per_shape_compiler_four_lengths_at_the_usual_heads():
    from suite.sweep.presets import arguments, grid

    spec = grid(arguments(preset="default"))
    pts = [Point(**p) for p in spec["points"]]
    assert all(sample.sweep_left_out(PLAIN, "cpu", p, spec) is None for p in pts)
    kept = [p for p in pts if sample.sweep_left_out(COMPILER, "cpu", p, spec) is None]
    assert sorted({p.L for p in kept}) == [128, 512, 1024, 2048]
    assert {p.H for p in kept} == {8} and {p.mask for p in kept} == {"none", "causal"}
    left = [p for p in pts if p not in kept]
    assert left and all("mha-suite sweep times all" in sample.sweep_left_out(
        COMPILER, "cpu", p, spec) for p in left)


def test_the_ci_presets_sample_leaves_a_per_shape_compiler_its_longest_length():
    from suite.sweep.presets import arguments, grid

    spec = grid(arguments(preset="ci"))
    pts = [Point(**p) for p in spec["points"]]
    assert all(sample.sweep_left_out(PLAIN, "cpu", p, spec) is None for p in pts)
    kept = [p for p in pts if sample.sweep_left_out(COMPILER, "cpu", p, spec) is None]
    assert {(p.L, p.H) for p in kept} == {(256, 4)}
    assert {p.mask for p in kept} == {"none", "causal"}


def test_left_line_counts_per_family():
    assert sample.left_line({}) is None
    line = sample.left_line({"a": {"tiles": 8, "masking": 14}, "b": {"tiles": 8}})
    assert "30 cases" in line and "masking 14, tiles 16" in line


def test_sampled_check_records_its_sample_and_what_it_left(cli, tmp_path):
    """numpy through the CLI: the records are the sample's cases, the results file counts
    what it left per family, and no declaration is called stale on a partial run."""
    out = tmp_path / "c.json"
    proc = cli("check", "--impl", "numpy", "--dtype", "float32", "--sample", "--workers", "0",
               "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    ran = Counter(r["family"] for r in doc["results"])
    assert ran == {**{f: len(names) for f, names in sample.SAMPLE.items()}, "mask_forms": 1}
    fixed = {(r["family"], r["case"]) for r in doc["results"] if r["family"] != "mask_forms"}
    assert all(sample.sampled(PLAIN, "cpu", f, c) for f, c in fixed)
    numpy = next(i for i in doc["implementations"] if i["name"] == "numpy")
    left = numpy["left_to_check"]
    from suite.conformance.catalog import of_family

    for family in ("masking", "shapes", "tiles", "special_values", "properties", "gradients"):
        total = len(of_family(family))
        assert left[family] == total - len(sample.SAMPLE[family]), family
    assert "mask_forms" not in left  # numpy declares no form: nothing left to run there
    assert "left " + str(sum(left.values())) + " cases to `mha-suite check`" in proc.stdout
    assert "stale declaration" not in proc.stdout


def test_report_headline_says_what_the_sample_left(tmp_path):
    from bs4 import BeautifulSoup

    from reports.cli import build_report
    from tests.conftest import ROOT

    src = json.loads(next((ROOT / "tests" / "fixtures" / "vm").glob("conformance*.json")).read_text())
    src["implementations"][0]["left_to_check"] = {"tiles": 8, "masking": 14}
    (tmp_path / "conformance.json").write_text(json.dumps(src))
    out = build_report([tmp_path], tmp_path / "report.html")
    soup = BeautifulSoup(out.read_text(), "html.parser")
    items = [a.get_text(" ", strip=True) for a in soup.find(id="headline").find_all("a")]
    assert any("main job's sample: 22 cases left to mha-suite check (masking 14, tiles 8)"
               in t for t in items), items


def test_oracle_passes_are_shared_by_content_and_read_only():
    from suite.spec.problem import make_problem

    p = make_problem(3, 2, 5, 7, 16, 2)
    first = oracle.forward(p)
    again = oracle.forward(make_problem(3, 2, 5, 7, 16, 2))  # equal content, built anew
    assert again is first
    with pytest.raises(ValueError):
        first["out"][0, 0, 0] = 1.0  # a caller cannot corrupt what others will read
    changed = make_problem(3, 2, 5, 7, 16, 2)
    changed.query[0, 0, 0] += 1e-12  # any bit of any array makes another pass
    assert oracle.digest(changed) != oracle.digest(p)
    assert oracle.forward(changed) is not first
    assert oracle.forward(p, fully_masked="nan") is not first
    b32, b16 = oracle.first_order(p, "float32"), oracle.first_order(p, "float16")
    assert np.all(b16[0] > b32[0])  # keyed by dtype too
