"""``mha-suite repro CASE_ID``: a reproducer of one conformance case, for any plugin and any
case with fixed inputs (``suite.conformance.catalog``), written to an output folder:

- ``problem.npz`` and ``replay.py``, for every plugin: the case's problem as the plugin is
  given it (inputs, weights, mask, scale) and the float64 oracle's output for it; the script
  loads the plugin (a built-in name, ``module:Class`` or a plugin file, as on the command
  line) and the saved problem, runs the case's judge on it (the agreement rule, or the
  case's property), compares the plugin's output with the saved oracle output and prints
  the verdict. It needs mha-suite installed, not the test suite.
- ``repro.py`` and ``inputs.npz``, also, for an agreement case of a plugin that declares
  ``repro_code`` (a function ``attend(q, k, v, allowed, bias, scale)`` over NumPy arrays) and
  adapts a torch kernel (``TorchCore.attend``): the arrays the plugin hands to the library
  (per-head q, k, v, the mask as ``allowed`` and ``bias``, the scale), the oracle's head
  outputs and the same-dtype plain algorithm's error, and a script that imports only NumPy
  and the library: ready for an upstream bug report.

A plugin whose result says it computed another problem than the one handed
(``Result.posed``: a module as shipped, judged on its own q, k and v with identity
projections) is run once on the case when the reproducer is written: ``problem.npz`` then
holds that posed problem, which is what was judged, and the oracle's output for it (and
``posed_how``, what the module handed its attention function); ``handed.npz`` holds the
problem the plugin is given. ``replay.py`` runs the plugin on the handed problem, judges it
on the problem it poses, and compares that problem's q, k and v and the output with the saved
ones.

The Hypothesis family draws its problems, so it has no reproducer (replay it with
``mha-suite check -k random_shapes`` or ``-k random_inference``, derandomised; ``--repeat N``
for flakiness).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from suite.conformance import catalog
from suite.plugins.interface import Unsupported, declared, expressible, is_builtin
from suite.spec import oracle
from suite.spec.paging import Paging
from suite.spec.problem import Mask, Problem, Weights
from suite.spec.variants import SCORE_MODS, Alibi, RelBias, named_score_mod
from suite.sweep import measure

CASE_ID = re.compile(r"^(?:(?P<test>test_[a-z_]+)\[)?(?P<impl>.+?)-"
                     r"(?P<device>cpu(?:-interpret)?|cuda(?::\d+)?)-"
                     r"(?P<dtype>float64|float32|float16|bfloat16)"
                     r"(?:-(?:(?P<family>[a-z_]+)/)?(?P<case>[A-Za-z0-9_+]+))?\]?$")

SCRIPT = '''\
"""Reproducer: {impl} ({library}) on case {family}/{case}, {dtype} on {device}.

Written by `mha-suite repro`; needs only NumPy and the library. The arrays in inputs.npz
are exactly what the implementation passed to the library: q (B, H, L, D), k and v
(B, H|K, S, D), allowed (True = may attend) and bias (added to the logits), or none.
"""
from pathlib import Path

import numpy as np
{code}


DTYPE = "{dtype}"  # the arrays are saved in float64 and go to the library in this dtype
DEVICE = "{device}"

data = np.load(Path(__file__).with_name("inputs.npz"))
allowed = data["allowed"] if "allowed" in data else None
bias = data["bias"] if "bias" in data else None
for run in range(2):
    heads = np.asarray(attend(data["q"], data["k"], data["v"], allowed, bias,
                              float(data["scale"])), dtype=np.float64)
    err = np.abs(heads - data["expected"])
    print(f"run {{run + 1}}: max abs error vs the float64 oracle "
          f"{{np.nanmax(err) if not np.isnan(heads).all() else float('nan'):.3g}}, "
          f"{{int(np.isnan(heads).sum())}} NaN of {{heads.size}} "
          f"(the plain algorithm in {dtype}: {{float(data['naive_err']):.3g}})")
'''


# Beside problem.npz, for a plugin that poses its own problem: the problem it is handed.
HANDED = "handed.npz"


class ReproError(ValueError):
    """A case id or implementation that cannot be reproduced standalone (one line)."""


def parse(case_id: str) -> Dict[str, str]:
    """'torch.flex-cpu-float32-shapes/no_projection_bias', or a test id
    ('test_repeatable[numpy-cpu-float32]', 'test_gradient[torch.eager-cpu-float32-plain]')
    -> its parts: impl, device, dtype, family, case."""
    m = CASE_ID.match(case_id.strip())
    if not m:
        raise ReproError(f"case id: expected IMPL-DEVICE-DTYPE-FAMILY/CASE as in a test id, "
                         f"e.g. torch.flex-cpu-float32-shapes/no_projection_bias; got {case_id!r}")
    parts = {k: v for k, v in m.groupdict().items() if k != "test"}
    if parts["family"] is None:  # a test id of a test that runs one case by its own name
        parts["family"], parts["case"] = catalog.from_test(m["test"] or "", parts["case"])
    if parts["family"] in catalog.DRAWN:
        raise ReproError(f"case: {parts['family']}/{parts['case']} "
                         f"{catalog.DRAWN[parts['family']]}; no reproducer can be written")
    try:
        catalog.get(parts["family"], parts["case"])
    except KeyError:
        known = sorted(f"{c.family}/{c.name}" for c in catalog.ALL)
        raise ReproError(f"case: expected one of the cases with fixed inputs "
                         f"({', '.join(known)}); got {parts['family']}/{parts['case']}") from None
    return parts


def _array(t: Any) -> np.ndarray:
    """A torch tensor as a float64 NumPy array on the host (torch is not imported here)."""
    return t.detach().to("cpu").double().numpy()


def capture(impl: Any, problem: Any, device: str, dtype: str) -> Dict[str, np.ndarray]:
    """The arrays ``impl`` passes to its library for ``problem``: its ``attend(q, k, v,
    mask, scale, need_weights)`` (a torch-based built-in's core) is spied on for one call."""
    if not callable(getattr(impl, "attend", None)):
        raise ReproError(f"{impl.name}: only plugins built on TorchCore (with an attend "
                         "method) can be captured")
    seen: Dict[str, np.ndarray] = {}
    attend = impl.attend

    def spy(q, k, v, mask, scale, need_weights):
        seen.update(q=_array(q), k=_array(k), v=_array(v), scale=np.float64(scale))
        if mask.bias is not None:
            seen.update(allowed=mask.allowed.cpu().numpy(), bias=_array(mask.bias))
        return attend(q, k, v, mask, scale, need_weights)

    impl.attend = spy
    try:
        measure.prepare(impl, problem, device, dtype).call()  # as a sweep point prepares
    except Exception as exc:  # the library is missing or refuses: one line, not a traceback
        from suite.conformance.judge import error_text

        raise ReproError(f"{impl.name}: running the case on {device}/{dtype} failed: "
                         f"{error_text(exc)}") from None
    finally:
        del impl.attend
    return seen


REPLAY = '''\
"""Replay: {impl} on case {family}/{case}, {dtype} on {device}.

Written by `mha-suite repro`; needs mha-suite and the plugin's library. problem.npz holds
the case's problem exactly as the plugin is given it, and the float64 oracle's output (for a
plugin that poses its own problem, a module as shipped: the problem it posed, which is what
was judged, and handed.npz the one it is given). Run it as `python replay.py`; it prints the
verdict and exits 1 when the case fails.
"""
from pathlib import Path

from suite.conformance import repro

IMPL = {impl!r}  # a built-in's name, or the name of a class in PLUGINS
PLUGINS = {plugins!r}  # --plugin specs: module:Class or a plugin file
raise SystemExit(repro.replay(Path(__file__).with_name("problem.npz"), IMPL, PLUGINS,
                              {device!r}, {dtype!r}, {family!r}, {case!r}))
'''


def save_problem(path: Path, p: Problem, **extra: np.ndarray) -> None:
    """Write problem ``p`` (and ``extra`` arrays) to ``path`` (.npz), keeping which inputs
    are one array (self-attention, one key/value source)."""
    arrays: Dict[str, Any] = {"query": p.query, "key": p.key, "value": p.value,
                              "key_is_query": p.key is p.query, "value_is_key": p.value is p.key,
                              "num_heads": p.num_heads, "causal": p.mask.causal,
                              "causal_align": p.mask.causal_align}
    arrays.update({k: v for k, v in p.weights.as_dict().items() if v is not None})
    for name, value in (("num_kv_heads", p.num_kv_heads), ("scale", p.scale),
                        ("grad_output", p.grad_output), ("valid_lens", p.mask.valid_lens),
                        ("allowed", p.mask.allowed), ("bias", p.mask.bias),
                        ("query_offset", p.mask.query_offset),
                        ("segments", p.mask.segments), ("softcap", p.softcap),
                        ("sinks", p.sinks), ("steps", p.steps), ("cache_len", p.cache_len),
                        ("value_head_dim", p.value_head_dim)):
        if value is not None:
            arrays[name] = value
    # the score variants' parameters, each under its field's name and a dot
    for prefix, variant in (("alibi", p.alibi), ("rel_bias", p.rel_bias)):
        if variant is not None:
            arrays.update({f"{prefix}.{f.name}": getattr(variant, f.name)
                           for f in dataclasses.fields(variant)})
    if p.score_mod is not None:  # a function: saved by name (the suite's examples load back)
        arrays["score_mod.name"] = p.score_mod.name
    if p.paging is not None:  # the paged cache's layout: its pool is rebuilt from it
        arrays.update({f"paging.{name}": getattr(p.paging, name) for name in Paging.LAYOUT})
    np.savez(path, **arrays, **extra)


def load_problem(path: Path) -> Tuple[Problem, Dict[str, np.ndarray]]:
    """The problem saved by ``save_problem`` and the extra arrays saved beside it."""
    with np.load(path) as data:
        d = {k: data[k] for k in data.files}
    query = d.pop("query")
    key = query if d.pop("key_is_query") else d.pop("key")
    value = key if d.pop("value_is_key") else d.pop("value")
    d.pop("key", None), d.pop("value", None)
    weights = Weights(**{f.name: d.pop(f.name, None) for f in dataclasses.fields(Weights)})
    mask = Mask(valid_lens=d.pop("valid_lens", None), causal=bool(d.pop("causal")),
                causal_align=str(d.pop("causal_align")), allowed=d.pop("allowed", None),
                bias=d.pop("bias", None), query_offset=d.pop("query_offset", None),
                segments=d.pop("segments", None))
    kv = d.pop("num_kv_heads", None)
    scale = d.pop("scale", None)
    p = Problem(query, key, value, weights, int(d.pop("num_heads")),
                None if kv is None else int(kv), mask, None if scale is None else float(scale),
                d.pop("grad_output", None))
    return _load_variants(p, d), d


def _load_variants(p: Problem, d: Dict[str, np.ndarray]) -> Problem:
    """``p`` with the score variants ``save_problem`` wrote (popped from ``d``)."""
    found: Dict[str, Any] = {}
    for name, kind in (("softcap", float), ("value_head_dim", int), ("cache_len", int)):
        if name in d:
            found[name] = kind(d.pop(name))
    if "steps" in d:
        found["steps"] = tuple(int(n) for n in d.pop("steps"))
    if "sinks" in d:
        found["sinks"] = d.pop("sinks")
    if "paging.block_table" in d:
        found["paging"] = Paging(
            int(d.pop("paging.page_size")), d.pop("paging.block_table"),
            int(d.pop("paging.num_blocks")), int(d.pop("paging.seed")))
    for prefix, cls in (("alibi", Alibi), ("rel_bias", RelBias)):
        if f"{prefix}.{dataclasses.fields(cls)[0].name}" not in d:
            continue
        values = {f.name: d.pop(f"{prefix}.{f.name}") for f in dataclasses.fields(cls)}
        found[prefix] = cls(**{n: v if v.ndim else v.item() for n, v in values.items()})
    if "score_mod.name" in d:
        name = str(d.pop("score_mod.name"))
        mod = named_score_mod(name)
        if mod is None:
            raise ReproError(f"score_mod: {name!r} is not one of the suite's examples "
                             f"({', '.join(sorted(SCORE_MODS))}); a plugin's own modifier "
                             "is not saved with the problem, replay its case instead")
        found["score_mod"] = mod
    return dataclasses.replace(p, **found) if found else p


def load_plugin(name: str, plugins: Sequence[str] = ()) -> Any:
    """Implementation ``name`` from the built-ins, the installed plugins and ``plugins``
    (``--plugin`` specs); ReproError in one line when it is unknown or unavailable."""
    from suite.plugins import registry

    try:
        reg = registry.build(plugins=plugins)
        entry = reg.select([name], available_only=False)[0]
    except (registry.PluginError, registry.UnknownImplementation) as exc:
        raise ReproError(str(exc).strip("\"'")) from None
    if not entry.available:
        raise ReproError(f"{entry.name} is unavailable here: {entry.error}")
    return entry.impl


def replay(path: Path, impl_name: str, plugins: Sequence[str], device: str, dtype: str,
           family: str, name: str) -> int:
    """Run case ``family/name`` on the saved problem at ``path``, print the verdict and the
    error against the saved oracle output; 1 when the case fails or errs, else 0."""
    from suite.conformance.judge import FAILED, Outcome, attempt

    impl = load_plugin(impl_name, plugins)
    case = catalog.get(family, name)
    p, saved = load_problem(path)
    handed_path = path.with_name(HANDED)
    posed = handed_path.exists()  # p is the problem the plugin posed; it is handed another
    handed = load_problem(handed_path)[0] if posed else p
    out = case.judge_problem(impl, Outcome(impl_name, device, dtype, family, name, case.seed,
                                           "pass"), handed)
    print(f"{impl_name} on {device}/{dtype}, case {family}/{name}: {out.outcome}"
          + (f": {out.reason}" if out.reason else ""))
    worst = out.worst()
    if worst is not None:
        print(f"  closest to its bound: {worst.describe()}")
    if posed:
        print(f"  {path.name}: the problem the plugin posed when this was written, its own "
              f"q, k and v through identity projections ({str(saved.get('posed_how', ''))})")
    # a fresh copy: the judge's oracle above made the problem's arrays read-only (its cache),
    # and a loader that wraps them without a copy (torch.as_tensor) would warn of that
    results, refused = attempt(impl, [copy.deepcopy(handed)], device, dtype, posed=posed)
    if refused:
        print(f"  output vs the saved float64 oracle: not run ({refused[0]}: {refused[1]})")
    elif posed and results[0].posed is None:
        print("  output vs the saved float64 oracle: not run (the plugin posed no problem "
              f"this time; {path.name} holds the one it posed)")
    else:
        if posed:  # the module's own q, k and v now vs those saved
            q = results[0].posed.problem
            same = [float(np.max(np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(a - b))))
                    if a.shape == b.shape else None  # NaN: one of them has a NaN there
                    for a, b in ((q.query, p.query), (q.key, p.key), (q.value, p.value))]
            print("  its q, k, v now vs the saved posed problem: " + (
                "max abs difference " + ", ".join(f"{d:.3g}" for d in same)
                if None not in same else "another shape"))
        got = np.asarray(results[0].output, np.float64)  # (B, L, E)
        err = np.abs(got - saved["expected"])
        worst_err = float(np.nanmax(err)) if not np.isnan(err).all() else float("nan")
        print(f"  output vs the saved float64 oracle: max abs error {worst_err:.3g}, "
              f"{int(np.isnan(got).sum())} NaN of {got.size}")
    return 1 if out.outcome in FAILED else 0


def _plugin_specs(plugins: Sequence[str]) -> List[str]:
    """--plugin specs that load from any folder: a plugin file's path made absolute."""
    out = []
    for spec in plugins:
        m = re.match(r"^(?P<path>.+\.py)(?P<cls>:\w+)?$", spec)
        if m and os.path.exists(m["path"]):
            spec = str(Path(m["path"]).resolve()) + (m["cls"] or "")
        out.append(spec)
    return out


def may_pose(impl: Any) -> bool:
    """Whether ``impl``'s result may be posed (``Implementation.poses_problem``): what it
    declares; not declared, False for a built-in and True for any other plugin (one call
    tells)."""
    said = declared(impl, "poses_problem")
    return (not is_builtin(type(impl))) if said is None else bool(said)


def _posed(impl: Any, problem: Problem, device: str, dtype: str) -> Any:
    """The problem ``impl`` says it computed for ``problem`` (``Result.posed``, a module as
    shipped: its own q, k and v), from one call; None when its result poses none, or when the
    call does not run here (the replay then says why)."""
    from suite.conformance.judge import attempt

    results, refused = attempt(impl, [problem], device, dtype, posed=True)
    posed = None if refused else results[0].posed
    return posed if isinstance(getattr(posed, "problem", None), Problem) else None


def write(impl: Any, case_id: str, out: Path, plugins: Sequence[str] = ()) -> List[Path]:
    """Write the reproducer of ``case_id`` on ``impl`` into folder ``out``: ``replay.py`` and
    ``problem.npz`` always (and ``handed.npz`` for a plugin that poses its own problem),
    ``repro.py`` and ``inputs.npz`` where the plugin declares ``repro_code``; the paths
    written, scripts first."""
    parts = parse(case_id)
    case = catalog.get(parts["family"], parts["case"])
    problem = case.problem_for(impl)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "problem.npz"
    runs = True
    try:  # the problem as the plugin runs it (one key/value source: value = key; a module
        # without projection biases: none), and the oracle's output for it
        problem = expressible(impl, problem)
        expected = oracle.oracle(problem)[0]  # (B, L, E)
    except Unsupported:  # a problem the plugin cannot express: the verdict says so
        expected, runs = np.full((problem.B, problem.L, problem.E), np.nan), False
    (out / HANDED).unlink(missing_ok=True)  # a reproducer written here before
    save_problem(saved, problem, expected=expected)
    script = out / "replay.py"
    script.write_text(REPLAY.format(impl=impl.name, plugins=_plugin_specs(plugins), **{
        k: parts[k] for k in ("device", "dtype", "family", "case")}))
    written = [script, saved]
    # An agreement case is judged on the problem the plugin poses, where it poses one (a
    # module as shipped): only a call says so. The files above are written first, so a
    # plugin that crashes the process here still leaves its replay.
    posed = _posed(impl, copy.deepcopy(problem), parts["device"], parts["dtype"]) \
        if runs and case.judge is None and may_pose(impl) else None  # a copy: read-only arrays
    if posed is not None:  # what was judged: the posed problem and its oracle
        q = posed.problem
        try:
            judged = oracle.oracle(q)[0]
        except Exception:  # no attention of the case (the verdict says why)
            judged = np.full((q.B, q.L, q.E), np.nan)
        save_problem(out / HANDED, problem)
        save_problem(saved, q, expected=judged, posed_how=np.str_(posed.how))
        written.append(out / HANDED)
    # the standalone attend(q, k, v, allowed, bias, scale) has no score variants
    if declared(impl, "repro_code") and case.judge is None and not problem.has_variants():
        written[1:1] = _write_standalone(impl, problem, parts, out)
    return written


def _write_standalone(impl: Any, problem: Problem, parts: Dict[str, str], out: Path
                      ) -> Tuple[Path, Path]:
    """``repro.py`` and ``inputs.npz``: the library alone on the arrays the plugin hands it."""
    code = impl.repro_code
    arrays = capture(impl, problem, parts["device"], parts["dtype"])
    f = oracle.forward(problem)
    # The per-head reference: the oracle's heads; the plain algorithm's in the same dtype.
    naive = max(float(np.nanmax(np.abs(oracle.forward(problem, ar)["heads"] - f["heads"])))
                for ar in (oracle.Arithmetic(parts["dtype"], o) for o in oracle.ORDERS))
    inputs = out / "inputs.npz"
    np.savez(inputs, expected=f["heads"], naive_err=np.float64(naive), **arrays)
    script = out / "repro.py"
    script.write_text(SCRIPT.format(library=f"{impl.framework} {impl.framework_version()}",
                                    code=textwrap.dedent(code).strip(), **parts))
    return script, inputs
