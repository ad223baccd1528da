"""The manual's recipes for your own module (README.md, docs/own-module/*.md) run as printed,
with the verdicts their text states."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from tests.conftest import ROOT, run_cli

pytest.importorskip("torch")


# The pages of the manual that hold the recipes (docs/ is the mkdocs site).
PAGES = {"Testing your own module": ("docs/own-module/torch.md", "docs/own-module/jax.md",
                                     "docs/own-module/hf-model.md", "docs/own-module/keras.md",
                                     "docs/own-module/vision.md", "docs/own-module/hf-layer.md"),
         "Testing your own GPU kernel without a GPU": ("docs/own-module/gpu-kernel.md",)}


def _section_code(title: str, containing: str = "") -> str:
    """The first Python block of the pages of ``title`` that contains ``containing``."""
    text = "\n".join((ROOT / page).read_text() for page in PAGES[title])
    return next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if containing in b)


def _block_after(marker: str) -> str:
    """The first python block after ``marker`` on the torch module's page."""
    text = (ROOT / "docs" / "own-module" / "torch.md").read_text().split(marker, 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def _block_with(title: str, marker: str) -> str:
    """The python block of the pages of ``title`` that contains ``marker``."""
    return _section_code(title, marker)


# The recipes run as plugins under `mha-suite check`, float32, serially. Each `mha-suite check`
# process pays 3-6 s of torch/jax imports, pytest's start-up and collection before its cases,
# so the recipes share two: each recipe's names renamed from `mine.` to a label of its own
# (its key in RECIPES), its cases selected by a -k term anchored on that label ("[label."),
# each test judging only its own recipe's records (and its changed copies'). A group is one
# run's Hypothesis examples per case (None: the default); a recipe that draws examples runs
# in the group of its count, one that draws none in either: the two take about the same
# time, so two pytest-xdist workers run them side by side. Dtypes are selected per recipe.
GROUPS = {"default": None, "examples10": 10}


def _options(group: str) -> tuple:
    n = GROUPS[group]
    return () if n is None else ("--hypothesis-examples", str(n))


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A manual block run as a plugin: at most ``max_lines`` non-blank lines; its names (all
    ``mine.``) chosen by the globs ``impl``, its cases by the -k expression ``select`` ("":
    all), in ``dtypes``, with ``examples`` Hypothesis examples per case (None: the
    default), in the shared run ``group``; ``beside``: changed copies run with it under its
    label (``impl`` and ``select`` name them too); ``wrongs``: changed copies, (label, change,
    select), that its test expects to fail, their names ``label.``; ``test``: the test that
    judges it; ``needs``: modules without which that test skips (a shared run leaves the
    recipe out)."""

    test: str
    code: Callable[[], str]
    max_lines: int
    impl: tuple
    select: str = ""
    group: str = "default"
    examples: Optional[int] = None
    beside: tuple = ()
    wrongs: tuple = ()  # ((label, change, select), ...)
    dtypes: tuple = ("float32",)
    needs: tuple = ()


def _readme_code() -> str:
    """The README's own example: its first python block."""
    return re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)


def _replace(old: str, new: str) -> Callable[[str], str]:
    return lambda code: code.replace(old, new)


TRANSFORMERS = ("transformers",)
RECIPES = {
    "own_module": Recipe(
        "test_own_module_example_runs_under_the_conformance_cases",
        lambda: _section_code("Testing your own module"), 20, ("mine.*",)),
    "own_jax": Recipe(
        "test_own_jax_module_example_runs_under_the_conformance_cases",
        lambda: _section_code("Testing your own module", containing="JaxModuleCore"), 20,
        ("mine.jax",), "gradients and (plain or masked) or masking and (valid_lens or causal)",
        group="examples10", needs=("flax",)),
    "gpu_kernel": Recipe(
        "test_own_gpu_kernel_example_runs_under_the_triton_interpreter",
        lambda: _section_code("Testing your own GPU kernel without a GPU"), 25,
        ("mine.triton",), "gqa or mqa or one_head or cross", group="examples10",
        needs=("triton",)),
    "dtype_fill": Recipe(
        "test_dtype_dependent_deviation_example",
        lambda: _block_after("**Deviations that depend on the dtype.**"), 20, ("mine.fill",),
        "masking", group="examples10", dtypes=("float32", "float16")),
    "bias_free": Recipe(  # the same module with bias layers (nn.Linear's default) beside it
        "test_bias_free_module_example_runs_the_cases_and_hypothesis_without_biases",
        lambda: _block_with("Testing your own module", "projection_bias = False"), 20,
        ("mine.attention[[]no_bias]", "mine.attention[[]bias_layers]"),
        "not bias_layers and not tiles and not mask_forms and not special_values"
        " or bias_layers and (masking/none or random_shapes or gradient)",
        group="examples10", examples=10,
        beside=(lambda code: code.replace("bias=False)", "bias=True)")
                .replace("[no_bias]", "[bias_layers]"),)),
    "hf_model": Recipe(
        "test_whole_hf_model_example_runs_the_models_own_mask",
        lambda: _block_with("Testing your own module", "HFModelCore"), 20, ("mine.qwen2*",),
        "mask_forms or masking or hypothesis", needs=TRANSFORMERS),
    "vision": Recipe(
        "test_vision_module_example_runs_its_self_attention_cases",
        lambda: _block_with("Testing your own module", "image_input = True"), 20,
        ("mine.conv_attention",), "not lanes and not tiles and not layouts",
        wrongs=(("flipped", _replace("module(query), None", "module(query.flip(2)), None"),
                 "self_attention"),)),
    "keras_option": Recipe(
        "test_keras_layer_option_example_reaches_the_layer_and_runs_the_cases",
        lambda: _block_with("Testing your own module", "layer_kwargs"), 20, ("mine.keras*",),
        "masking and (valid_lens or causal or none)", group="examples10",
        needs=("implementations.keras.mha",)),
    "readme": Recipe(
        "test_readme_ten_line_example_runs_the_masking_cases",
        _readme_code, 10, ("mine.attention",), "masking", group="examples10"),
    "keras_core": Recipe(
        "test_keras_core_example_runs_keras_gqa_layer",
        lambda: _block_with("Testing your own module", "KerasModuleCore"), 20,
        ("mine.keras_gqa",), "masking/none or masking/causal or shapes/gqa or shapes/mqa or "
        "test_gradient or wrapper or nan_value", group="examples10",
        needs=("implementations.keras.common",),
        wrongs=(("nocausal", _replace('use_causal_mask=mask.causal == "top_left"',
                                      "use_causal_mask=False"), "masking/causal"),)),
    "flax_option": Recipe(
        "test_flax_module_option_example_reaches_the_module_and_runs_the_cases",
        lambda: _block_with("Testing your own module", "module_kwargs"), 20, ("mine.flax*",),
        "masking and (valid_lens or causal or none)", group="examples10", needs=("flax",)),
    "hf_pre_hook": Recipe(
        "test_hf_model_pre_hook_example_passes_and_fails_without_its_hook",
        lambda: _block_with("Testing your own module", "sinusoidal_pos"), 20,
        ("mine.roformer",), "masking or shapes", needs=TRANSFORMERS,
        wrongs=(("kept", _replace('"sinusoidal_pos": None',
                                  '"sinusoidal_pos": kwargs.get("sinusoidal_pos")'),
                 "masking/none"),)),
    "hf_layer": Recipe(
        "test_hf_layer_example_caps_on_eager_and_sdpa_needs_its_is_causal",
        lambda: _block_with("Testing your own module", "Gemma2Attention"), 32,
        ("mine.gemma2_attention*",), "masking/none or softcap or agrees_with_eager",
        needs=TRANSFORMERS,
        wrongs=(("nocap", _replace("attn_logit_softcapping=p.softcap, ", ""),  # eager's cap
                 "eager and softcap_valid_lens"),
                ("nocausal", _replace(",\n                      is_causal=False)", ")"),
                 "sdpa and masking/none"))),  # the sdpa name's flag
    "hf_cache": Recipe(
        "test_hf_layer_generation_example_runs_the_layers_own_cache",
        lambda: _block_with("Testing your own module", "def new_cache"), 24,
        ("mine.llama_attention",), "generation", needs=TRANSFORMERS,
        wrongs=(("nocache", _replace("cache=mask.cache,", "cache=None,"),
                 "generation/prefill_then_steps"),)),
    "linen": Recipe(
        "test_linen_dense_general_example_reads_its_weights_back_and_runs_the_cases",
        lambda: _block_with("Testing your own module", "einsum_params(p, dtype)"), 20,
        ("mine.linen",), "masking or gradients or wrapper", group="examples10",
        needs=("flax",)),
}


def _plugins(name: str, code: str) -> list:
    """Recipe ``name``'s plugins, as (label, the names' prefix its test sees, the code, its
    --impl globs, its -k term or None): the block itself, its ``beside`` copies (under its
    label) and its ``wrongs`` (``<wrong>_<name>``), each checked to be a change."""
    __tracebackhide__ = True
    recipe = RECIPES[name]
    out = [(name, "mine", code, recipe.impl, recipe.select)]
    for change in recipe.beside:
        assert change(code) != code, name
        out.append((name, "mine", change(code), (), None))
    for wrong, change, select in recipe.wrongs:
        assert change(code) != code, wrong
        out.append((f"{wrong}_{name}", wrong, change(code), recipe.impl, select))
    for label, _, _, _, select in out:  # a -k word matches its label where it would "mine"
        words = set(re.findall(r"[^\s()]+", (select or "").lower())) - {"and", "or", "not"}
        assert not [w for w in words if (w in label.lower()) != (w in "mine")], (label, select)
    return out


def _run(names: list, folder: Path, options: tuple) -> dict:
    """One ``mha-suite check`` of the recipes ``names`` (serially; their plugins written
    into ``folder``, each one's names renamed from ``mine.`` to its label): its exit status,
    output and results file (None where none was written)."""
    folder.mkdir(parents=True, exist_ok=True)
    dtypes = sorted({d for name in names for d in RECIPES[name].dtypes})
    args, terms = [], []
    for name in names:
        recipe = RECIPES[name]
        for i, (label, _, code, globs, select) in enumerate(_plugins(name, recipe.code())):
            plugin = folder / f"recipe_{name}_{i}.py"
            plugin.write_text(code.replace('"mine.', f'"{label}.'))
            args += ["--plugin", str(plugin)]
            for glob in globs:
                args += ["--impl", glob.replace("mine.", f"{label}.", 1)]
            if select is None:
                continue
            term = f"[{label}." + (f" and ({select})" if select else "")  # its ids: [label.
            if set(recipe.dtypes) != set(dtypes):  # "-float32", not a case name's "_float32"
                term += " and (" + " or ".join(f"-{d}" for d in recipe.dtypes) + ")"
            terms.append(f"({term})")
    out = folder / "c.json"
    try:
        proc = run_cli("check", *args, *(a for d in dtypes for a in ("--dtype", d)),
                       "--workers", "0", "--no-progress", "--json", str(out), *options,
                       "-k", " or ".join(terms), timeout=600 * len(names))
    except subprocess.TimeoutExpired as exc:
        return {"names": names, "returncode": None, "stdout": f"{exc}", "stderr": "",
                "doc": None}
    return {"names": names, "returncode": proc.returncode, "stdout": proc.stdout,
            "stderr": proc.stderr, "doc": json.loads(out.read_text()) if out.exists() else None}


def _runnable(name: str) -> bool:
    """Recipe ``name``'s block is found and the modules it needs import (else its test fails
    or skips on its own, and a shared run leaves it out)."""
    try:
        RECIPES[name].code()
        for module in RECIPES[name].needs:
            importlib.import_module(module)
    except Exception:
        return False
    return True


class SharedRuns:
    """Each group's one run, shared by the tests and by this session's pytest-xdist workers:
    the first worker to need a group claims it (a file created exclusively in the session's
    temporary folder) and runs it; one that needs a group another worker is running runs a
    group nobody claimed yet, of those this session's tests need, or else waits for it."""

    def __init__(self, folder: Path, needed: set):
        self.folder, self.needed, self.read = folder, needed, {}

    def group(self, group: str, wait: float = 3600) -> Optional[dict]:
        """Group ``group``'s run; None where it did not end within ``wait`` seconds."""
        if group not in self.read:
            done, since = self.folder / f"{group}.json", time.monotonic()
            while not done.exists():
                if self._claim(group):
                    self._run(group)
                    break
                spare = next((g for g in sorted(self.needed - {group}) if self._claim(g)), None)
                if spare is not None:
                    self._run(spare)
                elif time.monotonic() - since > wait:
                    return None
                else:
                    time.sleep(0.5)
            self.read[group] = json.loads(done.read_text())
        return self.read[group]

    def _claim(self, group: str) -> bool:
        try:
            os.close(os.open(self.folder / f"{group}.claim", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True

    def _run(self, group: str) -> None:
        names = [n for n, r in RECIPES.items() if r.group == group and _runnable(n)]
        result = {"names": [], "returncode": None, "stdout": "", "stderr": "", "doc": None}
        try:
            if names:
                result = _run(names, self.folder / group, _options(group))
        finally:  # whatever happened, the others stop waiting
            part = self.folder / f"{group}.part"
            part.write_text(json.dumps(result))
            part.replace(self.folder / f"{group}.json")


@pytest.fixture(scope="session")
def recipe_runs(request, tmp_path_factory) -> SharedRuns:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's, shared by its workers
    folder = base / "readme_recipes"
    folder.mkdir(exist_ok=True)
    tests = {item.originalname for item in request.session.items}
    return SharedRuns(folder, {r.group for r in RECIPES.values() if r.test in tests})


@dataclasses.dataclass
class Ran:
    """A recipe's part of a run: its records (and its ``beside`` copies'), named ``mine.``
    as printed; each wrong copy's records by its label, named ``label.``; the run's
    descriptions of its implementations, named ``mine.``; the run's output lines that name
    its names."""

    records: list
    wrongs: dict
    implementations: list
    lines: list


def _recipe(runs: SharedRuns, name: str) -> Ran:
    """Recipe ``name`` as printed (at most its lines), run in its group's shared run, or in a
    run of its own where that run ended without results (so a crash is its own recipe's): its
    cases must not fail or error, nor its run name it in a failure; its wrong copies may."""
    __tracebackhide__ = True
    recipe = RECIPES[name]
    code = recipe.code()
    assert len([line for line in code.splitlines() if line.strip()]) <= recipe.max_lines, code
    plugins = _plugins(name, code)
    for label, _, changed, _, _ in plugins:
        assert changed.replace('"mine.', f'"{label}.') != changed, label  # names it can rename
    run = runs.group(recipe.group)
    if run is None or name not in run["names"] or run["doc"] is None \
            or run["returncode"] not in (0, 1):
        run = _run([name], runs.folder / "alone" / name, _options(recipe.group))
    tail = run["stdout"][-3000:] + run["stderr"][-2000:]
    assert run["doc"] is not None and run["returncode"] in (0, 1), tail  # failures, no crash
    shown = {label: prefix for label, prefix, *_ in plugins}

    def named(items: list, key: str) -> dict:
        out: dict = {prefix: [] for prefix in shown.values()}
        for item in items:
            label, _, rest = item[key].partition(".")
            if label in shown:
                out[shown[label]].append({**item, key: f"{shown[label]}.{rest}"})
        return out

    records = named(run["doc"]["results"], "impl")
    mine = records["mine"]
    assert mine, f"no records of {name}\n{tail}"
    bad = [f"{r['test_id']}: {r['outcome']}: {r['reason']}" for r in mine
           if r["outcome"] in ("fail", "error")]
    assert not bad, "\n".join(bad)
    drawn = [r["test_id"] for r in mine if r["family"] == "hypothesis"]
    assert not drawn or recipe.examples == GROUPS[recipe.group], drawn  # its count, in its group
    lines = [line for line in run["stdout"].splitlines()
             if re.search(rf"(?<![\w.]){name}\.", line)]  # its names, not its copies'
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    assert not failed, "\n".join(failed)
    return Ran(mine, {w: records[w] for w, *_ in recipe.wrongs},
               named(run["doc"]["implementations"], "name")["mine"], lines)


def _fails(records: list, case: str = "") -> None:
    """Some of ``records`` (those of ``case``, if named) fail or error, as a run that exits 1."""
    __tracebackhide__ = True
    chosen = [r for r in records if not case or f"{r['family']}/{r['case']}" == case]
    assert chosen and {"fail", "error"} & {r["outcome"] for r in chosen}, records


def test_own_module_example_runs_under_the_conformance_cases(recipe_runs):
    records = _recipe(recipe_runs, "own_module").records
    outcome = {(r["impl"], r["family"], r["case"]): r["outcome"] for r in records}
    for impl in ("mine.attention", "mine.attention[weights]"):
        assert sum(o == "pass" for (i, *_), o in outcome.items() if i == impl) > 30, impl
        assert outcome[(impl, "gradients", "plain")] == "pass"
    # The two paths differ where the README says: a query row with no key to attend.
    assert outcome[("mine.attention", "masking", "fully_masked_bool_row")] == "pass"
    assert outcome[("mine.attention[weights]", "masking", "fully_masked_bool_row")] == "deviation"


def test_own_jax_module_example_runs_under_the_conformance_cases(recipe_runs):
    """The JAX module on JaxModuleCore: masks, the declared behaviours, gradients."""
    pytest.importorskip("flax")
    records = _recipe(recipe_runs, "own_jax").records
    outcome = {(r["family"], r["case"]): r["outcome"] for r in records}
    for case in ("plain", "masked"):
        assert outcome[("gradients", case)] == "pass", case
    for case in ("valid_lens", "valid_lens_per_query", "causal", "causal_bottom_right_short_query"):
        assert outcome[("masking", case)] == "pass", case
    # jax.nn gives a query row with no key to attend uniform weights: declared, so a deviation.
    assert outcome[("masking", "fully_masked_valid_lens")] == "deviation"


def test_own_gpu_kernel_example_runs_under_the_triton_interpreter(recipe_runs):
    pytest.importorskip("triton")
    records = _recipe(recipe_runs, "gpu_kernel").records
    outcome = {r["case"]: r["outcome"] for r in records if r["family"] == "shapes"}
    assert {r["device"] for r in records} == {"cpu-interpret"}  # no GPU here: interpreted
    assert all(r["outcome"] == "unsupported" for r in records if r["family"] != "shapes")
    # One program per query row: the interpreter runs each in Python, so a few cases only.
    assert set(outcome) == {"gqa", "gqa_groups_of_2", "mqa", "one_head", "cross_key_ne_value"}
    assert set(outcome.values()) == {"pass"}, outcome


def test_dtype_dependent_deviation_example(recipe_runs):
    ran = _recipe(recipe_runs, "dtype_fill")  # float32 and float16
    fully = {r["dtype"]: r for r in ran.records if r["case"] == "fully_masked_valid_lens"}
    assert "fully_masked_rows=mean_values" in fully["float32"]["reason"]
    assert "fully_masked_rows=nan" in fully["float16"]["reason"]
    assert {r["outcome"] for r in fully.values()} == {"deviation"}
    (mine,) = [i for i in ran.implementations if i["name"] == "mine.fill"]
    assert mine["stale_deviations"] == []
    assert not [line for line in ran.lines if "stale declaration" in line], ran.lines


def test_head_grouping_example():
    from suite.conformance import cases
    from suite.conformance.judge import run_case

    code = _block_after("**Head grouping.**")
    assert len([line for line in code.splitlines() if line.strip()]) <= 20, code
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    tiled = scope["Tiled"]
    undeclared = type("Undeclared", (tiled,), {"kv_grouping": "grouped"})
    for name in ("gqa", "gqa_groups_of_2", "mqa"):
        case = next(c for c in cases.CASES if c.name == name)
        assert run_case(tiled(), "mine.tiled", "cpu", "float32", case).outcome == "pass", name
        wrong = run_case(undeclared(), "undeclared", "cpu", "float32", case).outcome
        assert wrong == ("pass" if name == "mqa" else "fail"), name  # one kv head: the same


def test_bias_free_module_example_runs_the_cases_and_hypothesis_without_biases(recipe_runs):
    """The manual's bias-free module runs every fixed case and the Hypothesis examples; the
    same module with bias layers gets zero biases for those problems and passes too."""
    records = _recipe(recipe_runs, "bias_free").records  # 10 Hypothesis examples
    outcome = {(r["family"], r["case"]): r["outcome"] for r in records
               if r["impl"] == "mine.attention[no_bias]"}
    assert sum(o == "pass" for o in outcome.values()) > 30, outcome
    for key in (("hypothesis", "random_shapes"), ("gradients", "plain"),
                ("gradients", "cross_no_bias"), ("shapes", "no_projection_bias"),
                ("masking", "valid_lens"), ("properties", "batch_equals_items")):
        assert outcome[key] == "pass", key
    # With bias layers, the core loads a problem without biases as zero biases, not the
    # layers' random initial ones, so it passes too.
    outcome = {(r["family"], r["case"]): r["outcome"] for r in records
               if r["impl"] == "mine.attention[bias_layers]"}
    assert outcome[("masking", "none")] == outcome[("hypothesis", "random_shapes")] == "pass"
    assert outcome[("gradients", "plain")] == "pass", outcome


def test_whole_hf_model_example_runs_the_models_own_mask(recipe_runs):
    """The manual's Qwen2 model on HFModelCore: its causal mask beside padding passes, a
    problem that is not causal is unsupported (the model is a decoder)."""
    pytest.importorskip("transformers")
    records = _recipe(recipe_runs, "hf_model").records
    outcome = {(r["family"], r["case"]): r["outcome"] for r in records}
    for key in (("mask_forms", "causal_flag+kpm_bool"), ("mask_forms", "causal_flag"),
                ("masking", "causal"), ("hypothesis", "random_shapes")):
        assert outcome[key] == "pass", key
    assert outcome[("mask_forms", "kpm_bool")] == "unsupported"


def test_vision_module_example_runs_its_self_attention_cases(recipe_runs):
    """The README's NCHW module with a fused 1x1 q/k/v convolution passes the cases it can
    run; the map read upside down (another position order than the output's) fails."""
    ran = _recipe(recipe_runs, "vision")
    outcome = {(r["family"], r["case"]): r["outcome"] for r in ran.records}
    assert set(outcome.values()) <= {"pass", "unsupported"}, outcome
    assert sum(o == "pass" for o in outcome.values()) >= 3, outcome
    assert outcome[("shapes", "self_attention")] == "pass"
    _fails(ran.wrongs["flipped"])


def test_keras_layer_option_example_reaches_the_layer_and_runs_the_cases(recipe_runs):
    """The README's keras.mha subclass builds its layer with the option and passes the
    masking cases the built-in passes."""
    pytest.importorskip("implementations.keras.mha")  # keras on this process's backend
    code = _block_with("Testing your own module", "layer_kwargs")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    from implementations.keras.mha import build_layer
    from suite.spec.problem import make_problem

    layer = build_layer(make_problem(0, B=1, L=3, E=8, H=2), "float32",
                        **scope["Axes"].layer_kwargs)
    assert tuple(layer.get_config()["attention_axes"]) == (1,)
    records = _recipe(recipe_runs, "keras_option").records
    outcome = {(r["family"], r["case"]): r["outcome"] for r in records}
    for case in ("none", "valid_lens", "causal"):
        assert outcome[("masking", case)] == "pass", case
    assert outcome[("masking", "fully_masked_valid_lens")] == "deviation"


def test_readme_ten_line_example_runs_the_masking_cases(recipe_runs):
    """The README's own example: at most ten lines, and every masking case passes or is a
    declared deviation."""
    records = _recipe(recipe_runs, "readme").records
    outcomes = {r["case"]: r["outcome"] for r in records}
    assert sum(o == "pass" for o in outcomes.values()) > 10, outcomes
    assert not {o for o in outcomes.values()} - {"pass", "deviation", "unsupported"}, outcomes


def test_keras_core_example_runs_keras_gqa_layer(recipe_runs):
    """The manual's Keras layer on KerasModuleCore (keras.layers.GroupQueryAttention): GQA,
    masks, gradients and the wrapper checks pass, the declared NaN padding holds; the same
    layer with the causal flag dropped in ``call`` fails the causal cases."""
    pytest.importorskip("implementations.keras.common")  # keras on this process's backend
    ran = _recipe(recipe_runs, "keras_core")
    outcome = {(r["family"], r["case"]): r["outcome"] for r in ran.records}
    for key in (("masking", "causal"), ("shapes", "gqa"), ("shapes", "mqa"),
                ("gradients", "plain"), ("gradients", "gqa"), ("wrapper", "weights"),
                ("wrapper", "mask_causal")):
        assert outcome[key] == "pass", key
    assert outcome[("special_values", "nan_value_causal")] == "deviation"
    wrong_outcome = {r["case"]: r["outcome"] for r in ran.wrongs["nocausal"]}
    assert wrong_outcome["causal"] == "fail", wrong_outcome


def test_flax_module_option_example_reaches_the_module_and_runs_the_cases(recipe_runs):
    """The manual's flax.mha subclass builds its module with the option, its weights read
    back, and it passes the masking cases flax.mha passes."""
    pytest.importorskip("flax")
    code = _block_with("Testing your own module", "module_kwargs")
    scope: dict = {}
    exec(compile(code, "jax.md", "exec"), scope)
    from flax import nnx

    from suite.spec.problem import make_problem

    impl, p = scope["Highest"](), make_problem(0, B=1, L=3, E=8, H=2)
    module = nnx.merge(*impl.build(p, "float32"))
    assert module.precision == module.query.precision == scope["jax"].lax.Precision.HIGHEST
    assert impl.check_wrapper(p) == []
    records = _recipe(recipe_runs, "flax_option").records
    outcome = {(r["family"], r["case"]): r["outcome"] for r in records}
    for case in ("none", "valid_lens", "causal"):
        assert outcome[("masking", case)] == "pass", case
    assert outcome[("masking", "fully_masked_valid_lens")] == "deviation"


def test_hf_model_pre_hook_example_passes_and_fails_without_its_hook(recipe_runs):
    """#42 item 7: the manual shows the pre-hook (layer_inputs) and attns in code; RoFormer's
    rotation switched off there passes the masking and shapes cases, and kept, fails them."""
    pytest.importorskip("transformers")
    ran = _recipe(recipe_runs, "hf_pre_hook")
    outcome = [r["outcome"] for r in ran.records]
    assert "fail" not in outcome and outcome.count("pass") >= 5, outcome
    _fails(ran.wrongs["kept"])


def test_hf_layer_example_caps_on_eager_and_sdpa_needs_its_is_causal(recipe_runs):
    """#52 item 1: Gemma2Attention on its own from hf-layer.md: the eager name meets the cap
    (the variants' self-attention forms), the sdpa name agrees with it; the layer's config
    without the cap fails the cap cases, and the sdpa call without is_causal=False gives a
    causal answer to a problem with no mask."""
    pytest.importorskip("transformers")
    ran = _recipe(recipe_runs, "hf_layer")
    outcome = {(r["impl"], r["family"], r["case"]): r["outcome"] for r in ran.records}
    eager, sdpa = "mine.gemma2_attention[eager]", "mine.gemma2_attention[sdpa]"
    for case in ("softcap_valid_lens", "softcap_large_logits", "softcap_self_causal_padding"):
        assert outcome[(eager, "variants", case)] == "pass", case
    assert outcome[(eager, "variants", "softcap_causal_bottom_right_long_query")] == "deviation"
    assert outcome[(sdpa, "variants", "softcap_valid_lens")] == "unsupported"
    assert outcome[(sdpa, "contracts", "agrees_with_eager")] == "pass"
    assert outcome[(eager, "masking", "none")] == outcome[(sdpa, "masking", "none")] == "pass"
    assert {r["impl"] for r in ran.wrongs["nocap"]} == {"nocap.gemma2_attention[eager]"}
    _fails(ran.wrongs["nocap"], "variants/softcap_valid_lens")
    assert {r["impl"] for r in ran.wrongs["nocausal"]} == {"nocausal.gemma2_attention[sdpa]"}
    _fails(ran.wrongs["nocausal"], "masking/none")


def test_hf_layer_generation_example_runs_the_layers_own_cache(recipe_runs):
    """#52 item 4: hf-layer.md's LlamaAttention generates through transformers' DynamicCache
    and StaticCache (new_cache, mask.cache): every generation case passes in float32; the
    layer called without the cache does not."""
    pytest.importorskip("transformers")
    ran = _recipe(recipe_runs, "hf_cache")
    from suite.conformance.cases import by_family

    outcome = {r["case"]: r["outcome"] for r in ran.records if r["family"] == "generation"}
    # the plain cases pass; those carrying a score variant (#50) are unsupported: the layer
    # declares none
    want = {c.name: "unsupported" if c.problem().has_variants() else "pass"
            for c in by_family()["generation"]}
    assert outcome == want and list(want.values()).count("pass") >= 7, outcome
    _fails(ran.wrongs["nocache"], "generation/prefill_then_steps")


def test_linen_dense_general_example_reads_its_weights_back_and_runs_the_cases(recipe_runs):
    """#42 item 5: a linen module with DenseGeneral kernels wraps from the manual alone
    (einsum_params, EINSUM_LAYERS): the weights check reads them back and the masking,
    gradient and wrapper cases pass or are declared."""
    pytest.importorskip("flax")
    records = _recipe(recipe_runs, "linen").records
    outcome = {(r["family"], r["case"]): r["outcome"] for r in records}
    assert outcome[("wrapper", "weights")] == "pass", outcome
    assert not {"fail", "error"} & set(outcome.values()), outcome
    assert sum(o == "pass" for o in outcome.values()) >= 10, outcome


def test_readme_is_one_screen_with_both_commands_and_their_measured_times():
    """#41: at most 80 lines, none over 300 characters; the main job's and the tests'
    commands, each followed by a time measured at a named commit."""
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 80, len(lines)
    assert max(map(len, lines)) <= 300
    for command in ("nox -s run", "nox -s lint tests"):
        block = text.split(f".venv/bin/nox -s {command.split('-s ')[1]}\n```", 1)
        assert len(block) == 2, command
        after = block[1].strip().splitlines()[0]
        assert re.match(r"\d+ min \d+ s from a fresh clone", after), after
        assert re.search(r"at [0-9a-f]{7}", after), after
