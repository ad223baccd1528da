"""The registry of MHA implementations: built-ins, entry points, ad hoc plugins.

Built-ins are dotted paths loaded on first use; installed packages register
through the entry-point group ``mha_suite.implementations``; ad hoc plugins come
from ``--plugin module:Class`` / ``--plugin path/to/file.py[:Class]`` or the
environment variable ``MHA_SUITE_PLUGINS`` (the same specs, comma separated).
A plugin that fails to import or construct stays listed, as unavailable, with
its error; the others run.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import types
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from suite.plugins import cache, probes
from suite.plugins.declarations import policy_text
from suite.plugins.interface import (
    Implementation,
    Unavailable,
    array_library,
    check_interface,
    declared,
)
from suite.results.environment import library_versions

ENTRY_POINT_GROUP = "mha_suite.implementations"
PLUGINS_ENV = "MHA_SUITE_PLUGINS"
# Built-in names a --plugin class may replace (comma separated; --replace-builtin sets it).
REPLACE_ENV = "MHA_SUITE_REPLACE_BUILTINS"
# ``--impl plugin:SPEC`` selects the names a --plugin spec registered (``plugin:*``: every
# --plugin spec's), never a built-in's that matches the same glob.
PLUGIN_PREFIX = "plugin:"

# name -> "module:Class" of the built-ins, with what to install when missing.
BUILTINS: Dict[str, str] = {
    "numpy": "implementations.numpy.mha:NumpyMHA",
    "numpy.flash": "implementations.numpy.flash:NumpyFlashMHA",
    "torch.eager": "implementations.torch.eager:TorchEager",
    "torch.sdpa": "implementations.torch.sdpa:TorchSDPA",
    "torch.sdpa[jagged]": "implementations.torch.sdpa:TorchSDPAJagged",
    "torch.nn": "implementations.torch.nn:TorchNN",
    "torch.nn[sdpa]": "implementations.torch.nn:TorchNNSDPA",
    "torch.nn[fast]": "implementations.torch.nn:TorchNNFast",
    "torch.F_mha": "implementations.torch.fmha:TorchFMHA",
    "torch.F_mha+weights": "implementations.torch.fmha:TorchFMHAWeights",
    "jax.jit": "implementations.jax.jit:JaxJit",
    "jax.nn": "implementations.jax.nn:JaxNN",
    "flax.mha": "implementations.jax.flax:FlaxMHA",
    "flax.mha+weights": "implementations.jax.flax:FlaxMHAWeights",
    "flax.linen[fp32_softmax]": "implementations.jax.flax:FlaxLinenFp32Softmax",
    "triton.flash": "implementations.kernels.triton_flash:TritonFlash",
    "pallas.gpu.flash": "implementations.kernels.pallas:PallasGpuFlash",
    "pallas.tpu.flash": "implementations.kernels.pallas:PallasTpuFlash",
    "pallas.tpu.splash": "implementations.kernels.pallas:PallasTpuSplash",
    "pallas.gpu.decode": "implementations.kernels.pallas:PallasGpuDecode",
    "pallas.tpu.paged": "implementations.kernels.pallas:PallasTpuPaged",
    "pallas.gpu.paged": "implementations.kernels.pallas:PallasGpuPaged",
    # runtimes: the ONNX Attention op (onnxruntime, onnx.reference)
    "onnxruntime.attention": "implementations.onnx.attention:OrtAttention",
    "onnxruntime.attention[mask]": "implementations.onnx.attention:OrtAttentionMask",
    "onnxruntime.attention[opset23]": "implementations.onnx.attention:OrtAttention23",
    "onnxruntime.attention[4d]": "implementations.onnx.attention:OrtAttention4d",
    "onnxruntime.attention[weight_inputs]":
        "implementations.onnx.attention:OrtAttentionWeightInputs",
    "onnx.reference.attention": "implementations.onnx.attention:RefAttention",
    "onnx.reference.attention[mask]": "implementations.onnx.attention:RefAttentionMask",
    "onnx.reference.attention[opset23]": "implementations.onnx.attention:RefAttention23",
    "onnx.reference.attention[softmax_fp32]":
        "implementations.onnx.attention:RefAttentionSoftmaxFp32",
    # runtimes: onnxruntime's contrib ops (com.microsoft)
    "onnxruntime.mha": "implementations.onnx.contrib:OrtMultiHeadAttention",
    "onnxruntime.mha[kpm2d]": "implementations.onnx.contrib:OrtMultiHeadAttentionKpm2d",
    "onnxruntime.mha[bias]": "implementations.onnx.contrib:OrtMultiHeadAttentionBias",
    "onnxruntime.gqa": "implementations.onnx.contrib:OrtGroupQueryAttention",
    "onnxruntime.gqa[bias]": "implementations.onnx.contrib:OrtGroupQueryAttentionBias",
    # runtimes: OpenVINO
    "openvino.sdpa": "implementations.openvino.sdpa:OpenVINOSDPA",
    "openvino.sdpa[mask]": "implementations.openvino.sdpa:OpenVINOSDPAMask",
    "openvino.sdpa[float_mask]": "implementations.openvino.sdpa:OpenVINOSDPAFloatMask",
    "openvino.convert[torch.nn]": "implementations.openvino.convert:ConvertTorchNN",
    "openvino.convert[torch.nn[sdpa]]": "implementations.openvino.convert:ConvertTorchNNSDPA",
    "openvino.convert[torch.sdpa]": "implementations.openvino.convert:ConvertTorchSDPA",
    "openvino.onnx": "implementations.openvino.onnx:OpenVINOOnnx",
    "openvino.onnx[opset23]": "implementations.openvino.onnx:OpenVINOOnnx23",
    # export paths: torch modules exported and run by a runtime
    "export.onnx[torch.nn]": "implementations.export.onnx_export:ExportOnnxTorchNN",
    "export.onnx[torch.nn[sdpa]]": "implementations.export.onnx_export:ExportOnnxTorchNNSDPA",
    "export.onnx[torch.sdpa]": "implementations.export.onnx_export:ExportOnnxTorchSDPA",
    "export.onnx-opset23[torch.sdpa]": "implementations.export.onnx_export:ExportOnnx23TorchSDPA",
    "export.onnx-ts[torch.nn]": "implementations.export.onnx_export:ExportOnnxTsTorchNN",
    "export.onnx-ts[torch.sdpa]": "implementations.export.onnx_export:ExportOnnxTsTorchSDPA",
    "export.executorch[torch.nn]": "implementations.export.executorch:ExportExecuTorchTorchNN",
    "export.executorch[torch.sdpa]": "implementations.export.executorch:ExportExecuTorchTorchSDPA",
}
# Modules that may register several names (variants known only at run time).
BUILTIN_FAMILIES: Dict[str, str] = {
    "torch.sdpa[*]": "implementations.torch.sdpa:backend_variants",
    "jax.nn[*]": "implementations.jax.nn:backend_variants",
    "torch.compile*": "implementations.torch.compiled:variants",
    "hf.*": "implementations.hf.transformers:variants",
    # One Keras backend per process (KERAS_BACKEND); the others are listed as unavailable.
    "keras.mha*": "implementations.keras.mha:variants",
    # export paths of Hugging Face models (implementations/export/onnx_export.py)
    "export.onnx[hf.model.*]": "implementations.export.onnx_export:hf_model_variants",
}
INSTALL_HINTS = {
    "torch": "pip install 'mha-suite[torch]'",
    "jax": "pip install 'mha-suite[jax]'",
    "transformers": "pip install 'mha-suite[hf]'",
    "keras": "pip install 'mha-suite[keras]'",
    "flax": "pip install 'mha-suite[flax]'",
    "triton": "pip install 'mha-suite[triton]'",
    "onnx": "pip install 'mha-suite[onnx]'",
    "onnxruntime": "pip install 'mha-suite[onnx]'",
    "openvino": "pip install 'mha-suite[openvino]'",
}


DESCRIPTIONS_CACHE = "builtins"  # suite.plugins.cache name of the built-ins' descriptions
# Environment variables that decide which built-ins can run in a process, and in what (Keras
# binds one backend per process; JAX's 64-bit mode, process-wide, gives jax.nn float64): the
# descriptions are cached per value, the probes are not affected.
DESCRIPTIONS_ENV = ("KERAS_BACKEND", "JAX_ENABLE_X64")


def descriptions_cache_name(env: Optional[Mapping[str, str]] = None) -> str:
    """``DESCRIPTIONS_CACHE``, suffixed with each variable of ``DESCRIPTIONS_ENV`` that is set
    to something other than off (``JAX_ENABLE_X64=0`` is the default's cache, not a new one
    that describes every built-in again)."""
    env = os.environ if env is None else env
    return "-".join([DESCRIPTIONS_CACHE, *(f"{v}={env[v]}" for v in DESCRIPTIONS_ENV
                                           if env.get(v, "").lower() not in ("", "0", "false"))])


class UnknownImplementation(LookupError):
    """A name or pattern that matches no registered implementation."""


class PluginError(ValueError):
    """A --plugin spec that cannot be loaded (missing file, bad module, not a class)."""


@dataclasses.dataclass(frozen=True)
class Description:
    """What ``mha-suite list`` shows of an available implementation (JSON-friendly)."""

    framework: str
    framework_version: str
    devices: List[str]
    dtypes: Dict[str, List[str]]  # device -> dtypes
    features: List[str]
    deviations: Dict[str, str]  # behaviour -> declared policy
    array_library: str = ""  # what it computes with, when not its framework
    kv_source: str = "separate"

    @classmethod
    def of(cls, impl: Implementation) -> Description:
        devices = list(impl.devices())
        arrays = array_library(impl)
        return cls(impl.framework, impl.framework_version(), devices,
                   {d: list(impl.dtypes(d)) for d in devices}, sorted(impl.features),
                   {b: policy_text(d) for b, d in impl.deviations.items()},
                   "" if arrays == impl.framework else arrays,
                   declared(impl, "kv_source"))


class Entry:
    """One registered name: its instance when usable, else why not.

    A built-in described from the cache is loaded (its framework imported, the class
    constructed) on the first access to ``impl`` or ``available``; ``description`` and
    ``error`` never load it.
    """

    def __init__(self, name: str, source: str, impl: Optional[Implementation] = None,
                 error: Optional[str] = None, *,
                 loader: Optional[Callable[[], Implementation]] = None,
                 description: Optional[Description] = None) -> None:
        self.name, self.source, self.error = name, source, error
        self._impl, self._loader, self._description = impl, loader, description

    @property
    def impl(self) -> Optional[Implementation]:
        if self._loader is not None:
            loader, self._loader = self._loader, None
            try:
                self._impl = loader()
            except Exception as exc:  # a plugin that fails to load is listed, not fatal
                self._impl, self._description, self.error = None, None, _describe(exc)
        return self._impl

    @property
    def available(self) -> bool:
        return self.impl is not None

    def loaded_from_cache(self) -> bool:
        """Described from the cache and not loaded yet (its framework not imported)."""
        return self._loader is not None

    @property
    def description(self) -> Optional[Description]:
        """The cached description, else the loaded instance's; None when unavailable."""
        if self._description is None and self._loader is None and self._impl is not None:
            self._description = Description.of(self._impl)
        return self._description

    def __repr__(self) -> str:
        state = "not loaded" if self._loader else ("available" if self._impl else self.error)
        return f"Entry({self.name!r}, {self.source!r}, {state})"


def _describe(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        root = exc.name.split(".")[0]
        if root in INSTALL_HINTS:
            return f"{root} is not installed ({INSTALL_HINTS[root]})"
        return f"module {exc.name} not found"
    return f"{type(exc).__name__}: {first}" if not isinstance(exc, Unavailable) else first


def _spec_target(spec: str) -> str:
    """The file (resolved) or module a --plugin spec loads, without its ``:Class``."""
    target = spec.partition(":")[0] if not _is_windows_drive(spec) else spec
    if target.endswith(".py") or os.sep in target or "/" in target:
        return str(Path(target).resolve())
    return target


def _load_object(spec: str) -> object:
    """Load ``module:attr`` or ``path/to/file.py[:attr]``; attr may be omitted for files."""
    target, _, attr = spec.partition(":") if not _is_windows_drive(spec) else (spec, "", "")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise PluginError(f"--plugin {spec}: file {target} does not exist")
        mod_name = f"mha_suite_plugin_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        if module_spec is None or module_spec.loader is None:
            raise PluginError(f"--plugin {spec}: {target} is not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise PluginError(
                f"--plugin {spec}: importing {target} failed: {_describe(exc)}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise PluginError(f"--plugin {spec}: module {target} not found ({exc.name})") from exc
        except Exception as exc:
            raise PluginError(
                f"--plugin {spec}: importing {target} failed: {_describe(exc)}") from exc
    if not attr:
        return module
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"--plugin {spec}: {target} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _is_windows_drive(spec: str) -> bool:
    return len(spec) > 2 and spec[1] == ":" and spec[2] in "\\/"


def _classes_in(obj: object) -> List[type]:
    """Plugin classes named by a loaded object: a class, a list of them, or a module."""
    if isinstance(obj, type):
        return [obj]
    if isinstance(obj, types.ModuleType):
        # Classes that name themselves: a helper base inheriting a built-in's name (say
        # a subclass of NumpyMHA with no name of its own) must not replace that built-in.
        found = [v for v in vars(obj).values()
                 if isinstance(v, type) and v.__module__ == obj.__name__
                 and vars(v).get("name") and callable(getattr(v, "run", None))]
        return found
    if callable(obj):  # a factory returning classes (variants known at run time)
        return list(obj())
    if isinstance(obj, Iterable):
        return list(obj)
    raise PluginError(f"expected a class, a module or a list of classes, got {type(obj).__name__}")


_FAMILIES: Dict[str, List[type]] = {}


def _family(spec: str) -> List[type]:
    """The classes a family function returns, called once per process."""
    if spec not in _FAMILIES:
        _FAMILIES[spec] = _classes_in(_load_object(spec))
    return _FAMILIES[spec]


def _load_builtin(spec: str, name: str) -> Implementation:
    """Import and construct one built-in described from the cache."""
    classes = _family(spec) if spec in BUILTIN_FAMILIES.values() else [_load_object(spec)]
    for cls in classes:
        if getattr(cls, "name", None) == name:
            check_interface(cls)
            outside = outside_declared_range(getattr(cls, "framework", ""))
            if outside:  # an older library would fail in the cases, read as its failures
                raise Unavailable(f"{name}: {outside}")
            return cls()
    raise Unavailable(f"{spec} no longer provides {name!r}")


@functools.cache
def outside_declared_range(framework: str) -> Optional[str]:
    """Why the installed release of ``framework``'s library lies outside the range
    mha-suite's extras declare for it (its own installed metadata), or None: inside, not
    installed, or no range declared. A built-in outside its range is unavailable with this
    line rather than run against a release it was never written for."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    from suite.results.environment import distribution_of

    dist = distribution_of(framework) if framework else None
    if dist is None:
        return None
    try:
        installed = Version(metadata.version(dist))
        requires = metadata.requires("mha-suite") or []
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None
    for line in requires:
        req = Requirement(line)
        if canonicalize_name(req.name) == canonicalize_name(dist) and req.specifier \
                and not req.specifier.contains(installed, prereleases=True):
            extra = next((m.group(1) for m in re.finditer(r'extra == "([^"]+)"', line)), None)
            hint = f" (pip install 'mha-suite[{extra}]')" if extra else ""
            return f"{dist} {installed} is installed; mha-suite declares {dist}{req.specifier}{hint}"
    return None


def _plugin_file(spec: str) -> Optional[Path]:
    """The file of a ``path/to/file.py[:attr]`` spec (None for a ``module:attr`` spec)."""
    target = spec.partition(":")[0] if not _is_windows_drive(spec) else spec  # as _load_object
    if not (target.endswith(".py") or os.sep in target or "/" in target):
        return None
    path = Path(target)
    return path if path.is_file() else None


def _file_digest(spec: str) -> Optional[str]:
    path = _plugin_file(spec)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else None


def _plugin_cache_name(spec: str) -> Optional[str]:
    """The ``suite.plugins.cache`` name of a plugin file's descriptions (None: not a file spec).
    Keyed like the built-ins' (library versions, the suite's sources, the environment
    variables that choose a backend) and by the file's path; its content is checked on
    reading, so an edited plugin is probed again."""
    path = _plugin_file(spec)
    if path is None:
        return None
    attr = spec.partition(":")[2] if not _is_windows_drive(spec) else ""
    where = hashlib.sha256(f"{path.resolve()}:{attr}".encode()).hexdigest()
    return f"plugin-{where[:16]}-{descriptions_cache_name()}"


def _cached_plugin(cache_name: str, spec: str) -> Optional[List[Dict[str, Any]]]:
    """The cached records of plugin file ``spec`` when its content is unchanged, else None."""
    cached = cache.load(cache_name)
    spec_records = cached.get("records") if isinstance(cached, dict) else None
    if not spec_records or not isinstance(spec_records, list) \
            or cached.get("content") != _file_digest(spec):
        return None
    try:
        for r in spec_records:
            Description(**r["description"])
            bool(r["replaces_builtin"])
            if not isinstance(r["name"], str):
                return None
    except (KeyError, TypeError):
        return None
    return spec_records


_PLUGIN_CLASSES: Dict[str, List[type]] = {}


def _load_plugin(spec: str, name: str) -> Implementation:
    """Import (once per process) and construct the class ``name`` of a plugin file described
    from the cache."""
    if spec not in _PLUGIN_CLASSES:
        _PLUGIN_CLASSES[spec] = _classes_in(_load_object(spec))
    for cls in _PLUGIN_CLASSES[spec]:
        if _name_of(cls) == name:
            check_interface(cls)
            impl = cls()
            check_instance(impl)
            return impl
    raise Unavailable(f"{spec} no longer provides {name!r}")


def _builtin_record(e: Entry, spec: str) -> Dict[str, Any]:
    desc = e.description
    return {"name": e.name, "spec": spec, "error": e.error,
            "description": dataclasses.asdict(desc) if desc is not None else None}


def _name_of(cls: Any) -> str:
    """A plugin class's registered name: its ``name`` when that is a non-empty string, else
    the class's own name (``check_instance`` then says what is wrong with ``name``)."""
    name = getattr(cls, "name", "")
    if isinstance(name, str) and name:
        return name
    return getattr(cls, "__name__", None) or repr(cls)


def check_instance(impl: Any) -> None:
    """Raise TypeError naming the attribute of a constructed plugin that cannot be used:
    ``name`` and ``array_library`` must be strings, ``devices()`` a list of strings, and
    ``dtypes(device)`` some of the known dtypes on each device (the run could not go on)."""
    from suite.spec.problem import DTYPES

    kind = type(impl).__name__
    name = getattr(impl, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{kind}.name: expected a non-empty string, got {name!r}")
    arrays = getattr(impl, "array_library", None)
    if arrays is not None and not isinstance(arrays, str):
        raise TypeError(f"{kind}.array_library: expected a string, got {type(arrays).__name__}")
    try:
        devices = impl.devices()
    except Exception as exc:
        raise TypeError(f"{kind}.devices() raised {_describe(exc)}") from None
    if not isinstance(devices, (list, tuple)) or not all(isinstance(d, str) for d in devices):
        raise TypeError(f"{kind}.devices(): expected a list of device names, got {devices!r}")
    for device in devices:
        try:
            dtypes = impl.dtypes(device)
        except Exception as exc:
            raise TypeError(f"{kind}.dtypes({device!r}) raised {_describe(exc)}") from None
        if isinstance(dtypes, str) or not dtypes or not set(dtypes) <= set(DTYPES):
            raise TypeError(f"{kind}.dtypes({device!r}): expected some of {', '.join(DTYPES)}, "
                            f"got {dtypes!r}")


def transient(record: Any) -> Optional[str]:
    """Why a built-in's cached record may not hold in another process (None: it will).

    A library reported missing that is installed (hidden from one run: a path, an
    environment), an available built-in with no device or no dtype on one (a platform that
    failed to start, e.g. JAX_PLATFORMS=bogus), or a failure other than a missing library
    or the plugin's own ``Unavailable`` (an exception from a library at start-up) are
    facts of one run, not of the installed versions the cache is keyed by.
    """
    if not isinstance(record, dict) or not isinstance(record.get("name"), str):
        return "malformed record"
    desc, error = record.get("description"), record.get("error")
    if desc is not None:
        if not isinstance(desc, dict) or not desc.get("devices") or not all(
                desc.get("dtypes", {}).get(d) for d in desc["devices"]):
            return "available with no device or no dtype"
        return None
    if not isinstance(error, str):
        return "unavailable without a reason"
    missing = re.match(r"^(\w+) is not installed", error)
    if missing:
        installed = cache.fingerprint().get(missing.group(1)) or library_versions(
            [missing.group(1)]).get(missing.group(1))
        return "a library reported missing is installed" if installed else None
    if re.match(r"^\w+(Error|Exception|Interrupt|Exit):", error):
        return "a failure at start-up"
    return None


def cached_records_usable(cached: Any) -> bool:
    """The cache's records describe every built-in, each in a form that holds here."""
    if not isinstance(cached, list) or not cached:
        return False
    names = {r.get("name") for r in cached if isinstance(r, dict)}
    if not set(BUILTINS) <= names:  # an empty or partial list would hide built-ins
        return False
    return not any(transient(r) for r in cached)


class Registry:
    """A private dict of entries behind a read-only view."""

    def __init__(self) -> None:
        self._entries: Dict[str, Entry] = {}

    @property
    def entries(self) -> Mapping[str, Entry]:
        return types.MappingProxyType(self._entries)

    def register(self, cls: type, source: str = "plugin", clobber: bool = False) -> Entry:
        """Check the class, construct it, and record it (or why it cannot run)."""
        name = _name_of(cls)
        if name in self._entries and not clobber:
            raise ValueError(f"implementation {name!r} is already registered "
                             f"(from {self._entries[name].source}); pass clobber=True to replace")
        # the failures of the probes it runs (or reads from the cache) while it is checked:
        # an unavailable one shows the exceptions they caught, not only an empty list
        with probes.capture() as failed:
            try:
                check_interface(cls)
                impl = cls()
                check_instance(impl)
                entry = Entry(name, source, impl=impl)
                if source == "builtin" and not runs_anywhere(impl):  # listed with the reason
                    entry = Entry(name, source, error=f"runs on no device and dtype here "
                                                      f"(devices {list(impl.devices())}, none "
                                                      f"with a dtype its probes ran"
                                                      f"{''.join('; ' + f for f in failed)})")
            except Exception as exc:  # a plugin that fails to construct is listed, not fatal
                why = f" ({'; '.join(failed)})" if failed else ""
                entry = Entry(name, source, error=_describe(exc) + why)
        self._entries[name] = entry
        return entry

    def record_error(self, name: str, source: str, error: str) -> None:
        self._entries.setdefault(name, Entry(name, source, error=error))

    def load_spec(self, spec: str, clobber: bool = True,
                  replace: Iterable[str] = ()) -> List[Entry]:
        """Register the classes named by one --plugin spec; raises PluginError.

        A class named like a built-in is refused unless the built-in's name is in
        ``replace`` (``--replace-builtin NAME``) or the class sets ``replaces_builtin``.
        """
        cache_name = _plugin_cache_name(spec)
        cached = _cached_plugin(cache_name, spec) if cache_name else None
        if cached is not None:  # described from the cache: imported on first use
            self._refuse_builtin_names(spec, [(r["name"], r["replaces_builtin"])
                                              for r in cached], replace)
            return [self._describe_plugin(r, spec, clobber) for r in cached]
        classes = _classes_in(_load_object(spec))
        if not classes:
            raise PluginError(f"--plugin {spec}: no implementation class found "
                              "(a class with a 'name' and a 'run' method)")
        self._refuse_builtin_names(spec, [(_name_of(c), getattr(c, "replaces_builtin", False))
                                          for c in classes], replace)
        entries = [self.register(c, f"plugin {spec}", clobber=clobber) for c in classes]
        if cache_name:
            records = [{**_builtin_record(e, spec),
                        "replaces_builtin": bool(getattr(c, "replaces_builtin", False))}
                       for e, c in zip(entries, classes)]
            # Only what holds in another process is kept: every class available.
            if all(r["description"] is not None and not transient(r) for r in records):
                cache.store(cache_name, {"content": _file_digest(spec), "records": records})
        return entries

    def _refuse_builtin_names(self, spec: str, names: List[Tuple[str, bool]],
                              replace: Iterable[str]) -> None:
        replace = set(replace)
        for name, replaces in names:
            old = self._entries.get(name)
            if old is not None and old.source == "builtin" and name not in replace \
                    and not replaces:
                raise PluginError(f"--plugin {spec}: {name!r} is a built-in's name; rename "
                                  f"the class, or replace the built-in on purpose with "
                                  f"--replace-builtin {name}")

    def _describe_plugin(self, record: Dict[str, Any], spec: str, clobber: bool) -> Entry:
        name = record["name"]
        if name in self._entries and not clobber:
            raise ValueError(f"implementation {name!r} is already registered "
                             f"(from {self._entries[name].source}); pass clobber=True to replace")
        entry = Entry(name, f"plugin {spec}", loader=functools.partial(_load_plugin, spec, name),
                      description=Description(**record["description"]))
        self._entries[name] = entry
        return entry

    def load_builtins(self) -> None:
        """The built-ins, described from the cache without importing their frameworks when
        it is fresh; else loaded now (frameworks imported, probes run) and the cache written."""
        name = descriptions_cache_name()  # before a built-in sets a default in os.environ
        cached = cache.load(name)
        if cached_records_usable(cached):
            try:
                self._describe_builtins(cached)
                return
            except (KeyError, TypeError, ValueError):  # an unreadable cache: load them all
                self._entries = {n: e for n, e in self._entries.items() if e.source != "builtin"}
        specs = self._load_builtins_now()
        fresh = [_builtin_record(self._entries[n], spec) for n, spec in specs.items()]
        if not any(transient(r) for r in fresh):  # one bad run never sticks in the cache
            cache.store(name, fresh)

    def _describe_builtins(self, records: List[Dict[str, Any]]) -> None:
        for r in records:
            loader = None
            if r["description"] is not None:
                loader = functools.partial(_load_builtin, r["spec"], r["name"])
            desc = Description(**r["description"]) if r["description"] is not None else None
            self._entries[r["name"]] = Entry(r["name"], "builtin", error=r["error"],
                                             loader=loader, description=desc)

    def _load_builtins_now(self) -> Dict[str, str]:
        """Import and construct every built-in; returns name -> the spec that defines it."""
        specs: Dict[str, str] = {}
        for name, spec in BUILTINS.items():
            specs[name] = spec
            try:
                cls = _load_object(spec)
            except PluginError as exc:
                cause = exc.__cause__ or exc.__context__
                self.record_error(name, "builtin", _describe(cause) if cause else str(exc))
                continue
            self.register(cls, "builtin")
        for pattern, spec in BUILTIN_FAMILIES.items():
            try:
                for cls in _family(spec):
                    specs[self.register(cls, "builtin").name] = spec
                # A family may say which variants it left out here, and why.
                dropped = getattr(sys.modules.get(spec.split(":")[0]), "DROPPED", {})
                for name, why in dropped.items():
                    if name not in self._entries:
                        self.record_error(name, "builtin", why)
                        specs[name] = spec
            except Exception as exc:
                cause = exc.__cause__ or exc.__context__
                self.record_error(pattern, "builtin", _describe(cause) if cause else str(exc))
                specs[pattern] = spec
        return specs

    def load_entry_points(self) -> None:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            source = f"entry point {ep.value}"
            try:
                for cls in _classes_in(ep.load()):
                    self.register(cls, source)
            except Exception as exc:
                self.record_error(ep.name, source, _describe(exc))

    def _from_plugins(self, spec: str) -> List[Entry]:
        """The entries a --plugin spec registered (``plugin:`` selections): ``*`` all of
        them, else those whose file or module is ``spec``'s (a path compares resolved, so
        ``plugin:f.py`` picks every class of ``f.py`` and of ``f.py:Class``) or matches it
        as a glob."""
        want = _spec_target(spec)
        out = []
        for e in self._entries.values():
            if not e.source.startswith("plugin "):
                continue
            own = e.source[len("plugin "):]
            if spec == "*" or own == spec or _spec_target(own) == want \
                    or fnmatch.fnmatchcase(own, spec) \
                    or fnmatch.fnmatchcase(own.partition(":")[0], spec):
                out.append(e)
        return out

    def select(self, patterns: Optional[Iterable[str]] = None,
               available_only: bool = True) -> List[Entry]:
        """Entries matching any name or glob; an unmatched pattern raises."""
        patterns = list(patterns or ["*"])
        chosen: Dict[str, Entry] = {}
        for pattern in patterns:
            if pattern.startswith(PLUGIN_PREFIX):
                hits = self._from_plugins(pattern[len(PLUGIN_PREFIX):])
            else:
                hits = [e for n, e in self._entries.items()
                        if fnmatch.fnmatchcase(n, pattern) or n == pattern]
            if not hits and pattern.startswith(PLUGIN_PREFIX):
                specs = sorted({e.source[len("plugin "):] for e in self._entries.values()
                                if e.source.startswith("plugin ")})
                raise UnknownImplementation(
                    f"no implementation registered by {pattern!r}; --plugin specs here: "
                    f"{', '.join(specs) or 'none'}")
            if not hits:
                known = ", ".join(sorted(self._entries))
                raise UnknownImplementation(
                    f"unknown implementation {pattern!r}; known: {known}")
            for e in hits:
                chosen[e.name] = e
        return [e for e in chosen.values() if not available_only or e.available]


def _names(value: str) -> List[str]:
    return [s.strip() for s in value.split(",") if s.strip()]


def build(plugins: Iterable[str] = (), builtins: bool = True, entry_points: bool = True,
          env: Optional[Mapping[str, str]] = None, replace: Iterable[str] = ()) -> Registry:
    """A registry of built-ins, entry points, $MHA_SUITE_PLUGINS and ``plugins``; a plugin
    may replace the built-ins named in ``replace`` or $MHA_SUITE_REPLACE_BUILTINS."""
    reg = Registry()
    if builtins:
        reg.load_builtins()
    if entry_points:
        reg.load_entry_points()
    env = os.environ if env is None else env
    replace = {*replace, *_names(env.get(REPLACE_ENV, ""))}
    for spec in [*_names(env.get(PLUGINS_ENV, "")), *plugins]:
        reg.load_spec(spec, replace=replace)
    return reg


_SHARED: Dict[Tuple[Tuple[str, ...], str, str], Registry] = {}


def shared(plugins: Iterable[str] = ()) -> Registry:
    """This process's registry for these --plugin specs and $MHA_SUITE_PLUGINS: one build
    per command, however many parts (CLI, pytest sessions, sweep) ask for it."""
    key = (tuple(plugins), os.environ.get(PLUGINS_ENV, ""), os.environ.get(REPLACE_ENV, ""))
    if key not in _SHARED:
        _SHARED[key] = build(plugins=key[0])
    return _SHARED[key]


def runs_anywhere(impl: Implementation) -> bool:
    """Whether ``impl`` declares a dtype on some device: a built-in that declares none has
    nothing to run here and is unavailable, not "available" with an empty list."""
    return any(list(impl.dtypes(d)) for d in impl.devices())


def is_plugin_class(obj: object) -> bool:
    return inspect.isclass(obj) and issubclass(obj, Implementation)
