"""Import-only stand-ins for the modules MAAS's region imports at load time but never calls on
the paths the real-MAAS tier exercises, and that have no release on PyPI for the Python of the
MAAS release (3.10 for MAAS 3.5, 3.12 for 3.6 and 3.7).

tools/build-maas copies this file into the MAAS venv's site-packages and adds a .pth line that
imports it, so it is active in every process of that venv (the region runner, the schema build).

- simplestreams, curtin, tftp, seamicroclient: boot-image import, curtin preseeds, the rack's
  TFTP server, a retired power driver. Any attribute of any submodule is a placeholder class (a
  zope interface when its name is IName), so `from x.y import Z` and `class C(Z)` work; calling into one is a bug in the tier.
- apt_pkg (python3-apt): MAAS asks it which version of its own package is installed and refuses
  to start without one. This one answers for the maas-region-api package only, at the MAAS
  version in MAAS_STANDIN_VERSION (the build writes it below the marker line).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STANDIN_ROOTS = ("simplestreams", "curtin", "tftp", "seamicroclient")
MAAS_VERSION = "0.0.0"  # replaced by tools/build-maas


class _Placeholder:
    """Stands for anything a stand-in module is asked for."""

    def __init__(self, *args, **kwargs):
        pass


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1] == "I" and name[1:2].isupper():
            # A zope interface, as `@implementer(IReader)` needs one.
            from zope.interface.interface import InterfaceClass

            value = InterfaceClass(name, __module__=self.__name__)
        else:
            value = type(name, (_Placeholder,), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in STANDIN_ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandinModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        if module.__name__ == "curtin":
            module.__version__ = "0"
            module.FEATURES = []


# --- apt_pkg -----------------------------------------------------------------------------


class _Version:
    def __init__(self, text: str):
        self.ver_str = text
        self.file_list = []


class _Package:
    def __init__(self, text: str):
        self.current_ver = _Version(text)


class _Cache:
    def __init__(self, progress=None):
        self._packages = {"maas-region-api": _Package(f"1:{MAAS_VERSION}-0ubuntu1")}

    def __getitem__(self, name):
        return self._packages[name]


class _DepCache:
    def __init__(self, cache):
        self._cache = cache

    def get_candidate_ver(self, package):
        return package.current_ver


class _SourceList:
    def read_main_list(self):
        pass

    def find_index(self, package_file):
        return None


class _Policy:
    def __init__(self, cache):
        pass

    def init_defaults(self):
        pass

    def get_priority(self, package_file):
        return 0


def _apt_pkg() -> types.ModuleType:
    module = types.ModuleType("apt_pkg")
    module.init = lambda: None
    module.get_architectures = lambda: ["amd64"]
    module.Cache = _Cache
    module.DepCache = _DepCache
    module.SourceList = _SourceList
    module.Policy = _Policy
    return module


def install() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
    sys.modules.setdefault("apt_pkg", _apt_pkg())


install()
