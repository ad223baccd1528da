"""--shard i/n: a deterministic split whose parts cover the sweep once."""

from __future__ import annotations

import argparse
import json

import pytest

from suite.sweep import shard

UNITS = [(name, "cpu") for name in ("numpy", "numpy.flash", "torch.sdpa", "jax.jit", "torch.nn")]


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_the_parts_cover_every_unit_once(count):
    parts = [shard.select(UNITS, i, count) for i in range(1, count + 1)]
    assert set().union(*parts) == set(UNITS)
    assert sum(len(p) for p in parts) == len(UNITS)
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_the_split_does_not_depend_on_the_order_units_arrive_in():
    assert shard.select(UNITS, 2, 3) == shard.select(list(reversed(UNITS)), 2, 3)


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", "-1/2"])
def test_bad_shards_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="1 <= i <= n"):
        shard.parse(text)


def test_two_shards_write_two_files_that_together_hold_the_sweep(cli, tmp_path):
    args = ["sweep", "--preset", "ci", "--impl", "numpy", "--impl", "numpy.flash",
            "--lengths", "32", "--heads", "1", "--mask", "none", "--out", str(tmp_path)]
    impls = []
    for part in ("1/2", "2/2"):
        proc = cli(*args, "--shard", part)
        assert proc.returncode == 0, proc.stderr
        i, n = part.split("/")
        doc = json.loads((tmp_path / f"sweep-ci-{i}of{n}.json").read_text())
        assert doc["machine_info"]["mha_suite"]["shard"] == [int(i), int(n)]
        impls.append({b["extra_info"]["impl"] for b in doc["benchmarks"]})
    assert impls == [{"numpy"}, {"numpy.flash"}]


CHECK = ["check", "--impl", "numpy", "--impl", "numpy.flash", "--dtype", "float32",
         "-k", "masking/ or properties", "--workers", "0", "--no-progress"]


def _ids(path):
    return {r["test_id"] for r in json.loads(path.read_text())["results"]}


def test_the_parts_of_a_check_hold_its_cases_once(cli, tmp_path):
    whole = cli(*CHECK, "--json", str(tmp_path / "whole.json"))
    assert whole.returncode == 0, whole.stdout + whole.stderr
    parts = []
    for part in ("1/2", "2/2"):
        proc = cli(*CHECK, "--shard", part, "--json", str(tmp_path / f"part{part[0]}.json"))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        parts.append(_ids(tmp_path / f"part{part[0]}.json"))
    assert all(parts) and not parts[0] & parts[1]
    assert parts[0] | parts[1] == _ids(tmp_path / "whole.json")
    # an implementation's family on one device and dtype stays in one part
    families = [{(i.split("[", 1)[1].split("-")[0], i.split("-")[-1].split("/")[0]) for i in p}
                for p in parts]
    assert not families[0] & families[1]


def test_a_check_part_without_work_is_refused_before_any_case(cli, tmp_path):
    proc = cli("check", "--impl", "numpy", "--dtype", "float32", "-k", "masking/combined",
               "--shard", "2/2", "--json", str(tmp_path / "c.json"))
    assert proc.returncode != 0
    said = [line for line in (proc.stdout + proc.stderr).splitlines()
            if "expected a part with work" in line]
    assert len(said) == 1 and "1 unit(s)" in said[0], proc.stdout + proc.stderr
    assert not (tmp_path / "c.json").exists()
