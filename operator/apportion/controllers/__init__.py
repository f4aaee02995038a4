"""kopf handlers, one module per kind, thin: they delegate to the engine and to publishing.

Importing a handler module registers its handlers with kopf's default registry; `load_handlers`
imports them all for `apportion operator`, which runs them with `settings.build_settings()`.
"""

from __future__ import annotations

import importlib

HANDLER_MODULES = (
    "apportion.controllers.partitionset",
    "apportion.controllers.shardset",
    "apportion.controllers.graintype",
)


def load_handlers() -> None:
    for name in HANDLER_MODULES:
        importlib.import_module(name)
