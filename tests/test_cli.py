"""The mha-suite command as a user meets it: one-line errors, exit codes, listings."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import PLUGINS


def _one_line_error(proc, needle: str) -> None:
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(err.splitlines()) == 1, err
    assert needle in err


def test_list_shows_builtins(cli):
    proc = cli("list")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert "numpy" in lines and "devices=cpu" in lines["numpy"]
    for name in ("torch.eager", "torch.sdpa", "torch.nn", "jax.jit", "jax.nn"):
        assert name in lines


@pytest.mark.parametrize("command", ["list", "check", "sweep"])
def test_unknown_impl_is_one_line(cli, command):
    proc = cli(command, "--impl", "no.such.impl")
    _one_line_error(proc, "unknown implementation 'no.such.impl'; known: ")


@pytest.mark.parametrize("command", ["list", "check"])
def test_missing_plugin_file_is_one_line(cli, command):
    proc = cli(command, "--plugin", "does/not/exist.py")
    _one_line_error(proc, "file does/not/exist.py does not exist")


def test_plugin_import_error_is_one_line(cli):
    proc = cli("list", "--plugin", str(PLUGINS / "import_error.py"))
    _one_line_error(proc, "module a_module_that_does_not_exist not found")


def test_list_marks_broken_plugin_unavailable(cli):
    proc = cli("list", "--plugin", str(PLUGINS / "broken.py"), "--impl", "broken.*")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"broken.construct +unavailable: needs a device this machine lacks",
                     proc.stdout), proc.stdout


def test_check_exit_codes_and_json(cli, tmp_path):
    out = tmp_path / "c.json"
    bad = cli("check", "--plugin", str(PLUGINS / "wrong_scale.py"), "--impl", "bug.no_scale",
              "--dtype", "float32", "--json", str(out))
    assert bad.returncode == 1
    assert "bug.no_scale" in bad.stdout and "fail" in bad.stdout  # the matrix
    doc = json.loads(out.read_text())
    assert doc["kind"] == "mha-suite/conformance"
    good = cli("check", "--impl", "numpy", "--dtype", "float32", "-k", "masking")
    assert good.returncode == 0, good.stdout[-2000:]
    assert "numpy" in good.stdout and "ok " in good.stdout
