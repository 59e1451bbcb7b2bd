"""In-process progress events of long steps (tuning), for whoever shows them.

The library publishes plain dicts; the CLI draws progress bars from them, the Prefect task
updates a progress artifact. Listeners must be quick and must not raise into the tuner.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

Listener = Callable[[dict[str, Any]], None]
_listeners: list[Listener] = []
_lock = threading.Lock()
log = logging.getLogger(__name__)


def subscribe(fn: Listener) -> Callable[[], None]:
    with _lock:
        _listeners.append(fn)

    def unsubscribe() -> None:
        with _lock:
            if fn in _listeners:
                _listeners.remove(fn)

    return unsubscribe


def publish(event: dict[str, Any]) -> None:
    with _lock:
        listeners = list(_listeners)
    for fn in listeners:
        try:
            fn(event)
        except Exception:  # a broken display must never stop tuning
            log.debug("progress listener failed", exc_info=True)
