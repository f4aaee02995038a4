"""kopf handlers, one module per kind, thin: they delegate to the engine and to publishing.

Importing a handler module registers its handlers with kopf's default registry; `load_handlers`
imports them all for `apportion operator`, which runs them with `settings.build_settings()` and
hands them the process's `runtime.Runtime` as `memo.runtime`.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging

import kopf

HANDLER_MODULES = (
    "apportion.controllers.login",
    "apportion.controllers.unitsets.handlers",
    "apportion.controllers.graintypes.handlers",
)


class _QuietWakeups(logging.Filter):
    """kopf logs every handler's success at INFO; for our indexers and wake-up handlers that is
    a line per pod event. Keep those lines out of the operator's log."""

    HANDLERS = ("'wake'", "'apportion_graintypes'")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        return not (message.endswith(" succeeded.") and any(h in message for h in self.HANDLERS))


def load_handlers() -> None:
    logging.getLogger("kopf.objects").addFilter(_QuietWakeups())
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
