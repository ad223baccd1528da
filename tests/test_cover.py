"""CI's covering selection (suite.conformance.cover) and --strict-declarations."""

from __future__ import annotations

import fnmatch
import json
import types
from collections import defaultdict

import pytest

from suite.conformance import catalog, cover
from suite.plugins.declarations import MASK_FORMS
from tests.conftest import run_cli

PLAIN = types.SimpleNamespace(mask_forms=frozenset(list(MASK_FORMS)[:6]))
COMPILER = types.SimpleNamespace(mask_forms=frozenset(list(MASK_FORMS)[:6]),
                                 compiles_per_shape=True)
DTYPES = ("bfloat16", "float16", "float32", "float64")


def _items(impls) -> list:
    """Every catalogue case (and the Hypothesis one) of each (name, impl) in every dtype, as
    the conformance session collects them."""
    cases = [(c.family, c.name) for c in catalog.ALL] + [("hypothesis", "random_shapes"),
                                                          ("hypothesis", "random_inference")]
    return [cover.Item(f"test_case[{name}-cpu-{dtype}-{fam}/{case}]", impl, name, "cpu", dtype,
                       fam, case)
            for name, impl in impls for dtype in DTYPES for fam, case in cases]


def _kept_dtypes(items, keep, name) -> dict:
    """family -> the dtypes CI's selection keeps of implementation ``name``."""
    dtypes = defaultdict(set)
    for it, k in zip(items, keep):
        if k and it.impl_name == name:
            dtypes[it.family].add(it.dtype)
    return dtypes


def test_every_family_and_every_dtype_meet_every_implementation():
    items = _items([("plain", PLAIN), ("compiled", COMPILER)])
    keep = cover.choose(items, [], MASK_FORMS)
    for name in ("plain", "compiled"):
        dtypes = _kept_dtypes(items, keep, name)
        assert set(dtypes) == {it.family for it in items}
        assert set().union(*dtypes.values()) == set(DTYPES)
    assert 0 < sum(keep) < len(items) / 6  # a selection, not the matrix
    assert cover.choose(items, [], MASK_FORMS) == keep  # deterministic


def test_a_family_runs_in_one_dtype_but_where_the_dtype_is_the_point():
    items = _items([("plain", PLAIN), ("compiled", COMPILER)])
    keep = cover.choose(items, [], MASK_FORMS)
    plain = _kept_dtypes(items, keep, "plain")
    for family, dtypes in plain.items():
        if family in cover.EVERY_DTYPE_FAMILIES:
            assert dtypes == set(DTYPES), family
        elif family in cover.ONE_DTYPE_FAMILIES:
            assert dtypes == {"float32"}, family
        else:
            assert len(dtypes) == 1, (family, dtypes)
    # a per-shape compiler: every family in one dtype (lanes: each length once, in turn)
    compiled = _kept_dtypes(items, keep, "compiled")
    assert all(len(d) == 1 for f, d in compiled.items() if f != "lanes"), compiled


def test_every_lane_length_meets_each_implementation_once_in_a_dtype_taken_in_turn():
    items = _items([("plain", PLAIN), ("compiled", COMPILER)])
    keep = cover.choose(items, [], MASK_FORMS)
    lanes = [c.name for c in catalog.of_family("lanes")]
    runs = defaultdict(list)
    for it, k in zip(items, keep):
        if k and it.family == "lanes":
            runs[(it.impl_name, it.case)].append(it.dtype)
    assert all(runs[("plain", case)] for case in lanes)  # every length, kind and impl
    assert {d for case in lanes for d in runs[("plain", case)]} == set(DTYPES)
    # a per-shape compiler keeps the sample's three lengths (a compile each)
    assert {c for (name, c) in runs if name == "compiled"} == {
        "nan_query_S4", "fully_masked_S9", "nan_padding_S17"}


def test_every_known_failure_entry_names_kept_cases():
    items = _items([("plain", PLAIN), ("compiled", COMPILER)])
    entries = ["test_case[[]compiled-cpu-float16-tiles/padding_across_blocks[]]",
               "test_case[[]plain-cpu-*-shapes/no_projection_bias[]]",
               "test_case[[]nobody-*[]]"]
    keep = cover.choose(items, entries, MASK_FORMS)
    base = cover.choose(items, [], MASK_FORMS)
    added = [it.test for it, k, b in zip(items, keep, base) if k and not b]
    assert len(added) == 1 + cover.PER_ENTRY
    assert "test_case[compiled-cpu-float16-tiles/padding_across_blocks]" in added
    assert sum("shapes/no_projection_bias" in t for t in added) == cover.PER_ENTRY


def test_left_counts_leave_undeclared_mask_forms_out():
    items = _items([("plain", PLAIN)])
    keep = cover.choose(items, [], MASK_FORMS)
    left = cover.left_counts(items, keep)["plain"]
    # each drawn case ran in one dtype
    assert left["masking"] > 0 and left["hypothesis"] == 2 * (len(DTYPES) - 1)
    undeclared = sum(1 for it in items if it.family == "mask_forms"
                     and it.case not in PLAIN.mask_forms)
    forms = sum(1 for it, k in zip(items, keep) if it.family == "mask_forms" and not k)
    assert left["mask_forms"] == forms - undeclared


def _check(tmp_path, *args):
    return run_cli("check", "--workers", "0", "--json", str(tmp_path / "c.json"), *args)


@pytest.mark.parametrize("strict,condition", [(False, ""), (True, ""),
                                              (True, "{intermittent}  ")])
def test_an_entry_whose_test_passes_fails_only_a_strict_run(tmp_path, strict, condition):
    known = tmp_path / "known.txt"
    entry = "test_case[[]numpy-cpu-float32-lanes/nan_query_S9[]]"
    known.write_text(f"{entry}  {condition}# stale\n")
    done = _check(tmp_path, "--impl", "numpy", "--dtype", "float32", "-k", "nan_query_S9",
                  "--known-failures", str(known), *(["--strict-declarations"] if strict else []))
    out = done.stdout + done.stderr
    assert "listed as a known failure but passed" in out
    if strict and not condition:
        assert done.returncode == 1, out
        assert f"error: known failure '{entry}' lists " \
               "test_case[numpy-cpu-float32-lanes/nan_query_S9]" in out
    else:  # an intermittent failure may not show in a run: not stale for that
        assert done.returncode == 0 and "error: known failure" not in out, out


SHIFT_UNMASKED = """
from implementations.numpy.mha import NumpyMHA


class ShiftUnmasked(NumpyMHA):
    name = "bug.shift_unmasked"

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, weights = super().attend(q, k, v, mask, scale, need_weights)
        return (heads + 0.1 if not mask.kinds else heads), weights
"""


def test_cover_runs_the_case_an_entry_names_and_a_needed_entry_passes_strict(tmp_path):
    plugin = tmp_path / "shift_unmasked.py"
    plugin.write_text(SHIFT_UNMASKED)
    known = tmp_path / "known.txt"
    # masking/none (the family's one case without a mask) is outside the main job's sample:
    # it runs because the entry names it, and the entry is needed there
    known.write_text("test_case[[]bug.shift_unmasked-cpu-float32-masking/none[]]  # planted\n")
    done = run_cli("check", "--plugin", str(plugin), "--impl", "bug.shift_unmasked",
                   "--workers", "0", "--dtype", "float32", "-k", "masking", "--cover",
                   "--strict-declarations", "--known-failures", str(known),
                   "--json", str(tmp_path / "c.json"))
    out = done.stdout + done.stderr
    records = json.loads((tmp_path / "c.json").read_text())["results"]
    ran = {r["case"]: r["outcome"] for r in records if r["family"] == "masking"}
    assert ran.get("none") == "known_failure", out
    assert "valid_lens" not in ran  # outside the sample and named by no entry
    assert "CI's covering selection (--cover) left" in out
    assert done.returncode == 0, out
    known.write_text("")  # without the entry the case is not run, and nothing fails
    done = run_cli("check", "--plugin", str(plugin), "--impl", "bug.shift_unmasked",
                   "--workers", "0", "--dtype", "float32", "-k", "masking", "--cover",
                   "--strict-declarations", "--known-failures", str(known))
    assert done.returncode == 0 and "masking/none" not in done.stdout, done.stdout


WRONG_CROSS = """
from implementations.numpy.mha import NumpyMHA


class WrongCross(NumpyMHA):
    name = "bug.wrong_cross"
    compiles_per_shape = True  # CI's selection gives it one Hypothesis example

    def attend(self, q, k, v, mask, scale, need_weights):
        heads, weights = super().attend(q, k, v, mask, scale, need_weights)
        return (heads + 0.1 if q.shape[-2] != k.shape[-2] else heads), weights
"""


def test_cover_draws_a_listed_hypothesis_failure_to_its_full_count(tmp_path):
    """The first derandomised draw (the one-element problem) and the fixed grouped-query
    example are square, which this plugin gets right: with the entry listed, CI's selection
    draws on (to the full count, stopping at the first failure), so a standing entry is not
    called stale; unlisted, one drawn example, which passes."""
    plugin = tmp_path / "wrong.py"
    plugin.write_text(WRONG_CROSS)
    known = tmp_path / "known.txt"
    known.write_text("test_random_shapes[[]bug.wrong_cross-cpu-float32[]]  # planted\n")
    args = ("check", "--plugin", str(plugin), "--impl", "bug.wrong_cross", "--workers",
            "0", "--dtype", "float32", "-k", "random_shapes", "--cover", "--strict-declarations")
    done = run_cli(*args, "--known-failures", str(known), "--json", str(tmp_path / "c.json"))
    out = done.stdout + done.stderr
    (record,) = json.loads((tmp_path / "c.json").read_text())["results"]
    assert record["outcome"] == "known_failure", out
    assert done.returncode == 0 and "error: known failure" not in out, out
    known.write_text("")
    done = run_cli(*args, "--known-failures", str(known), "--json", str(tmp_path / "d.json"))
    (record,) = json.loads((tmp_path / "d.json").read_text())["results"]
    # one drawn example and the fixed grouped-query one
    assert record["outcome"] == "pass" and record["reason"] == "2 examples", record


def test_an_intermittent_entry_adds_no_case_and_is_left_to_a_full_check():
    """A run where an intermittent entry's cases pass cannot show it stale: CI's selection
    adds none of its cases (the session passes it only the steady entries) and names the
    entry left, so no "matched no test" warning follows."""
    items = _items([("plain", PLAIN), ("compiled", COMPILER)])
    entry = "test_case[[]compiled-cpu-float16-tiles/padding_across_blocks[]]"
    base = cover.choose(items, [], MASK_FORMS)
    assert not any(k for it, k in zip(items, base) if fnmatch.fnmatch(it.test, entry))
    assert cover.left_entries(items, base, [entry, "test_case[[]nobody-*[]]"]) == [entry]
    kept = next(it.test for it, k in zip(items, base) if k and it.impl_name == "compiled")
    assert cover.left_entries(items, base, [kept.replace("[", "[[]", 1)]) == []


def test_a_cover_run_runs_a_steady_entrys_case_and_leaves_an_intermittent_ones(tmp_path):
    plugin = tmp_path / "shift_unmasked.py"
    plugin.write_text(SHIFT_UNMASKED)
    known = tmp_path / "known.txt"
    entry = "test_case[[]bug.shift_unmasked-cpu-float32-masking/none[]]"  # outside the sample
    for condition, expected in (("", "known_failure"), ("{intermittent}  ", None)):
        known.write_text(f"{entry}  {condition}# planted\n")
        path = tmp_path / f"{expected}.json"  # (a results file keeps the records it holds)
        done = run_cli("check", "--workers", "0", "--json", str(path), "--plugin", str(plugin),
                       "--impl", "bug.shift_unmasked", "--dtype", "float32", "-k", "masking",
                       "--cover", "--strict-declarations", "--known-failures", str(known))
        out = done.stdout + done.stderr
        records = json.loads(path.read_text())["results"]
        ran = {r["case"]: r["outcome"] for r in records if r["family"] == "masking"}
        assert ran.get("none") == expected and done.returncode == 0, out
