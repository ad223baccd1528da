"""--shard i/n: a deterministic split whose parts cover the sweep once."""

from __future__ import annotations

import argparse
import json

import pytest

from suite import shard

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
