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
import importlib
import importlib.util
import inspect
import os
import sys
import types
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional

from suite.plugin import Implementation, Unavailable, check_interface

ENTRY_POINT_GROUP = "mha_suite.implementations"
PLUGINS_ENV = "MHA_SUITE_PLUGINS"

# name -> "module:Class" of the built-ins, with what to install when missing.
BUILTINS: Dict[str, str] = {
    "numpy": "implementations.numpy_mha:NumpyMHA",
    "numpy.flash": "implementations.numpy_flash:NumpyFlashMHA",
    "torch.eager": "implementations.torch_eager:TorchEager",
    "torch.sdpa": "implementations.torch_sdpa:TorchSDPA",
    "torch.nn": "implementations.torch_nn:TorchNN",
    "jax.jit": "implementations.jax_jit:JaxJit",
    "jax.nn": "implementations.jax_nn:JaxNN",
}
# Modules that may register several names (variants known only at run time).
BUILTIN_FAMILIES: Dict[str, str] = {
    "torch.sdpa[*]": "implementations.torch_sdpa:backend_variants",
    "jax.nn[*]": "implementations.jax_nn:backend_variants",
    "torch.compile*": "implementations.torch_compiled:variants",
}
INSTALL_HINTS = {
    "torch": "pip install 'mha-suite[torch]'",
    "jax": "pip install 'mha-suite[jax]'",
}


class UnknownImplementation(LookupError):
    """A name or pattern that matches no registered implementation."""


class PluginError(ValueError):
    """A --plugin spec that cannot be loaded (missing file, bad module, not a class)."""


@dataclasses.dataclass
class Entry:
    """One registered name: its instance when usable, else why not."""

    name: str
    source: str  # "builtin", "entry point <dist>", "plugin <spec>"
    impl: Optional[Implementation] = None
    error: Optional[str] = None

    @property
    def available(self) -> bool:
        return self.impl is not None


def _describe(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        root = exc.name.split(".")[0]
        if root in INSTALL_HINTS:
            return f"{root} is not installed ({INSTALL_HINTS[root]})"
        return f"module {exc.name} not found"
    return f"{type(exc).__name__}: {first}" if not isinstance(exc, Unavailable) else first


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


class Registry:
    """A private dict of entries behind a read-only view."""

    def __init__(self) -> None:
        self._entries: Dict[str, Entry] = {}

    @property
    def entries(self) -> Mapping[str, Entry]:
        return types.MappingProxyType(self._entries)

    def register(self, cls: type, source: str = "plugin", clobber: bool = False) -> Entry:
        """Check the class, construct it, and record it (or why it cannot run)."""
        name = getattr(cls, "name", "") or getattr(cls, "__name__", repr(cls))
        if name in self._entries and not clobber:
            raise ValueError(f"implementation {name!r} is already registered "
                             f"(from {self._entries[name].source}); pass clobber=True to replace")
        try:
            check_interface(cls)
            impl = cls()
            entry = Entry(name, source, impl=impl)
        except Exception as exc:  # a plugin that fails to construct is listed, not fatal
            entry = Entry(name, source, error=_describe(exc))
        self._entries[name] = entry
        return entry

    def record_error(self, name: str, source: str, error: str) -> None:
        self._entries.setdefault(name, Entry(name, source, error=error))

    def load_spec(self, spec: str, clobber: bool = True) -> List[Entry]:
        """Register the classes named by one --plugin spec; raises PluginError."""
        classes = _classes_in(_load_object(spec))
        if not classes:
            raise PluginError(f"--plugin {spec}: no implementation class found "
                              "(a class with a 'name' and a 'run' method)")
        return [self.register(c, f"plugin {spec}", clobber=clobber) for c in classes]

    def load_builtins(self) -> None:
        for name, spec in BUILTINS.items():
            try:
                cls = _load_object(spec)
            except PluginError as exc:
                cause = exc.__cause__ or exc.__context__
                self.record_error(name, "builtin", _describe(cause) if cause else str(exc))
                continue
            self.register(cls, "builtin")
        for pattern, spec in BUILTIN_FAMILIES.items():
            try:
                for cls in _classes_in(_load_object(spec)):
                    self.register(cls, "builtin")
                # A family may say which variants it left out here, and why.
                dropped = getattr(sys.modules.get(spec.split(":")[0]), "DROPPED", {})
                for name, why in dropped.items():
                    if name not in self._entries:
                        self.record_error(name, "builtin", why)
            except Exception as exc:
                cause = exc.__cause__ or exc.__context__
                self.record_error(pattern, "builtin", _describe(cause) if cause else str(exc))

    def load_entry_points(self) -> None:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            source = f"entry point {ep.value}"
            try:
                for cls in _classes_in(ep.load()):
                    self.register(cls, source)
            except Exception as exc:
                self.record_error(ep.name, source, _describe(exc))

    def select(self, patterns: Optional[Iterable[str]] = None,
               available_only: bool = True) -> List[Entry]:
        """Entries matching any name or glob; an unmatched pattern raises."""
        patterns = list(patterns or ["*"])
        chosen: Dict[str, Entry] = {}
        for pattern in patterns:
            hits = [e for n, e in self._entries.items()
                    if fnmatch.fnmatchcase(n, pattern) or n == pattern]
            if not hits:
                known = ", ".join(sorted(self._entries))
                raise UnknownImplementation(
                    f"unknown implementation {pattern!r}; known: {known}")
            for e in hits:
                chosen[e.name] = e
        return [e for e in chosen.values() if e.available or not available_only]


def build(plugins: Iterable[str] = (), builtins: bool = True, entry_points: bool = True,
          env: Optional[Mapping[str, str]] = None) -> Registry:
    """A registry of built-ins, entry points, $MHA_SUITE_PLUGINS and ``plugins``."""
    reg = Registry()
    if builtins:
        reg.load_builtins()
    if entry_points:
        reg.load_entry_points()
    env = os.environ if env is None else env
    specs = [s.strip() for s in env.get(PLUGINS_ENV, "").split(",") if s.strip()]
    for spec in [*specs, *plugins]:
        reg.load_spec(spec)
    return reg


def is_plugin_class(obj: object) -> bool:
    return inspect.isclass(obj) and issubclass(obj, Implementation)
