"""The results files, written and read here only (no pandas).

Two kinds, with the same run facts under the same names (pytest-benchmark's own):
``machine_info`` (pytest-benchmark's, extended with ``machine_info["mha_suite"]``
through its ``pytest_benchmark_update_machine_info`` hook), ``commit_info`` and
``datetime``.

* sweep: pytest-benchmark JSON; each point's ``extra_info`` holds the mha-suite point
  (impl, device, dtype, B, H, ..., status); points that could not be measured are in
  ``mha_suite_not_measured``.
* conformance: ``{"kind": "mha-suite/conformance", "version": 2, ..., "implementations":
  [...], "results": [...]}``; the result dicts are written as given.

Writing merges under a file lock (``<file>.lock``): the file is read, this run's
entries replace those with the same key, the rest are kept, and the whole is written
to a temporary file in the same directory and renamed over the old one. A file that
holds points is never truncated, a killed writer leaves the previous complete file,
and two runs writing one file at once both keep every point they finished.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Union

from filelock import FileLock, Timeout

from suite.sweep.point import normalise, point_key

PathLike = Union[str, Path]
CONFORMANCE_KIND = "mha-suite/conformance"
CONFORMANCE_VERSION = 2
SWEEP_FORMAT = 1  # mha-suite's sweep layout (``mha_suite_format``); pytest-benchmark's is "version"
LOCK_TIMEOUT_S = 120.0  # a merge holds the lock for milliseconds; this is a stuck writer


# A run rewrites its results file as it goes, at most every SAVE_EVERY_S seconds and at most
# SAVE_SHARE of its time: a save rewrites every record (a 1,600-case conformance run's took
# 0.6 s; a 408-point sweep saving after every point spent 31.6 of its 227 s saving), so a
# fixed period, or a save per point, made saving a large share of a long run. Ctrl-C, SIGTERM
# and the run's end save everything; a SIGKILL loses at most one period.
SAVE_EVERY_S = 5.0
SAVE_SHARE = 0.05


class SavePeriod:
    """When a run next saves its results file: the first finished record at once, then after
    ``SAVE_EVERY_S`` seconds or the last save's duration / ``SAVE_SHARE``, whichever is longer."""

    def __init__(self) -> None:
        self.last = -float("inf")
        self.every = SAVE_EVERY_S

    def due(self) -> bool:
        return time.monotonic() - self.last > self.every

    def saved(self, started: float) -> None:
        """A save that began at ``started`` (``time.monotonic()``) has just ended."""
        self.last = time.monotonic()
        self.every = max(SAVE_EVERY_S, (self.last - started) / SAVE_SHARE)


class ResultsError(ValueError):
    """A file that is not (or cannot become) an mha-suite results file; one sentence."""


class OtherMachine(ResultsError):
    """A sweep file that holds another machine's points (merging would misattribute them)."""


class Document(NamedTuple):
    """One results file: its path, kind ("sweep" | "conformance") and parsed JSON."""

    path: Path
    kind: str
    doc: Dict[str, Any]


# --- run facts -------------------------------------------------------------------------------
def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def machine_extension() -> Dict[str, Any]:
    """What mha-suite adds to pytest-benchmark's machine_info, under ``mha_suite``."""
    from suite.sweep.timing import machine_facts

    return machine_facts()


def run_info(config: Any) -> Dict[str, Any]:
    """``machine_info`` and ``commit_info`` of this pytest session, from pytest-benchmark's
    hooks (its generators, then every ``pytest_benchmark_update_*`` implementation);
    computed once per session."""
    import pytest

    key = _RUN_INFO.setdefault("key", pytest.StashKey[Dict[str, Any]]())
    if key not in config.stash:
        hook = config.hook
        machine = hook.pytest_benchmark_generate_machine_info(config=config)
        hook.pytest_benchmark_update_machine_info(config=config, machine_info=machine)
        commit = hook.pytest_benchmark_generate_commit_info(config=config)
        hook.pytest_benchmark_update_commit_info(config=config, commit_info=commit)
        config.stash[key] = {"machine_info": machine, "commit_info": commit}
    return config.stash[key]


_RUN_INFO: Dict[str, Any] = {}


# --- writing ---------------------------------------------------------------------------------
def os_reason(exc: BaseException) -> str:
    """Why a write failed, in a few words: 'No space left on device', 'File too large'."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def target(path: PathLike) -> Path:
    """``path``, or the file a symbolic link at ``path`` points to: a results file reached
    through a link is written where the link points, and the link stays a link."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def write_atomic(path: PathLike, text: str) -> Path:
    """Write ``text`` to a unique temporary file beside ``path``, then rename it over ``path``:
    a reader (or a killed writer) sees the old file or the new one, never half of one.
    A symbolic link is written through (its target is replaced, the link kept)."""
    path = target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent,
                                     prefix=f".{path.name}.", suffix=".tmp", delete=False) as f:
        tmp = Path(f.name)
        try:
            f.write(text)
            f.flush()
            os.chmod(f.name, mode)  # as an ordinary file, not the temporary file's 0600
            os.fsync(f.fileno())
        except BaseException:
            try:
                f.close()  # flushes what is buffered: on a full disk that fails again
            except OSError:
                pass
            tmp.unlink(missing_ok=True)
            raise
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _merge(path: PathLike, kind: str, update: Callable[[Optional[Dict[str, Any]]], Dict[str, Any]]
           ) -> Dict[str, Any]:
    """Under the file's lock: read it (None when absent), ``update`` it, write it atomically."""
    path = target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
            old = read_file(path, kind) if path.exists() else None
            doc = update(old.doc if old else None)
            write_atomic(path, dumps(doc))
            return doc
    except Timeout:
        raise ResultsError(f"{path}: another process has held its lock ({path}.lock) for "
                           f"{LOCK_TIMEOUT_S:.0f} s; nothing was written") from None


# A results document's lists of entries (one per case or point): written one entry a line.
ROW_LISTS = ("results", "benchmarks", "mha_suite_not_measured")


def dumps(doc: Dict[str, Any]) -> str:
    """The JSON text of a results document: its run facts indented (``indent=1``), its lists
    of entries (``ROW_LISTS``) one compact entry a line. The same JSON value as
    ``json.dumps(doc, indent=1)``, written by the C encoder (which takes no indent) for the
    entries, the bulk of a file: a run saving thousands of records every few seconds spent
    a sixth of its time in the pure-Python indenting encoder (docs/measured/profile.md)."""
    def value(key: str, v: Any) -> str:
        if key in ROW_LISTS and isinstance(v, list) and v:
            return "[\n" + ",\n".join("  " + json.dumps(e, default=str) for e in v) + "\n ]"
        # (a JSON string holds no raw newline: every line break is the encoder's own)
        return json.dumps(v, indent=1, default=str).replace("\n", "\n ")

    if not isinstance(doc, dict) or not doc:
        return json.dumps(doc, indent=1, default=str)
    return "{\n" + ",\n".join(f" {json.dumps(str(k))}: {value(k, v)}"
                               for k, v in doc.items()) + "\n}"


def _keyed(entries: Iterable[dict], key: Callable[[dict], Any]) -> Dict[Any, dict]:
    return {key(e): e for e in entries}


def merge_sweep(path: PathLike, run: Dict[str, Any], points: List[dict],
                not_measured: List[dict], preset: Optional[str] = None) -> Dict[str, Any]:
    """Merge this run's finished ``points`` (pytest-benchmark benchmark dicts) and
    ``not_measured`` entries into the sweep file at ``path``.

    Per point key: a measured point beats a not-measured entry (a failed re-run never
    removes a measurement), and this run's entry beats the file's of the same status.
    """
    def update(old: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        if old and machine_of(old) != machine_of(run):
            raise OtherMachine(f"{path} holds points of machine {machine_of(old)[0]}")
        old = old or {}
        measured = _keyed(old.get("benchmarks", []), lambda b: point_key(b["extra_info"]))
        measured.update(_keyed(points, lambda b: point_key(b["extra_info"])))
        failed = _keyed(old.get("mha_suite_not_measured", []), point_key)
        failed.update(_keyed(not_measured, point_key))
        for key in measured:
            failed.pop(key, None)
        from pytest_benchmark import __version__

        return {"machine_info": run["machine_info"], "commit_info": run["commit_info"],
                "mha_suite_format": SWEEP_FORMAT,
                "benchmarks": list(measured.values()), "datetime": now(),
                "version": __version__, "mha_suite_preset": preset or old.get("mha_suite_preset"),
                "mha_suite_not_measured": list(failed.values())}

    return _merge(path, "sweep", update)


def machine_of(doc: Dict[str, Any]) -> tuple:
    """(node, CPU model) of a results file's or a run's ``machine_info``: which machine."""
    info = doc.get("machine_info") or {}
    return (info.get("node") or "unknown", (info.get("mha_suite") or {}).get("cpu_model")
            or (info.get("cpu") or {}).get("brand_raw") or "")


def machine_path(path: PathLike, run: Dict[str, Any]) -> Path:
    """The file this machine keeps beside ``path`` when ``path`` holds another machine's
    points: ``<stem>@<node>.json``."""
    path = Path(path)
    node = re.sub(r"[^A-Za-z0-9._-]+", "_", machine_of(run)[0])
    return path.with_name(f"{path.stem}@{node}{path.suffix}")


def save_sweep(path: PathLike, run: Dict[str, Any], points: List[dict],
               not_measured: List[dict], preset: Optional[str] = None) -> Path:
    """``merge_sweep`` into ``path``, or, when ``path`` holds another machine's points (two
    machines sweeping into one shared folder), into this machine's own file beside it: a
    point is never attributed to another machine. The path written."""
    try:
        merge_sweep(path, run, points, not_measured, preset)
        return Path(path)
    except OtherMachine:
        own = machine_path(path, run)
        merge_sweep(own, run, points, not_measured, preset)
        return own


def _result_key(r: dict) -> Any:
    test_id = r.get("test_id")
    # one record per case and instruction-set level (suite.plugins.isa): each level is its own verdict
    return ("test_id", r.get("impl"), r.get("device"), r.get("dtype"), test_id,
            r.get("isa")) if test_id \
        else ("record", json.dumps(r, sort_keys=True, default=str))


def merge_conformance(path: PathLike, run: Dict[str, Any], implementations: List[dict],
                      results: Iterable[dict]) -> Dict[str, Any]:
    """Merge this run's conformance ``results`` (written as given) into ``path``: a case
    this run recorded replaces the file's record of it, the file's other cases stay."""
    results = list(results)

    def update(old: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        old = old or {}
        kept = _keyed(old.get("results", []), _result_key)
        kept.update(_keyed(results, _result_key))
        impls = _keyed(old.get("implementations", []), lambda i: i.get("name"))
        for i in implementations:
            # A run where it could not run (say, another KERAS_BACKEND) keeps the description
            # of the run that measured it.
            if not i.get("available") and impls.get(i.get("name"), {}).get("available"):
                continue
            # nor does one that did not run it (its cached description) replace a run's
            if i.get("checked") is False and i.get("name") in impls:
                continue
            impls[i.get("name")] = i
        return {"kind": CONFORMANCE_KIND, "version": CONFORMANCE_VERSION, "datetime": now(),
                "machine_info": run["machine_info"], "commit_info": run["commit_info"],
                "implementations": list(impls.values()), "results": list(kept.values())}

    return _merge(path, "conformance", update)


# --- checking output paths before any work ---------------------------------------------------
def check_writable(path: PathLike, argument: str, kind: Optional[str] = None) -> None:
    """Raise ResultsError (naming ``argument``) unless ``path`` can be written: its directory
    can be created and written, ``path`` is not a directory, and an existing file of ``kind``
    is one mha-suite can merge into (never overwritten when it is something else)."""
    path = Path(path)
    if path.is_dir():
        raise ResultsError(f"{argument}: expected a file path, got the directory {path}")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ResultsError(f"{argument}: expected a writable directory, got {parent} "
                           f"({reason})") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise ResultsError(f"{argument}: expected a writable file, got {path} (read-only)")
    if kind is not None and path.exists():
        read_file(path, kind, argument=argument)


# --- reading ---------------------------------------------------------------------------------
def files(paths: Iterable[PathLike]) -> List[Path]:
    """The JSON files named by ``paths`` (files, or directories searched recursively).

    A missing path is a FileNotFoundError; a directory without results a ResultsError.
    """
    out: List[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.rglob("*.json"))
            if not found:
                raise ResultsError(f"results: {p} holds no mha-suite results files (*.json)")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"results: {p} does not exist")
    return out


def _fail(where: str, what: str) -> None:
    raise ResultsError(f"{where}: {what}")


def _check_sweep(where: str, doc: Dict[str, Any]) -> None:
    version = doc.get("mha_suite_format", SWEEP_FORMAT)
    if version != SWEEP_FORMAT:
        _fail(where, f"sweep format version {version!r}: expected {SWEEP_FORMAT} (written by "
                     "a newer mha-suite? upgrade to read it)")
    if not isinstance(doc.get("benchmarks"), list):
        _fail(where, f"benchmarks: expected a list of points, got "
                     f"{type(doc.get('benchmarks')).__name__}")
    info = doc.get("machine_info")
    if not isinstance(info, dict) or not isinstance(info.get("mha_suite"), dict):
        _fail(where, "a pytest-benchmark file not written by mha-suite (machine_info has no "
                     "mha_suite facts); expected an mha-suite sweep file")
    for i, b in enumerate(doc["benchmarks"]):
        if not (isinstance(b, dict) and isinstance(b.get("stats"), dict)
                and isinstance(b.get("extra_info"), dict) and "impl" in b["extra_info"]):
            _fail(where, f"benchmarks[{i}]: expected a point with stats and an mha-suite "
                         "extra_info (impl, device, ...)")
    for i, x in enumerate(doc.get("mha_suite_not_measured") or []):
        if not (isinstance(x, dict) and "impl" in x):
            _fail(where, f"mha_suite_not_measured[{i}]: expected a point with impl, device, ...")


def _check_conformance(where: str, doc: Dict[str, Any]) -> None:
    version = doc.get("version", 1)
    if version not in (1, CONFORMANCE_VERSION):
        _fail(where, f"conformance format version {version!r}: expected 1 to "
                     f"{CONFORMANCE_VERSION} (written by a newer mha-suite? upgrade to read it)")
    for field in ("results", "implementations"):
        value = doc.get(field, [])
        if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
            _fail(where, f"{field}: expected a list of objects")
    if doc.get("version", 1) == 1 and "machine_info" not in doc:  # written before version 2
        m = doc.get("machine") or {}
        doc["machine_info"] = {"node": m.get("node"), "system": m.get("system"),
                               "python_version": m.get("python"),
                               "mha_suite": {"cpu_model": m.get("cpu_model"),
                                             "libraries": m.get("libraries")}}
        doc["commit_info"] = {"id": doc.get("commit")}
        doc["datetime"] = doc.get("created")


def kind_of(doc: Any) -> Optional[str]:
    if isinstance(doc, dict) and doc.get("kind") == CONFORMANCE_KIND:
        return "conformance"
    if isinstance(doc, dict) and "benchmarks" in doc:
        return "sweep"
    return None


def read_file(path: PathLike, expected: Optional[str] = None, argument: str = "results"
              ) -> Document:
    """Parse and check one results file; anything else is a ResultsError naming it."""
    path = Path(path)
    where = f"{argument}: {path}" if argument != "results" else f"results: {path}"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{where} is not valid JSON ({exc.msg}, line {exc.lineno}); expected "
                           "an mha-suite results file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{where} cannot be read ({exc}); expected an mha-suite "
                           "results file") from None
    kind = kind_of(doc)
    if kind is None:
        _fail(where, "not an mha-suite results file (expected a sweep, i.e. pytest-benchmark "
                     "JSON from mha-suite sweep, or a conformance file from mha-suite check)")
    (_check_sweep if kind == "sweep" else _check_conformance)(where, doc)
    if expected is not None and kind != expected:
        _fail(where, f"expected a {expected} results file, got a {kind} file; not overwriting it")
    return Document(path, kind, doc)


def read(paths: Iterable[PathLike]) -> List[Document]:
    """Every results file named by ``paths``; any other file is a ResultsError."""
    return [read_file(path) for path in files(paths)]


def measured_keys(path: PathLike) -> set:
    """Keys of the points measured in the sweep file at ``path`` (for --resume)."""
    if not Path(path).exists():
        return set()
    return {point_key(b["extra_info"]) for b in read_file(path, "sweep").doc["benchmarks"]}


# --- facts for readers -----------------------------------------------------------------------
def run_facts(d: Document) -> Dict[str, Any]:
    """The run facts of either kind, by one set of names."""
    info = d.doc.get("machine_info") or {}
    extra = info.get("mha_suite") or {}
    commit = d.doc.get("commit_info") or {}
    return {"node": info.get("node") or "unknown",
            "cpu": extra.get("cpu_model") or (info.get("cpu") or {}).get("brand_raw") or "",
            "system": " ".join(filter(None, [info.get("system"), info.get("release")])),
            "python": info.get("python_version"), "extra": extra,
            "commit": commit.get("id"), "dirty": commit.get("dirty"),
            "datetime": d.doc.get("datetime")}


def machine_ids(docs: List[Document]) -> Dict[Path, str]:
    """Per file, the machine's name: its node name, suffixed when two CPUs share one."""
    by_node: Dict[str, List[str]] = {}
    for d in docs:
        f = run_facts(d)
        cpus = by_node.setdefault(f["node"], [])
        if f["cpu"] not in cpus:
            cpus.append(f["cpu"])
    out = {}
    for d in docs:
        f = run_facts(d)
        i = by_node[f["node"]].index(f["cpu"])
        out[d.path] = f["node"] if i == 0 else f"{f['node']}#{i + 1}"
    return out


STATS = {"median_s": "median", "min_s": "min", "mean_s": "mean", "stddev_s": "stddev",
         "iqr_s": "iqr", "q1_s": "q1", "q3_s": "q3", "rounds": "rounds"}


def sweep_rows(d: Document) -> List[dict]:
    """One dict per point of a sweep file, measured (its stats as ``*_s``) or not."""
    rows = []
    for b in d.doc["benchmarks"]:
        row = normalise(b["extra_info"])
        row.update({col: b["stats"].get(key) for col, key in STATS.items()})
        row["status"] = row.get("status") or "ok"
        rows.append(row)
    for x in d.doc.get("mha_suite_not_measured") or []:
        rows.append({**normalise(x), "status": x.get("status") or "error"})
    return rows


def conformance_rows(d: Document) -> List[dict]:
    """One dict per conformance result, with its implementation's framework and version."""
    impls = {i.get("name"): i for i in d.doc.get("implementations") or []}
    return [{**r, "framework": (impls.get(r.get("impl")) or {}).get("framework"),
             "framework_version": (impls.get(r.get("impl")) or {}).get("framework_version")}
            for r in d.doc.get("results") or []]
