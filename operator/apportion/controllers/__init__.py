"""kopf handlers, one module per kind, thin: they delegate to the engine and to publishing.

Importing a handler module registers its handlers with kopf's default registry; `load_handlers`
imports them all for `apportion operator`, which runs them with `settings.build_settings()`.
"""

from __future__ import annotations

import dataclasses
import importlib

import kopf

HANDLER_MODULES = (
    "apportion.controllers.login",
    "apportion.controllers.unitsets.handlers",
    "apportion.controllers.graintypes.handlers",
)


def load_handlers() -> None:
    for name in HANDLER_MODULES:
        importlib.import_module(name)
    without_finalizers(kopf.get_default_registry())


def without_finalizers(registry: kopf.OperatorRegistry) -> None:
    """Our daemons need no cleanup before their object goes: the ConfigMaps they write are
    garbage-collected through owner references, and a daemon whose object was deleted ends by
    itself (`wakeups.gone`). kopf nevertheless gives every daemon its finalizer, and a
    finalizer leaves sets, and the namespaces holding them, stuck in deletion whenever the
    operator is stopped or uninstalled (GitOps prune, `kubectl delete ns`). kopf has no switch
    for it (`@kopf.daemon` hard-codes `requires_finalizer=True`), so its spawning registry is
    rewritten here; kopf then also removes the finalizer from objects that still carry it."""
    spawning = registry._spawning
    spawning._handlers = [
        dataclasses.replace(handler, requires_finalizer=False) for handler in spawning._handlers
    ]
