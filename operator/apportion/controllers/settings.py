"""Operator-wide kopf settings: our own names for everything kopf writes into objects, Events
only for warnings, and timeouts that notice a dead API connection quickly."""

from __future__ import annotations

import logging
import os
import socket

import kopf

from apportion import GROUP

FINALIZER = f"{GROUP}/cleanup"
"""Added by kopf only for handlers that need cleanup before deletion (none yet)."""


def build_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    # Handler progress and the last handled spec live in annotations under our prefix. Status
    # storage would be pruned: the structural schema declares no `status.kopf`.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # kopf would post every handler's success as an Event; keep Events for what users must see.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "apportion-operator"
    settings.posting.reporting_instance = os.environ.get("POD_NAME") or socket.gethostname()
    settings.posting.event_name_prefix = "apportion-"
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.watching.connect_timeout = 10
    # kopf's watches of the sets and their ConfigMaps end after client_timeout even when their
    # connection died without a FIN, as apportion.listwatch.SILENCE_TIMEOUT bounds the others.
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    return settings
