"""reports.frames: loaders return the specified columns; the exponent fit recovers known slopes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from reports.frames import (
    CONFORMANCE_COLUMNS,
    SWEEP_COLUMNS,
    fit_exponent,
    load,
    load_conformance,
    load_sweeps,
)

FIXTURES = Path(__file__).parent / "fixtures"


def test_sweep_loader_columns_and_rows():
    df = load_sweeps([FIXTURES / "vm" / "sweep_vm.json"])
    assert list(df.columns) == SWEEP_COLUMNS
    doc = json.loads((FIXTURES / "vm" / "sweep_vm.json").read_text())
    assert len(df) == len(doc["benchmarks"]) + len(doc["mha_suite_not_measured"])
    ok = df[df["status"] == "ok"]
    assert (ok["median_s"] > 0).all() and (ok["q1_s"] <= ok["q3_s"]).all()
    assert set(df.loc[df["status"] != "ok", "status"]) == {"skipped", "error"}
    assert df.loc[df["status"] != "ok", "median_s"].isna().all()
    # the peak is looked up per framework:device:dtype and the share follows from it
    row = ok[ok["framework"] == "jax"].iloc[0]
    assert row["peak_flops"] == doc["machine_info"]["mha_suite"]["matmul_peak_flops"][
        "jax:cpu:float32"]
    assert row["peak_share"] == pytest.approx(row["flops_per_s"] / row["peak_flops"])


def test_conformance_loader_columns_and_nonfinite_errors():
    df = load_conformance([FIXTURES / "vm"])
    assert list(df.columns) == CONFORMANCE_COLUMNS
    assert {"pass", "fail", "unsupported", "deviation", "error"} <= set(df["outcome"])
    assert df["err"].dtype == float and df["err"].isna().any()  # "nan" strings read as NaN
    assert df.loc[df["impl"] == "torch.nn", "framework"].eq("torch").all()


def test_load_sorts_files_by_kind_and_reads_directories():
    sweeps, conf = load([FIXTURES / "vm"])
    assert len(sweeps) and len(conf)
    assert sweeps["source"].str.endswith("sweep_vm.json").all()
    assert conf["source"].str.endswith("conformance_vm.json").all()


def test_a_rerun_replaces_the_earlier_point(tmp_path):
    doc = json.loads((FIXTURES / "real" / "sweep-a.json").read_text())
    later = json.loads(json.dumps(doc))
    later["datetime"] = "2099-01-01T00:00:00+00:00"
    later["benchmarks"] = later["benchmarks"][:1]
    later["benchmarks"][0]["stats"]["median"] = 123.0
    (tmp_path / "a.json").write_text(json.dumps(doc))
    (tmp_path / "b.json").write_text(json.dumps(later))
    df = load_sweeps([tmp_path])
    assert len(df) == len(doc["benchmarks"])
    assert (df["median_s"] == 123.0).sum() == 1


def test_two_machines_sharing_a_node_name_stay_apart(tmp_path):
    doc = json.loads((FIXTURES / "real" / "sweep-a.json").read_text())
    other = json.loads(json.dumps(doc))
    other["machine_info"]["mha_suite"]["cpu_model"] = "Another CPU"
    (tmp_path / "a.json").write_text(json.dumps(doc))
    (tmp_path / "b.json").write_text(json.dumps(other))
    df = load_sweeps([tmp_path])
    assert sorted(df["machine"].unique()) == ["vm", "vm#2"]
    assert len(df) == 2 * len(doc["benchmarks"])


def test_missing_and_foreign_files_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load([tmp_path / "nope.json"])
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="not an mha-suite results file"):
        load([tmp_path / "other.json"])
    with pytest.raises(ValueError, match="not an mha-suite results file"):
        load([tmp_path])  # inside a directory too: a report never silently drops a file


def _synthetic(exponent, lengths, noise=0.03, seed=0, **keys):
    rng = np.random.default_rng(seed)
    base = {"machine": "m", "impl": "x", "device": "cpu", "dtype": "float32", "mask": "none",
            "H": 8, "B": 1, "D": 64, "status": "ok"}
    return pd.DataFrame([{**base, **keys, "L": L,
                          "median_s": 1e-9 * L**exponent * np.exp(rng.normal(0, noise))}
                         for L in lengths])


@pytest.mark.parametrize("exponent", [1.0, 2.0])
def test_fit_exponent_recovers_a_known_exponent(exponent):
    lengths = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    fit = fit_exponent(_synthetic(exponent, lengths)).iloc[0]
    assert fit["ci_low"] <= exponent <= fit["ci_high"]
    assert abs(fit["exponent"] - exponent) < 0.1
    assert fit["quadratic_share"] == pytest.approx(exponent - 1.0, abs=0.1)
    assert fit["n_points"] == 8 and (fit["L_min"], fit["L_max"]) == (64, 8192)


@pytest.mark.parametrize("a,b,c", [(1e-5, 0.0, 1e-9), (1e-3, 1e-6, 1e-10), (1e-4, 1e-6, 0.0)])
def test_fit_exponent_is_the_cost_models_local_exponent_at_the_largest_length(a, b, c):
    # time = overhead + linear + quadratic: a log-log line through these bends
    lengths = [2**k for k in range(7, 13)]
    df = pd.DataFrame([{"machine": "m", "impl": "x", "device": "cpu", "dtype": "float32",
                        "mask": "none", "H": 1, "B": 1, "D": 64, "status": "ok", "L": L,
                        "median_s": a + b * L + c * L**2} for L in lengths])
    fit = fit_exponent(df).iloc[0]
    L = lengths[-1]
    total = a + b * L + c * L**2
    assert fit["exponent"] == pytest.approx((b * L + 2 * c * L**2) / total, abs=1e-6)
    assert fit["quadratic_share"] == pytest.approx(c * L**2 / total, abs=1e-6)
    assert fit["ci_high"] - fit["ci_low"] < 1e-6  # exact data: no uncertainty


def test_fit_exponent_names_the_length_the_model_misses_most():
    """A kernel that changes regime at one length (here 40% slower at L = 512, as a library
    switching its blocking there would be) is missed most there; exact data is missed by
    nothing."""
    lengths = [128, 256, 512, 768, 1024, 1536, 2048]
    exact = pd.DataFrame([{"machine": "m", "impl": "x", "device": "cpu", "dtype": "float32",
                           "mask": "none", "H": 8, "B": 1, "D": 64, "status": "ok", "L": L,
                           "median_s": 1e-4 + 1e-7 * L + 1e-9 * L**2} for L in lengths])
    fit = fit_exponent(exact).iloc[0]
    assert fit["worst_residual"] < 1e-9
    kinked = exact.assign(median_s=exact["median_s"] * np.where(exact["L"] == 512, 1.4, 1.0))
    fit = fit_exponent(kinked).iloc[0]
    assert fit["worst_L"] == 512 and fit["worst_residual"] > 0.15
    assert fit["ci_high"] - fit["ci_low"] > 0.1


def test_fit_exponent_interval_widens_with_noise():
    lengths = [256, 512, 1024, 2048, 4096]
    quiet = fit_exponent(_synthetic(2.0, lengths, noise=0.01)).iloc[0]
    noisy = fit_exponent(_synthetic(2.0, lengths, noise=0.2)).iloc[0]
    assert noisy["ci_high"] - noisy["ci_low"] > 3 * (quiet["ci_high"] - quiet["ci_low"])


def test_fit_exponent_rejects_too_few_points_and_ignores_unmeasured():
    df = _synthetic(2.0, [128, 256, 512])
    assert fit_exponent(df).empty
    bad = _synthetic(2.0, [1024, 2048, 4096]).assign(status="skipped")
    assert fit_exponent(pd.concat([df, bad])).empty
    with pytest.raises(ValueError, match="min_points"):
        fit_exponent(df, min_points=3)


def test_fit_exponent_groups_separately():
    df = pd.concat([_synthetic(2.0, [256, 512, 1024, 2048], mask="none"),
                    _synthetic(1.0, [256, 512, 1024, 2048], mask="causal", seed=1)])
    fits = fit_exponent(df).set_index("mask")["exponent"]
    assert fits["none"] == pytest.approx(2.0, abs=0.15)
    assert fits["causal"] == pytest.approx(1.0, abs=0.15)


def test_fit_exponent_uses_the_fastest_round_when_files_have_it():
    lengths = [128, 256, 512, 1024, 2048]
    clean = _synthetic(2.0, lengths, noise=0.0)
    contended = clean.assign(min_s=clean["median_s"],
                             median_s=clean["median_s"] * [1, 5, 1, 3, 1])  # others' work
    fit = fit_exponent(contended).iloc[0]
    assert fit["exponent"] == pytest.approx(2.0, abs=1e-6)
    assert fit_exponent(contended.drop(columns="min_s")).iloc[0]["exponent"] != \
        pytest.approx(2.0, abs=0.05)


def test_files_with_the_old_names_read_as_the_problems_letters():
    """Sweep files written before the letters (Lq, Lk, H_kv) give L, S and K columns."""
    raw = [json.loads(p.read_text()) for p in sorted((FIXTURES / "real").glob("*.json"))]
    old = [b["extra_info"] for d in raw for b in d.get("benchmarks", [])]
    assert old and all("Lq" in x and "L" not in x for x in old)  # the fixture is old-named
    sweeps, _ = load([FIXTURES / "real"])
    assert not {"Lq", "Lk", "H_kv"} & set(sweeps.columns)
    measured = sweeps[sweeps["status"] == "ok"]
    assert set(measured["L"]) == {x["Lq"] for x in old}
    assert (measured["S"] == measured["L"]).all() and (measured["K"] == measured["H"]).all()


def test_old_and_new_names_give_one_resume_key():
    from suite.sweep.point import Point, point_key

    new = {"impl": "numpy", **Point(B=1, L=64, H=4, K=2, D=8, mask="valid_lens").info()}
    old = {"impl": "numpy", "device": "cpu", "dtype": "float32", "B": 1, "H": 4, "H_kv": 2,
           "Lq": 64, "Lk": 64, "D": 8, "mask": "padding", "grad": False}
    assert point_key(new) == point_key(old)
    assert point_key(new) != point_key({**old, "H_kv": 4})


def test_the_environment_card_states_both_peaks_and_their_spread():
    from reports.tables import _peaks

    extra = {"matmul_peak_flops": {"numpy:cpu:float32": 300e9, "torch:cpu:float32": 200e9},
             "matmul_peak_runs": {"numpy:cpu:float32": {"before": 300e9, "after": 270e9,
                                                        "spread": 0.1}}}
    assert _peaks(extra) == [
        ("numpy:cpu:float32", "300 GFLOP/s (before 300, after 270, spread 10%)"),
        ("torch:cpu:float32", "200 GFLOP/s")]  # an older file: one measurement
