"""Every code block of the manual (README.md and the pages under docs/) runs or is checked:

- ``python``: run; a block that defines plugin classes has each class registered, available
  here, and run on one case (``tests/test_readme.py`` checks the recipes' verdicts in depth);
- ``sh``: each ``mha-suite`` command parses with the CLI's own parser, each ``nox -s`` names a
  session of noxfile.py, each ``python -m`` module and each path it names exists (the
  commands themselves run for minutes: CI runs them as the main job and the tests);
- ``toml``: parses.
A block preceded by ``<!-- not run: reason -->`` is skipped, and such blocks stay few.
Untagged and ``text`` blocks are program output or file layouts, not code.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from tests.conftest import ROOT

MANUAL = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"(<!-- not run: (?P<why>[^>]+) -->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)```",
                   re.S)
NOT_RUN_AT_MOST = 3


def blocks(lang: str) -> List[Tuple[str, int, str, str]]:
    """(page, number, body, why not run or '') of every ``lang`` block of the manual."""
    out = []
    for page in MANUAL:
        found = [m for m in FENCE.finditer(page.read_text()) if m.group("lang") == lang]
        out += [(str(page.relative_to(ROOT)), i, m.group("body"), m.group("why") or "")
                for i, m in enumerate(found, 1)]
    return out


def _ids(items):
    return [f"{page}#{n}" for page, n, _b, _w in items]


PYTHON, SH, TOML = blocks("python"), blocks("sh"), blocks("toml")


def test_the_manual_has_code_and_few_blocks_are_not_run():
    assert len(PYTHON) >= 10 and len(SH) >= 10
    skipped = [(p, n, w) for p, n, _b, w in PYTHON + SH + TOML if w]
    assert len(skipped) <= NOT_RUN_AT_MOST, skipped
    tagged = {m.group("lang") for page in MANUAL for m in FENCE.finditer(page.read_text())}
    assert tagged <= {"python", "sh", "toml", "text", ""}, tagged  # a new language: check it here


@pytest.mark.parametrize("page,number,body,why", PYTHON, ids=_ids(PYTHON))
def test_python_block_runs(page, number, body, why, tmp_path, monkeypatch):
    if why:
        pytest.skip(why)
    from suite.conformance import catalog
    from suite.conformance.judge import run_case
    from suite.plugins import registry

    path = tmp_path / f"block_{number}.py"
    path.write_text(body)
    monkeypatch.syspath_prepend(str(ROOT))
    scope: dict = {"__name__": "manual_block"}
    exec(compile(body, f"{page} block {number}", "exec"), scope)
    classes = [c for c in scope.values() if registry.is_plugin_class(c) and c.__module__ ==
               "manual_block"]
    if not classes:
        return
    for module in re.findall(r"^(?:from|import) (\w+)", body, re.M):
        if module in ("torch", "jax", "flax", "keras", "transformers", "triton"):
            pytest.importorskip(module)
    reg = registry.build(plugins=[str(path)], builtins=False, entry_points=False, env={})
    case = catalog.get("masking", "none")
    for name, entry in reg.entries.items():
        assert entry.available, f"{page} block {number}: {name}: {entry.error}"
        impl = entry.impl
        device = next(iter(impl.devices()))
        dtypes = list(impl.dtypes(device))
        dtype = "float32" if "float32" in dtypes else dtypes[0]
        outcome = run_case(impl, name, device, dtype, case)
        assert outcome.outcome in ("pass", "deviation", "unsupported"), (name, outcome)


def _nox_sessions() -> set:
    text = (ROOT / "noxfile.py").read_text()
    return set(re.findall(r"^def (\w+)\(session", text, re.M))


def _commands(body: str) -> List[str]:
    """The block's commands: continuation lines joined, comments dropped, split at ; && |."""
    text = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in text.splitlines():
        line = line.split(" # ", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        out += [c.strip() for c in re.split(r"&&|;|\|(?!\|)", line) if c.strip()]
    return out


@pytest.mark.parametrize("page,number,body,why", SH, ids=_ids(SH))
def test_shell_block_commands_are_real(page, number, body, why):
    if why:
        pytest.skip(why)
    from suite import cli

    parser = cli.build_parser()
    for command in _commands(body):
        # a loop's variables stand for one of their values: $((i+1)) -> 1, $i -> 0
        command = re.sub(r"\$\w+", "0", re.sub(r"\$\(\(.*?\)\)", "1", command)).rstrip("& ")
        words = shlex.split(command)
        while words and (re.match(r"^\w+=", words[0]) or words[0] in ("do", "then")):
            words.pop(0)  # VAR=value or a loop keyword before the command
        if not words:
            continue
        tool = Path(words[0]).name
        if tool == "mha-suite":
            try:
                parser.parse_args(words[1:])
            except SystemExit as exc:
                pytest.fail(f"{page} block {number}: `{command}` does not parse ({exc.code})")
        elif tool == "nox" and "-s" in words:
            for session in words[words.index("-s") + 1:]:
                if session.startswith("-"):
                    break
                assert session.split("(")[0] in _nox_sessions(), (page, command)
        elif tool in ("python", "python3") and "-m" in words:
            module = words[words.index("-m") + 1]
            if module not in ("venv", "pip", "pytest"):
                __import__(module)
        elif tool in ("python", "python3") and len(words) > 1 and words[1].endswith(".py"):
            assert (ROOT / words[1]).exists(), (page, command)


@pytest.mark.parametrize("page,number,body,why", TOML, ids=_ids(TOML))
def test_toml_block_parses(page, number, body, why):
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    tomllib.loads(body)
