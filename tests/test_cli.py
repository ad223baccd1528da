"""The mha-suite command as a user meets it: one-line errors, exit codes, listings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import PLUGINS, ROOT


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


def test_list_says_when_it_answers_from_the_cache_and_refresh_probes_again(cli):
    cli("list", "--impl", "numpy")
    again = cli("list", "--impl", "numpy")
    assert again.returncode == 0, again.stderr
    assert "(read from the cache in " in again.stdout and "--refresh" in again.stdout
    # --refresh describes every built-in again (20 s, most of it torch's and jax's probes):
    # the same command in a process that has them hidden, so it probes the rest. The
    # descriptions it reads back otherwise are keyed by the installed versions, not imports.
    hidden = ("import sys; sys.modules['torch'] = None; sys.modules['jax'] = None; "
              "from suite import cli; sys.exit(cli.main(['list', '--impl', 'numpy', '--refresh']))")
    env = {k: v for k, v in os.environ.items() if k != "MHA_SUITE_PLUGINS"}  # as run_cli
    fresh = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True,
                           cwd=ROOT, timeout=600, env=env)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.startswith("numpy") and "read from the cache" not in fresh.stdout


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
              "--dtype", "float32", "-k", "masking", "--json", str(out))  # fails all but few
    assert bad.returncode == 1
    assert "bug.no_scale" in bad.stdout and "fail" in bad.stdout  # the matrix
    doc = json.loads(out.read_text())
    assert doc["kind"] == "mha-suite/conformance"
    good = cli("check", "--impl", "numpy", "--dtype", "float32", "-k", "masking")
    assert good.returncode == 0, good.stdout[-2000:]
    assert "numpy" in good.stdout and "ok " in good.stdout


def test_check_names_what_did_not_pass_in_one_short_line_per_implementation(cli, tmp_path):
    """pytest's short summary names the failures, not every known failure, deviation and
    unsupported case with its whole reason (the main job printed 53 of about 1,000 characters
    each): one line per implementation says how many and short labels; the reasons are in
    the results file. A failure still shows with its reason and replay command. (pytest asks
    for every reason where its ini file says -ra, as pyproject.toml does: whether it finds
    that file depends on the paths on the command line, so the environment says it here.)"""
    long_reason = "planted: no scale, " + "a long explanation of the known failure " * 25
    known = tmp_path / "known.txt"
    known.write_text("test_case[[]bug.no_scale-cpu-float32-masking/fully_masked_valid_lens[]]"
                     f"  # {long_reason}\n")
    out = tmp_path / "c.json"
    proc = cli("check", "--plugin", str(PLUGINS / "wrong_scale.py"), "--plugin",
               str(PLUGINS / "policies.py"), "--impl", "bug.no_scale", "--impl",
               "policy.claims_unmasked", "--dtype", "float32", "--workers", "0", "--no-progress",
               "-k", "masking/none or masking/fully_masked_valid_lens or layouts/transposed",
               "--known-failures", str(known), "--json", str(out),
               env={"PYTEST_ADDOPTS": "-ra"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    # no XFAIL or SKIPPED line per case, and no reason of one
    assert not [line for line in lines if line.startswith(("XFAIL", "SKIPPED", "XPASS"))]
    assert "a long explanation" not in proc.stdout
    assert "planted: the mask is dropped" not in proc.stdout  # the deviation's own reason
    assert "does not declare layout" not in proc.stdout  # an unsupported case's reason
    # the compact lines beneath the matrix
    assert "  bug.no_scale: 1 failed (masking/none), 1 known failure " \
           "(masking/fully_masked_valid_lens)" in lines, proc.stdout[-3000:]
    assert "  policy.claims_unmasked: 1 declared deviation (fully_masked_rows=unmasked)" in lines
    # the failure: named in the short summary, its reason and replay command above it
    assert any(line.startswith("FAILED ") and "bug.no_scale-cpu-float32-masking/none" in line
               for line in lines)
    assert "case masking/none (seed" in proc.stdout and "fail: output: err" in proc.stdout
    assert "replay: pytest --pyargs suite.conformance.tests" in proc.stdout
    # the terminal summary after the progress line fits a screen: pytest's sections, the
    # matrix and its lines, and nothing per known failure or deviation
    assert len(lines) < 40, proc.stdout
    # the whole reasons are in the results file
    records = {(r["impl"], r["case"]): r for r in json.loads(out.read_text())["results"]}
    assert long_reason.strip() in records[("bug.no_scale", "fully_masked_valid_lens")]["reason"]
    assert "planted: the mask is dropped" in \
        records[("policy.claims_unmasked", "fully_masked_valid_lens")]["reason"]
    assert records[("policy.claims_unmasked", "transposed")]["outcome"] == "unsupported"


def test_the_conformance_run_asks_pytest_for_failures_and_errors_only():
    """-rfE after pyproject's -ra (the later -r wins): a user's own -r after -- still can."""
    import argparse

    from suite.cli import conformance_args

    args = conformance_args(argparse.Namespace(pytest_args=["-ra"]), None)
    assert "-rfE" in args and args.index("-rfE") < args.index("-ra")
    assert not [a for a in conformance_args(argparse.Namespace(), None)
                if a.startswith("-r") and a != "-rfE"]


def test_a_worker_killed_mid_case_is_one_error_and_the_run_goes_on(tmp_path, cli):
    """A kernel that kills its process (a compiler segfault) under two pytest-xdist workers:
    pytest-xdist 3.8's loadgroup ran the case again on the replacement worker, crashed
    again and then hung (or stopped with KeyError); the run now finishes, the case is one
    error in the results and the matrix, and every other case is measured."""
    out = tmp_path / "c.json"
    proc = cli("check", "--plugin", str(PLUGINS / "crashes.py"), "--impl", "crash.*",
               # the shapes family's cases, not the drawn shapes (whose derandomised
               # draws reach a length-1 query too: a second crash)
               "--dtype", "float32", "-k", "shapes and not random_shapes", "--workers", "2",
               "--json", str(out), timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = json.loads(out.read_text())["results"]
    bad = [r for r in records if r["outcome"] != "pass"]
    assert len(records) == 26 and len(bad) == 1, bad
    assert bad[0]["case"] == "query_length_1" and bad[0]["outcome"] == "error"
    assert "the process running it died" in bad[0]["reason"]
    # one crash, not a second on the replacement worker (the short summary may repeat
    # xdist's "crashed while running" line or cut it, by the terminal's width)
    assert proc.stdout.count("node down") == 1, proc.stdout[-2000:]
    assert "crash.segfault: 1 error (shapes/query_length_1)" in proc.stdout


def test_both_workers_killed_the_replacements_finish_the_run(tmp_path, cli):
    """Both workers die close together (two kernels that segfault): the replacements got
    what was left of the crashed groups, one case each, and a pytest-xdist worker runs a
    case only once it holds the next: the run hung. Now every other case is measured."""
    out = tmp_path / "c.json"
    proc = cli("check", "--plugin", str(PLUGINS / "crashes.py"), "--impl", "crash.segfault",
               "--impl", "two_crash.*", "--dtype", "float32", "-k", "shapes and not random_shapes",
               "--workers", "2", "--json", str(out), timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = json.loads(out.read_text())["results"]
    bad = sorted((r["impl"], r["case"], r["outcome"]) for r in records if r["outcome"] != "pass")
    assert len(records) == 39, len(records)
    assert bad == [(name, "query_length_1", "error")
                   for name in ("crash.segfault", "two_crash.segfault")]
    assert proc.stdout.count("node down") == 2, proc.stdout[-2000:]


def test_a_subclass_of_a_built_in_inherits_its_known_failure_entries(cli, tmp_path):
    """#42 item 6: a subclass kept the built-in's deviations but not its known failures, so
    a built-in's listed bug came back as failures under the subclass's name."""
    listed = tmp_path / "known.txt"
    listed.write_text("test_case[[]numpy-cpu-float32-masking/none[]]  # the parent's bug\n")
    out = tmp_path / "c.json"
    args = ("check", "--plugin", str(PLUGINS / "subclass_known.py"), "--impl",
            "mine.numpy_shifted", "--dtype", "float32", "-k", "masking/none or masking/causal",
            "--workers", "0", "--known-failures", str(listed), "--json", str(out))
    proc = cli(*args)
    assert proc.returncode == 1, proc.stdout[-2000:]  # masking/causal is not listed: fails
    by_case = {r["case"]: r for r in json.loads(out.read_text())["results"]}
    assert by_case["none"]["outcome"] == "known_failure", by_case["none"]["reason"]
    assert by_case["none"]["reason"].startswith("inherited from numpy: the parent's bug")
    assert by_case["causal"]["outcome"] == "fail"


def test_the_main_job_fits_one_screen_after_its_progress(cli, tmp_path):
    """#38: after the progress lines, ``mha-suite run`` prints the totals, the
    implementations with a failure (named, not their reasons), the sweep's summary and the
    report's path: no pytest failure sections, no warnings summary, no line per point."""
    out = tmp_path / "run"
    proc = cli("run", "--impl", "numpy", "--impl", "bug.packed_ignores_sequences",
               "--plugin", str(PLUGINS / "packed_planted.py"), "--preset", "ci",
               "--out", str(out), "--no-progress", timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    after = [line for line in lines[next(i for i, line in enumerate(lines)
                                         if line.startswith("[1/3]")):]
             if line.strip() and not re.fullmatch(r"[.sxFE]+ *\[ *\d+/\d+\]", line.strip())
             and "bringing up nodes" not in line]
    assert len(after) <= 20, "\n".join(after)
    text = "\n".join(after)
    # three packed cases and the drawn inference forms' packed draws
    assert re.search(r"^conformance: \d+ cases of 2 implementations: \d+ pass, .*4 fail",
                     text, re.M), text
    assert "bug.packed_ignores_sequences: 4 failed (hypothesis/random_inference, packed/" in text
    assert "numpy" not in text.split("not passed, per implementation")[1].split("[2/3]")[0]
    for noise in ("FAILURES", "warnings summary", "short test summary", " ms "):
        assert noise not in text, noise
    assert (out / "report.html").exists() and (out / "sweep-ci.json").exists()


def test_a_check_loads_only_the_pytest_plugins_it_uses(tmp_path):
    """Installed packages register pytest plugins (executorch: hydra-core's, kgb's) that
    pytest would import in every run and worker: a check loads its own and those it uses,
    and one named after ``--`` (``-p MODULE``) still loads."""
    from importlib.metadata import entry_points

    from suite.cli import RUN_PLUGINS

    others = sorted({ep.value.split(":")[0] for ep in entry_points(group="pytest11")}
                    - {*RUN_PLUGINS, "suite.pytest_plugin"})
    if not others:
        pytest.skip("no other pytest plugin is installed here")
    code = ("import sys; from suite import cli; rc = cli.main(sys.argv[1:]); "
            f"print('LOADED', [m for m in {others!r} if m in sys.modules]); sys.exit(rc)")
    args = ["check", "--impl", "numpy", "--dtype", "float32", "-k", "masking/none",
            "--workers", "0", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "MHA_SUITE_PLUGINS"}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, env=env)
    assert done.returncode == 0 and "LOADED []" in done.stdout, done.stdout[-2000:] + done.stderr
    named = subprocess.run([sys.executable, "-c", code, *args, "--", "-p", others[0]],
                           capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert f"LOADED [{others[0]!r}]" in named.stdout, named.stdout[-2000:] + named.stderr
