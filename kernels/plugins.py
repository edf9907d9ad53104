"""Third-party kernels: the ``tokenspeed.kernels`` entry-point group.

A distribution adds kernels by declaring, in its pyproject::

    [project.entry-points."tokenspeed.kernels"]
    my_kernels = "my_package.tokenspeed_plugin:register"

The target is either a function, called once with no arguments, that calls
``tokenspeed.kernels.register_kernel`` (use ``Priority.PLUGIN``), or a module whose import
registers them. A plugin that fails to load is reported and skipped, never fatal: a broken
optional package must not take the server down.
"""

from __future__ import annotations

import logging
import threading
from importlib.metadata import entry_points
from types import ModuleType

__all__ = ["ENTRY_POINT_GROUP", "load_plugins", "plugin_errors"]

ENTRY_POINT_GROUP = "tokenspeed.kernels"

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_loaded = False
_errors: dict[str, str] = {}


def load_plugins() -> None:
    """Load every entry point of the group once per process."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        _loaded = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                target = ep.load()
                if callable(target) and not isinstance(target, ModuleType):
                    target()
            except Exception as err:  # a broken plugin is reported, never fatal
                _errors[ep.name] = f"{type(err).__name__}: {err}"
                _log.warning("kernel plugin %s failed to load: %s", ep.name, err)


def plugin_errors() -> dict[str, str]:
    """Plugins that failed to load, by entry-point name, with the error."""
    return dict(_errors)
