"""Calling an implementation and classifying what it did: the one place that does both.

``attempt`` calls a plugin on problems (prepare, run, synchronize, fetch) and turns a
missing feature or an ``Unsupported`` into "unsupported", an exception into "error" and a
result of the wrong kind into "fail". ``judge`` compares a result with the oracle under the
agreement rule and the plugin's declared deviation policies. A result that says it computed
another problem than the one handed (``Result.posed``, a module as shipped) is judged on that
problem (``posed_problem``); only ``run_problem`` and ``judge`` take such a result.

Outcomes: pass, fail (the rule or a declared policy was broken), error (the plugin raised),
unsupported (a feature the case needs is not declared, or the plugin refused the problem),
deviation (a declared policy, observed and checked), flaky (repeated runs disagreed).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from suite.plugins import adapters
from suite.plugins.declarations import Deviation, deviations_for
from suite.plugins.fetch_check import check_output
from suite.plugins.interface import (
    Implementation,
    Posed,
    Result,
    Unsupported,
    array_library,
    call,
    declared,
    expressible,
    without_projection_biases,
)
from suite.plugins.known_behaviours import KnownBehaviour, kernel_calls
from suite.plugins.known_behaviours import applicable as known_behaviours
from suite.results.vocabulary import FAILED_OUTCOMES
from suite.spec import diagnose, oracle
from suite.spec.agreement import Comparison, compare, max_abs_err
from suite.spec.problem import Problem

FAILED = FAILED_OUTCOMES  # str enums: equal to the strings records hold


@dataclasses.dataclass
class Outcome:
    impl: str
    device: str
    dtype: str
    family: str
    case: str
    seed: int
    outcome: str
    comparisons: List[Comparison] = dataclasses.field(default_factory=list)
    reason: Optional[str] = None
    test_id: Optional[str] = None
    # Behaviours with declarable deviations this case's problems exhibit, and the declared
    # policies the result needed (the rest were stale here: the spec's answer came out).
    behaviours: List[str] = dataclasses.field(default_factory=list)
    policies_used: List[str] = dataclasses.field(default_factory=list)
    # The CPU instruction-set level the plugin's library dispatched to (suite.plugins.isa; None
    # where the suite does not pin one), and the known library behaviours (suite.plugins.known_behaviours)
    # whose conditions held in this case / that the result needed.
    isa: Optional[str] = None
    known_held: List[str] = dataclasses.field(default_factory=list)
    known_used: List[str] = dataclasses.field(default_factory=list)
    # The rows a failing comparison with the spec broke, by kind (suite.spec.diagnose.classify),
    # per comparison ("output", "weights"); None when the spec's answer came out.
    bad_rows: Optional[Dict[str, dict]] = None

    def worst(self) -> Optional[Comparison]:
        """The comparison closest to (or furthest past) its bound."""
        def used(c: Comparison) -> float:
            return np.inf if not np.isfinite(c.err) else c.err / c.bound
        return max(self.comparisons, key=used, default=None)

    def classify(self, outcome: str, reason: Optional[str]) -> Outcome:
        self.outcome, self.reason = outcome, reason
        return self

    def record(self) -> dict:
        w = self.worst()
        return {
            "impl": self.impl, "device": self.device, "dtype": self.dtype,
            "family": self.family, "case": self.case, "test_id": self.test_id, "seed": self.seed,
            "outcome": self.outcome,
            "err": _json_number(w.err) if w else None, "err_naive": _json_number(w.err_naive) if w else None,
            "bound": _json_number(w.bound) if w else None, "ratio": _json_number(w.ratio) if w else None,
            "k": w.k if w else None, "atol": w.atol if w else None, "reason": self.reason,
            "behaviours": list(self.behaviours), "policies_used": list(self.policies_used),
            "isa": self.isa, "known_held": list(self.known_held),
            "known_used": list(self.known_used), "bad_rows": self.bad_rows,
        }


def _json_number(x: Optional[float]) -> Optional[float]:
    """JSON has no NaN/inf: write them as strings the report reads back."""
    if x is None:
        return None
    return float(x) if np.isfinite(x) else str(x)


def missing_features(impl: Implementation, p: Problem, extra: frozenset = frozenset()) -> list:
    return sorted((p.features() | extra) - frozenset(declared(impl, "features")))


_SUITE_DIRS = tuple(str(Path(m.__file__).resolve().parent) + os.sep
                    for m in (sys.modules["suite"],))
_LIBRARY_DIRS = ("site-packages", "dist-packages")


def _plugin_files(impl: Any) -> frozenset:
    """The files of ``impl``'s own classes: its class and the bases it shares with no
    library or suite module (a user's base class in another file counts as the plugin)."""
    files = set()
    for cls in type(impl).__mro__:
        try:
            f = str(Path(inspect.getsourcefile(cls) or "").resolve())
        except (TypeError, OSError):
            continue
        if cls is type(impl) or not (_origin(f) in ("library", "suite")
                                     or f.startswith(_IMPLEMENTATION_DIR)):
            files.add(f)
    return frozenset(files)


_IMPLEMENTATION_DIR = str(Path(_SUITE_DIRS[0]).parent / "implementations") + os.sep


def _origin(filename: str) -> str:
    """"library" (an installed package or the standard library), "suite" or "other"."""
    if filename.startswith(_SUITE_DIRS) or filename.startswith(_IMPLEMENTATION_DIR):
        return "suite"  # first: the suite may itself be installed in site-packages
    parts = Path(filename).parts
    if any(d in parts for d in _LIBRARY_DIRS) or filename.startswith(sys.base_prefix):
        return "library"
    return "other"


def _library_name(filename: str) -> str:
    parts = Path(filename).parts
    for d in _LIBRARY_DIRS:
        if d in parts and parts.index(d) + 1 < len(parts):
            return parts[parts.index(d) + 1].removesuffix(".py")
    return "the standard library"


def origin(exc: BaseException, impl: Any = None) -> str:
    """Where ``exc`` was raised, by its traceback's innermost frame: in the plugin's own file
    ("in the plugin, my_plugin.py:23 in call"), inside an installed library ("inside torch,
    functional.py:5000, called from my_plugin.py:23"), or in the suite."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    if not frames:
        return ""
    own = _plugin_files(impl) if impl is not None else frozenset()

    def at(f, func: bool = True) -> str:
        return f"{Path(f.filename).name}:{f.lineno}" + (f" in {f.name}" if func else "")

    resolved = [(f, str(Path(f.filename).resolve())) for f in frames]
    last, last_file = resolved[-1]
    mine = [f for f, name in resolved if name in own]
    if last_file in own:
        return f"in the plugin, {at(last)}"
    if _origin(last_file) == "library":
        called = f", called from {at(mine[-1], False)}" if mine else ""
        return f"inside {_library_name(last_file)}, {at(last, False)}{called}"
    if _origin(last_file) == "suite":
        called = f", called from {at(mine[-1], False)}" if mine else ""
        return f"in the suite, {at(last)}{called}"
    return f"at {at(last, False)}"


def error_text(exc: BaseException, impl: Any = None) -> str:
    """``Type: message (where)``; given the plugin, where says whose code raised
    (``origin``): the plugin's own, a library's, or the suite's."""
    where = origin(exc, impl)
    where = f" ({where})" if where else ""
    return f"{type(exc).__name__}: {_first_line(exc)}{where}"


def _first_line(exc: BaseException) -> str:
    """The message's first non-empty line; a wrapper whose own line says nothing (inductor's
    ``BackendCompilerFailed: backend='inductor' raised:``) gets its cause's type and line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    cause = exc.__cause__ or getattr(exc, "inner_exception", None)
    if isinstance(cause, BaseException) and (not first or first.endswith(":")):
        return f"{first} {type(cause).__name__}: {_first_line(cause)}".strip()
    return first


def library_refuses(exc: BaseException, impl: Any = None) -> bool:
    """True when a library, not the plugin or the suite, raised NotImplementedError for the
    call (itself or as the cause of a wrapper: inductor's ``InductorError: LoweringException:
    NotImplementedError: NYI: ...`` for a head width FlexAttention has no CUDA kernel for,
    JAX's cuDNN attention for a head width it does not take): the library says it does not
    do this problem, which is "unsupported", not a failure. A plugin's own
    NotImplementedError (a stub) stays an error."""
    if not origin(exc, impl).startswith("inside "):
        return False
    seen = exc
    for _ in range(8):  # the exception and the causes it wraps
        if isinstance(seen, NotImplementedError):
            return True
        nxt = seen.__cause__ or getattr(seen, "inner_exception", None) or seen.__context__
        if not isinstance(nxt, BaseException):
            break
        seen = nxt
    return "NotImplementedError:" in _first_line(exc)


def _result_problem(res: object, p: Problem, grad: bool, posed: bool = False
                    ) -> Optional[str]:
    """Why a plugin's result is not a usable Result for problem ``p`` (None when it is);
    ``posed``: the caller judges a result's own posed problem (``Result.posed``)."""
    if not isinstance(res, Result):
        return f"fetch: expected a suite.plugins.interface.Result, got {type(res).__name__}"
    if res.posed is not None:
        if not posed:
            raise Unsupported("the plugin returns the problem it computed (Result.posed, a "
                              "module as shipped); this case compares calls of the problem "
                              "it was handed")
        if not isinstance(res.posed, Posed) or not isinstance(res.posed.problem, Problem):
            return (f"fetch: Result.posed: expected suite.plugins.interface.Posed(problem, "
                    f"how), got {res.posed!r:.80}")
        p = res.posed.problem
    invalid = check_output(res, (p.B, p.L, p.E), finite=False)  # the oracle judges values
    if invalid:
        return invalid
    if grad and not res.grads:
        return "declares 'grad' but returned no gradients"
    return None


def attempt(impl: Implementation, problems: Sequence[Problem], device: str, dtype: str, *,
            need_weights: bool = False, grad: bool = False, extra: frozenset = frozenset(),
            posed: bool = False
            ) -> Tuple[Optional[List[Result]], Optional[Tuple[str, str]]]:
    """Call ``impl`` on each problem: (results, None), or (None, (outcome, reason)) when it
    cannot be judged (unsupported, error, or a result of the wrong kind: fail). ``posed``:
    the caller judges a result on the problem it says it computed (``Result.posed``, as
    ``judge`` does); without it such a result makes the case unsupported."""
    needs = extra | ({"grad"} if grad else set())
    missing = sorted(set().union(*(missing_features(impl, p, frozenset(needs)) for p in problems)))
    if missing:
        return None, ("unsupported", f"needs {', '.join(missing)}")
    results = []
    for p in problems:
        try:
            p = expressible(impl, p)  # one key/value source: value = key
            res = call(impl, p, device, dtype, need_weights=need_weights, grad=grad)
            wrong = _result_problem(res, p, grad, posed)
        except Unsupported as exc:  # the plugin cannot express this problem: its own words
            return None, ("unsupported", str(exc) or type(exc).__name__)
        except Exception as exc:  # a plugin that raises is reported, the run goes on
            if library_refuses(exc, impl):  # the library's own "not implemented" for this call
                return None, ("unsupported", f"the library does not implement this call: "
                                             f"{error_text(exc, impl)}")
            return None, ("error", error_text(exc, impl))
        if wrong:
            return None, ("fail", wrong)
        results.append(res)
    return results, None


def _allowed(p: Problem) -> np.ndarray:
    """(B, H, L, S) True where a row may attend a key: the boolean parts and the bias's
    -inf entries (a -inf bias masks its key, as in the oracle)."""
    allowed = p.mask.dense_allowed(p.B, p.H, p.L, p.S)
    if p.mask.bias is not None:
        allowed = allowed & (np.broadcast_to(p.mask.bias, allowed.shape) > -np.inf)
    return allowed


def _bias_masked_rows(p: Problem) -> np.ndarray:
    """(B, H, L, 1): rows with no key to attend only because the bias is -inf at every key
    the boolean parts leave (a refinement of fully_masked_rows)."""
    if p.mask.bias is None:
        return np.zeros((p.B, p.H, p.L, 1), bool)
    by_bool = p.mask.dense_allowed(p.B, p.H, p.L, p.S).any(-1, keepdims=True)
    return by_bool & ~_allowed(p).any(-1, keepdims=True)


def _causal_emptied_rows(p: Problem) -> np.ndarray:
    """(B, L, 1): query rows with no key to attend in any head that the mask without its
    causal part leaves a key in every head (a refinement of fully_masked_rows)."""
    if not p.mask.causal:
        return np.zeros((p.B, p.L, 1), bool)
    dead = ~_allowed(p).any(-1)  # (B, H, L)
    uncausal = dataclasses.replace(p, mask=dataclasses.replace(p.mask, causal=False))
    alive = _allowed(uncausal).any(-1)  # (B, H, L)
    return (dead.all(1) & alive.all(1))[..., None]


def _nonfinite_kv(p: Problem) -> np.ndarray:
    """(B, S): key or value positions holding NaN or inf."""
    return ~(np.isfinite(p.key).all(-1) & np.isfinite(p.value).all(-1))


def _query_padded_rows(p: Problem) -> np.ndarray:
    """(B, L, 1): query rows the requested mask form's query part (``q_lengths``,
    ``qpm_bool``) pads; none for a problem without such a form."""
    none = np.zeros((p.B, p.L, 1), bool)
    form = adapters.requested_form(p)
    if not form or not {"q_lengths", "qpm_bool"} & set(adapters.form_parts(form)):
        return none
    try:
        parts = adapters.form_mask(p, form)
    except Unsupported:  # the form cannot express the problem: no rows are its padding
        return none
    if parts.q_lengths is not None:
        rows = np.arange(p.L)[None, :] < np.asarray(parts.q_lengths)[:, None]  # (B, L)
    else:
        rows = np.asarray(parts.query_mask, bool)
    return ~rows[..., None]


def behaviours(p: Problem) -> List[str]:
    """The behaviours with declarable deviations that problem ``p`` exhibits."""
    out = []
    padded = _query_padded_rows(p)  # (B, L, 1): judged as query_padded_rows, not here
    if not p.mask.is_empty() and (~_allowed(p).any(-1) & ~padded[:, None, :, 0]).any():
        out.append("fully_masked_rows")
    if padded.any():
        out.append("query_padded_rows")
    if _bias_masked_rows(p).any():
        out.append("bias_masked_rows")
    if _causal_emptied_rows(p).any():
        out.append("causal_emptied_rows")
    bad = _nonfinite_kv(p)
    # NaN or inf in a key or value position that some row may not attend (padding, or
    # above a causal diagonal): the spec says those rows do not see it.
    if bad.any() and (bad[:, None, None, :] & ~_allowed(p)).any():
        out.append("nan_padding")
    if _nonfinite_query_rows(p).any():
        out.append("nan_query_rows")
    return out


def _nonfinite_query_rows(p: Problem) -> np.ndarray:
    """(B, L, 1): query rows holding NaN or inf."""
    return ~np.isfinite(p.query).all(-1, keepdims=True)


def _zero_rows(p: Problem, rows: np.ndarray, *arrays: np.ndarray) -> List[np.ndarray]:
    """``arrays`` (B, L, E) with ``rows`` (B, L, 1) set to a zero head output: the output
    bias (0 without one), as the oracle gives a row with no key."""
    b_o = np.zeros(p.E) if p.weights.b_o is None else np.asarray(p.weights.b_o, np.float64)
    return [np.where(rows, b_o, np.asarray(a, np.float64)) for a in arrays]


def _nan_readers(p: Problem) -> np.ndarray:
    """(B, 1, 1): batch items whose rows read a NaN or inf key or value (the mask hides it)."""
    return _nonfinite_kv(p).any(axis=1)[:, None, None]


def _comparisons(p: Problem, res: Result, dtype: str, with_weights: bool,
                 fully_masked: str = "zero", nan_confined: bool = False,
                 bias_masked_nan: bool = False, nan_query_zero: bool = False,
                 query_padded: str = "zero", dots: Optional[str] = None,
                 causal_emptied: Optional[str] = None) -> List[Comparison]:
    """Output (and weights) against the oracle; ``fully_masked``, ``nan_confined``,
    ``bias_masked_nan``, ``nan_query_zero`` and ``query_padded`` apply declared policies to
    the reference instead of the spec. ``fully_masked`` holds for the rows with no key
    except those a query-lengths form pads, which follow ``query_padded``, and, where
    ``causal_emptied`` is given, those the causal part alone empties, which follow it.
    ``dots`` (a float32_dots policy) is how the baselines' float32 products take their
    operands."""
    ref_out, ref_w = oracle.oracle(p, fully_masked)
    naive = oracle.baselines(p, dtype, fully_masked, dots)
    model_out, model_w = oracle.first_order(p, dtype, fully_masked, dots)
    padded = _query_padded_rows(p)  # (B, L, 1); padded in every head
    emptied = _causal_emptied_rows(p) & ~padded if causal_emptied else padded & False
    for rows, own in ((padded, query_padded), (emptied, causal_emptied)):
        if not rows.any() or own == fully_masked:
            continue
        q_out, q_w = oracle.oracle(p, own)  # each row from its own policy
        ref_out, ref_w = np.where(rows, q_out, ref_out), np.where(rows[:, None], q_w, ref_w)
        naive = [(np.where(rows, qn[0], n[0]), np.where(rows[:, None], qn[1], n[1]))
                 for n, qn in zip(naive, oracle.baselines(p, dtype, own, dots))]
        q_model_out, q_model_w = oracle.first_order(p, dtype, own, dots)
        model_out = np.where(rows, q_model_out, model_out)
        model_w = np.where(rows[:, None], q_model_w, model_w)
    if nan_query_zero:  # nan_query_rows=zero: those output rows are the output bias
        rows = _nonfinite_query_rows(p)
        ref_out = _zero_rows(p, rows, ref_out)[0]
        model_out = np.where(rows, 0.0, model_out)  # the rows' rounding bound: exact zeros
        naive = [(_zero_rows(p, rows, n[0])[0], n[1]) for n in naive]
    if bias_masked_nan:  # bias_masked_rows=nan: those rows' weights, and output rows, are NaN
        rows = _bias_masked_rows(p)  # (B, H, L, 1)
        ref_w = np.where(rows, np.nan, ref_w)
        ref_out = np.where(rows.any(axis=1), np.nan, ref_out)  # (B, L, 1): W_o mixes heads
    readers = _nan_readers(p) if nan_confined else None
    comps = [compare("output", res.output, ref_out, [n[0] for n in naive], dtype,
                     may_be_nan=readers, model=model_out)]
    if with_weights:
        if res.attn_weights is None:
            raise AssertionError("declares 'weights' but returned none")
        # Rows the nan policy makes NaN stay wholly NaN; special-value rows need one NaN.
        dead = ~_allowed(p).any(axis=-1, keepdims=True)  # (B, H, L, 1)
        special = ((dead & ~padded[:, None]) if fully_masked == "nan" else False) \
            | ((dead & padded[:, None]) if query_padded == "nan" else False) \
            | np.zeros(ref_w.shape[:-1] + (1,), bool)
        got_w, ref_w = _nan_weight_rows(np.asarray(res.attn_weights, np.float64), ref_w, special)
        comps.append(compare("weights", got_w, ref_w, [n[1] for n in naive], dtype,
                             may_be_nan=None if readers is None else readers[..., None],
                             model=model_w))
    return comps


def _nan_weight_rows(got: np.ndarray, ref: np.ndarray, policy_rows: np.ndarray
                     ) -> Tuple[np.ndarray, np.ndarray]:
    """The spec for the weights of a row a special value makes NaN (a NaN or +inf logit):
    the row holds a NaN (its other entries are not specified: IEEE softmax makes them all
    NaN, a kernel that divides by a sum it checks for zero leaves finite ones). Such rows
    become wholly NaN in both, so the comparison asks for a NaN there and nothing more;
    ``policy_rows`` (B, H, L, 1) are rows a declared policy makes NaN, checked whole."""
    nan_rows = np.isnan(ref).any(axis=-1, keepdims=True) & ~policy_rows
    if got.shape != ref.shape or not nan_rows.any():
        return got, ref
    has_nan = np.isnan(got).any(axis=-1, keepdims=True)
    return np.where(nan_rows & has_nan, np.nan, got), np.where(nan_rows, np.nan, ref)


def posed_problem(p: Problem, posed: Posed) -> Tuple[Problem, Optional[str]]:
    """The problem a result says it computed (``Result.posed``, a module as shipped) for
    handed problem ``p``, and why it is no attention of ``p`` (None when it is): another
    batch, query or key length, head count or mask, or NaN or inf in its query, key or value
    at a position where ``p``'s inputs are finite (a norm or rotary that made or spread one)."""
    q = posed.problem
    if (q.B, q.L, q.S, q.H) != (p.B, p.L, p.S, p.H):
        return q, (f"the plugin computed B={q.B}, H={q.H}, Lq={q.L}, Lk={q.S}; the problem is "
                   f"B={p.B}, H={p.H}, Lq={p.L}, Lk={p.S}")
    if not (np.array_equal(_allowed(q), _allowed(p)) and (
            (q.mask.bias is None) == (p.mask.bias is None)) and (
            q.mask.bias is None or np.array_equal(np.broadcast_to(q.mask.bias, (q.B, q.H, q.L, q.S)),
                                                  np.broadcast_to(p.mask.bias, (p.B, p.H, p.L, p.S)),
                                                  equal_nan=True))):
        return q, "the plugin computed another mask than the problem's"
    bad_q = ~np.isfinite(p.query).all(-1)  # (B, L)
    bad_kv = _nonfinite_kv(p)  # (B, S)
    for what, x, bad in (("query", q.query, bad_q), ("key", q.key, bad_kv),
                         ("value", q.value, bad_kv)):
        made = ~np.isfinite(x).all(-1) & ~bad  # (B, T)
        if made.any():
            b, t = np.argwhere(made)[0]
            return q, (f"the plugin's own {what} holds NaN or inf at batch {b}, position {t}, "
                       f"where the case's input is finite")
    return q, None


def judge(impl: Implementation, out: Outcome, p: Problem, res: Result) -> Outcome:
    """Classify result ``res`` of problem ``p``: the spec first, then any declared policy.
    A result that computed another problem (``Result.posed``) is judged on that one
    (``posed_problem``), and a failure's reason ends with how the plugin came to it."""
    posed = getattr(res, "posed", None)
    if posed is not None:
        q, wrong = posed_problem(p, posed)
        if wrong:
            return out.classify("fail", f"{wrong}; {posed.how}" if posed.how else wrong)
        judged = _judge(impl, out, q, res, handed=p)
        if judged.outcome == "fail" and posed.how:
            judged.reason = f"{judged.reason}; {posed.how}"
        return judged
    return _judge(impl, out, p, res)


def _judge(impl: Implementation, out: Outcome, p: Problem, res: Result,
           handed: Optional[Problem] = None) -> Outcome:
    """``judge`` on the problem ``res`` computed (``p``); ``handed``: the problem the plugin
    was handed, where that is another (the call a known behaviour's trace runs again)."""
    dtype = out.dtype
    with_weights = _with_weights(impl, p)
    exhibited = behaviours(p)
    out.behaviours = sorted(set(out.behaviours) | set(exhibited))
    out.isa = isa = implementation_isa(impl, out.device)
    held = _reaching(impl, p if handed is None else handed, out,
                     known_behaviours(impl, p, dtype, out.device, isa, exhibited), with_weights)
    out.known_held = sorted(set(out.known_held) | {kb.name for kb in held})
    with oracle.pinned(p):  # no plugin code runs from here on: p's arrays stay as they are
        return _classify(impl, out, p, res, exhibited, held, with_weights)


def _classify(impl: Implementation, out: Outcome, p: Problem, res: Result,
              exhibited: List[str], held: List[KnownBehaviour], with_weights: bool
              ) -> Outcome:
    """``judge``'s comparisons with the spec and the declared policies."""
    dtype, isa = out.dtype, out.isa
    try:
        out.comparisons = _comparisons(p, res, dtype, with_weights)
    except AssertionError as exc:  # wrong shapes, missing weights
        return out.classify("fail", str(exc))
    failed = [c for c in out.comparisons if not c.passed]
    if not failed:
        return out.classify("pass", out.reason)
    # A declaration holds where its ``where`` says (versions, level, device, problems): a
    # per-dtype one in its dtype only; elsewhere the spec's answer is required.
    policies = deviations_for(impl, dtype, out.device, isa)
    # every float32 problem shows how its products take their operands, every float64 one
    # the dtype its softmax runs in
    shown = exhibited + [b for b in [precision_behaviour(dtype)] if b]
    declared: Dict[str, Deviation] = {b: policies[b] for b in shown if b in policies
                                      and policies[b].where.holds_for(p, dtype, isa)}
    known = [kb for kb in held if kb.behaviour not in declared]
    spec = "; ".join(c.describe() for c in failed) + _where(failed, res, p, out)
    if not declared and not known:
        return out.classify("fail", spec)
    policy_of = {**{kb.behaviour: kb.policy for kb in known},
                 **{b: d.policy for b, d in declared.items()}}
    policy = _comparisons(p, res, dtype, with_weights,
                          policy_of.get("fully_masked_rows", "zero"), "nan_padding" in policy_of,
                          "bias_masked_rows" in policy_of, "nan_query_rows" in policy_of,
                          policy_of.get("query_padded_rows", "zero"),
                          precision_of(policy_of), policy_of.get("causal_emptied_rows"))
    said = "; ".join([d.describe(b) for b, d in declared.items()]
                     + [kb.describe() for kb in known])
    broken = [c for c in policy if not c.passed]
    if broken:
        return out.classify("fail", f"{spec}; nor does it follow the declared policy "
                                    f"({said}): {'; '.join(c.describe() for c in broken)}")
    out.comparisons = policy
    out.policies_used = sorted(set(out.policies_used) | set(declared))
    checked = (f"checked: the affected rows follow it and every other row passes "
               f"(spec: {failed[0].describe()})")
    if known:  # a library bug, found before and checked again: a known failure
        out.known_used = sorted(set(out.known_used) | {kb.name for kb in known})
        return out.classify("known_failure", f"{said}; {checked}")
    return out.classify("deviation", f"declared {said}; {checked}")


def _with_weights(impl: Implementation, p: Problem) -> bool:
    """Whether ``impl`` is asked for (and judged on) the attention weights of ``p``: where it
    declares them, but not for a generating module's chunks (each chunk's would cover its
    cache)."""
    return "weights" in declared(impl, "features") and p.steps is None


def _reaching(impl: Implementation, p: Problem, out: Outcome, known: List[KnownBehaviour],
              with_weights: bool) -> List[KnownBehaviour]:
    """``known`` less the behaviours of one kernel that ``impl``'s call on ``p`` does not
    reach as the behaviour needs (the call run again, its run traced; a call that cannot be
    traced reaches none)."""
    if not any(kb.kernel for kb in known):
        return known
    try:
        calls = kernel_calls(array_library(impl), lambda: call(
            impl, p, out.device, out.dtype, need_weights=with_weights))
    except Exception:
        calls = None
    return [kb for kb in known if kb.reached(calls)]


def implementation_isa(impl: Implementation, device: str) -> Optional[str]:
    """The instruction-set level ``impl`` runs at on ``device`` (None when not pinned, or
    when a plugin's own ``isa`` hook raises: the level is a fact, not a verdict)."""
    try:
        level = impl.isa(device) if hasattr(impl, "isa") else None
    except Exception:
        return None
    return str(level) if level else None


def run_problem(impl: Implementation, out: Outcome, p: Problem, *,
                distinct_kv: bool = False) -> Outcome:
    """Run problem ``p`` on ``impl``, compare with the oracle and fill in ``out``;
    ``distinct_kv``: the problem is about key != value (unsupported with one kv source)."""
    try:
        p = expressible(impl, p, distinct_kv=distinct_kv)  # the oracle judges what ran
    except Unsupported as exc:
        return out.classify("unsupported", str(exc))
    with_weights = _with_weights(impl, p)
    results, refused = attempt(impl, [p], out.device, out.dtype, need_weights=with_weights,
                               posed=True)
    if refused:
        return out.classify(*refused)
    return judge(impl, out, p, results[0])


def run_case(impl: Implementation, name: str, device: str, dtype: str, case: Any) -> Outcome:
    """Run ``case`` (a ``suite.conformance.cases.Case``, of any family) on ``impl`` and classify it."""
    return case.run(impl, Outcome(name, device, dtype, case.family, case.name, case.seed, "pass"))


def merge_repeats(runs: Sequence[Outcome]) -> Outcome:
    """One outcome for repeated runs of a case: theirs when all agree, else ``flaky`` with each."""
    first = runs[0]
    kinds = [o.outcome for o in runs]
    if len(set(kinds)) == 1:
        return first
    worst = next((o for o in runs if o.outcome in FAILED), first)
    merged = dataclasses.replace(worst, outcome="flaky")
    listed = "; ".join(f"run {i + 1}: {o.outcome}" + (f" ({o.reason})" if o.reason and
                                                       o.outcome != "pass" else "")
                       for i, o in enumerate(runs))
    merged.reason = f"outcome changed between {len(runs)} runs: {listed}"
    return merged


def _first_bad_step(p: Problem, row_err: np.ndarray, bound: float) -> str:
    """The first chunk of ``p.steps`` with a row (of any batch) off by more than ``bound``
    (NaN counts as off), and its rows; the steps before it were right."""
    start = 0
    for i, n in enumerate(p.steps):
        err = row_err[start:start + n]
        if not (np.nan_to_num(err, nan=np.inf) <= bound).all():
            what = "the prefill" if i == 0 and n > 1 else f"step {i + 1} of {len(p.steps)}"
            return (f"; first wrong at {what} (rows {start}..{start + n - 1}; "
                    f"{'the chunks before it right' if i else 'the first chunk'})")
        start += n
    return ""


def _where(failed: List[Comparison], res: Result, p: Problem, out: Outcome) -> str:
    """Where the failing comparisons with the spec went wrong: the worst output entry, and
    the bad rows of each comparison by kind (suite.spec.diagnose), which also go in
    ``out.bad_rows``."""
    text = ""
    ref, ref_w = oracle.oracle(p)
    got = np.asarray(res.output, dtype=np.float64)
    if failed[0].what == "output" and got.shape == ref.shape:
        diff = np.where(np.isfinite(got), np.abs(got - ref), np.inf)
        b, l, e = np.unravel_index(int(np.argmax(diff)), diff.shape)
        text = f"; worst at (b={b}, l={l}, e={e}): got {got[b, l, e]:.6g}, expected {ref[b, l, e]:.6g}"
        if p.steps is not None:  # which chunk of the generation went wrong first
            text += _first_bad_step(p, np.abs(got - ref).max(axis=(0, 2)), failed[0].bound)
    allowed, bad_kv = _allowed(p), _nonfinite_kv(p)
    bad_q = _nonfinite_query_rows(p)[..., 0]
    found = {}
    for c in failed:
        if c.what == "output":
            rows = diagnose.row_context(allowed, bad_kv, bad_q, heads=False)
            found[c.what] = diagnose.classify(got, ref, c.bound, rows)
        elif c.what == "weights" and res.attn_weights is not None:
            got_w, want_w = _nan_weight_rows(np.asarray(res.attn_weights, np.float64), ref_w,
                                             np.zeros(ref_w.shape[:-1] + (1,), bool))
            rows = diagnose.row_context(allowed, bad_kv, bad_q, heads=True)
            found[c.what] = diagnose.classify(got_w, want_w, c.bound, rows)
    out.bad_rows = {k: v for k, v in found.items() if v} or None
    said = [diagnose.describe(k, v) for k, v in (out.bad_rows or {}).items()]
    return text + "".join(f"; {s}" for s in said if s)


# --- how far two results of one implementation may differ (the properties, the packed
# family's packed-vs-padded agreement) ---------------------------------------------------
# The declarable departures from the plain algorithm in one dtype (the behaviour -> the dtype
# it is about): how float32 products take their operands, the dtype a float64 softmax runs in.
PRECISION_POLICIES = {"float32_dots": "float32", "float64_softmax": "float64"}


def precision_behaviour(dtype: str) -> Optional[str]:
    """The precision behaviour a run in ``dtype`` shows (``PRECISION_POLICIES``), or None."""
    return next((b for b, d in PRECISION_POLICIES.items() if d == dtype), None)


def precision_of(policy_of: Dict[str, str]) -> Optional[str]:
    """The oracle's ``dots`` (``suite.spec.oracle.DOTS``) for the declared policies in
    ``policy_of`` (behaviour -> policy): "tf32" for float32_dots=tf32, "softmax32" for
    float64_softmax=float32, None for neither."""
    if policy_of.get("float32_dots") == "tf32":
        return "tf32"
    if policy_of.get("float64_softmax") == "float32":
        return "softmax32"
    return None


def dots_policy(impl: Implementation, out: Outcome, p: Problem) -> Optional[Deviation]:
    """The precision policy ``impl`` declares where this run is (float32_dots in float32,
    float64_softmax in float64; None: the plain algorithm)."""
    behaviour = precision_behaviour(out.dtype)
    if behaviour is None:
        return None
    isa = implementation_isa(impl, out.device)
    d = deviations_for(impl, out.dtype, out.device, isa).get(behaviour)
    return d if d is not None and d.where.holds_for(p, out.dtype, isa) else None


def slack(impl: Implementation, p: Problem, dtype: str, dots: Optional[str] = None) -> float:
    """Two results each within the rule's bound of the oracle differ by at most twice it."""
    if not declared(impl, "projection_bias"):  # the bound of the problem it was given
        p = without_projection_biases(p)
    with oracle.pinned(p):  # (the oracle's code only)
        ref, _ = oracle.oracle(p)
        baselines = oracle.baselines(p, dtype, dots=dots)
    c = compare("oracle", ref, ref, [b[0] for b in baselines], dtype)
    return 2 * c.bound


def slack_for(impl: Implementation, out: Outcome, p: Problem) -> float:
    """How far two of ``impl``'s results for ``p`` may differ in this run's dtype and place
    (twice the rule's bound, with the float32 dots policy it declares there)."""
    dots = dots_policy(impl, out, p)
    return slack(impl, p, out.dtype,
                 dots and precision_of({precision_behaviour(out.dtype): dots.policy}))


def forms_agree(impl: Implementation, out: Outcome, p: Problem, other: Problem,
                parts: Sequence[Tuple[Any, Any, str]], what: str) -> Outcome:
    """One module on one problem in two forms (packed and padded, paged and contiguous,
    steps and one call): run ``p`` and ``other``, compare ``parts`` (index into ``p``'s
    output, index into ``other``'s, a label naming the part), and fail on the worst part
    where two results within the rule's bound could not differ so much (twice the bound of
    either form; NaN fails)."""
    res, refused = attempt(impl, [p, other], out.device, out.dtype)
    if refused:
        return out.classify(*refused)
    errs = [max_abs_err(res[0].output[a], res[1].output[b]) for a, b, _ in parts]
    worst = int(np.argmax(errs))  # the first NaN, if any
    bound = max(slack_for(impl, out, q) for q in (p, other))
    if not errs[worst] <= bound:
        out.classify("fail", f"{what}: max abs {errs[worst]:.3g} > {bound:.3g} "
                             f"({parts[worst][2]})")
    return out
