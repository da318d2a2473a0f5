"""Adapter ABCs (after Harlequin's ``adapter.py``): an adapter turns a target into a session.

An ``Adapter`` is built from a target string and options and returns a ``Session`` from
``connect()``; the session's blocking ``read(timeout)`` returns a list of records.
Required methods are abstract; optional ones have safe defaults, and what an adapter
supports is a ClassVar the UI reads (``SUPPORTS_CAPTURE``...).  Errors are typed, with a
message a person can act on.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from engine_adapters.records import EngineInfo, Record, TriggerInfo


class AdapterError(Exception):
    """Base of adapter errors; ``str(e)`` is a sentence for the screen."""


class AdapterConnectionError(AdapterError):
    """The target could not be reached or answered wrongly."""


class AdapterTargetError(AdapterError):
    """The target string or an option is malformed."""


class CaptureUnsupported(AdapterError):
    """This adapter or target cannot run captures."""


class Session(ABC):
    """A live (or replayed) stream of records from one target."""

    target: str = ""
    """The target as the user gave it."""
    info: EngineInfo | None = None
    """Engine information once known (after the hello)."""

    @abstractmethod
    def read(self, timeout: float) -> list[Record]:
        """Records available within ``timeout`` seconds (maybe none). Never raises for a
        lost connection of a reconnecting session: it returns a ``SessionEvent``."""

    def request_capture(
        self, steps: int, mode: str = "ops", label: str | None = None, trigger: TriggerInfo | None = None
    ) -> str:
        """Ask for a capture of ``steps`` steps; returns the capture id. Results arrive
        as capture records through ``read``.  ``trigger``: the rule that asked for it
        (written into the bundle)."""
        raise CaptureUnsupported(f"{type(self).__name__} cannot capture")

    def close(self) -> None:  # noqa: B027 - optional
        """Release the connection (idempotent)."""

    @property
    def ended(self) -> bool:
        """True when no more records will come (end of a recording, closed session)."""
        return False

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Adapter(ABC):
    """Knows one kind of target; ``connect()`` gives a ``Session``."""

    NAME: ClassVar[str] = ""
    """Adapter name (the entry-point name)."""
    SCHEMES: ClassVar[tuple[str, ...]] = ()
    """Target prefixes this adapter accepts, e.g. ``("tcp://",)``."""
    SUPPORTS_CAPTURE: ClassVar[bool] = False
    """Whether sessions can run profiler captures."""
    SUPPORTS_RECONNECT: ClassVar[bool] = False
    """Whether sessions reconnect by themselves after the target goes away."""
    IS_LIVE: ClassVar[bool] = True
    """False for recordings (replay)."""
    DESCRIPTION: ClassVar[str] = ""
    """One line for ``rltperf adapters``."""

    def __init__(self, target: str, **options: Any) -> None:
        self.target = target
        self.options = options

    @classmethod
    def accepts(cls, target: str) -> bool:
        """Whether this adapter handles ``target``."""
        return any(target.startswith(s) for s in cls.SCHEMES)

    @abstractmethod
    def connect(self) -> Session:
        """Open a session; raises ``AdapterConnectionError`` with a helpful message."""


def new_capture_id() -> str:
    """A short unique capture id."""
    return uuid.uuid4().hex[:12]
