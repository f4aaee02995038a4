"""kopf handlers, one module per kind, thin: they feed the runtime (`runtime.Runtime`), whose
loops delegate to the engine and to publishing. kopf is used through its public API only: event
handlers and the per-operator memo; no daemons, so kopf puts no finalizer on our objects (and
takes off any an older version left).

Importing a handler module registers its handlers with kopf's default registry; `load_handlers`
imports them all for `apportion operator`, which runs them with `settings.build_settings()` and
hands them the process's `runtime.Runtime` as `memo.runtime`.
"""

from __future__ import annotations

import importlib
import logging

HANDLER_MODULES = (
    "apportion.controllers.login",
    "apportion.controllers.unitsets.handlers",
    "apportion.controllers.graintypes.handlers",
)


class _QuietWakeups(logging.Filter):
    """kopf logs every handler's success at INFO; for our event handlers that only wake the
    loops (`wake`) that is a line per event. Keep those lines out of the operator's log."""

    HANDLERS = ("'wake'",)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        return not (message.endswith(" succeeded.") and any(h in message for h in self.HANDLERS))


def load_handlers() -> None:
    logging.getLogger("kopf.objects").addFilter(_QuietWakeups())
    for name in HANDLER_MODULES:
        importlib.import_module(name)
