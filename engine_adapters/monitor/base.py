"""Adapter ABCs (after Harlequin's ``adapter.py``): an adapter turns a target into a session.

An ``Adapter`` is built from a target string and options and returns a ``Session`` from
``connect()``; the session's blocking ``read(timeout)`` returns a list of records.
Required methods are abstract; optional ones have safe defaults, and what an adapter
supports is a ClassVar the UI reads (``SUPPORTS_CAPTURE``...).  Errors are typed, with a
message a person can act on.

An adapter declares the targets it takes (``SCHEMES``, ``SUFFIXES``; ``accepts()`` is the
one decision, overridable) and the optional protocols it implements as mixins the UI
checks with ``isinstance``: ``Reconnecting`` (the adapter gives sessions that connect
and reconnect in their own thread) and ``ReplayControl`` (the session plays a recording:
pause, speed, position and length).  See ARCHITECTURE.md, "Adapters".
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from engine_adapters.definitions.records import EngineInfo, Record, TriggerInfo


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


class ReplayControl(ABC):
    """A session that plays a recording: pause, speed, position and length.

    A mixin a session class declares (``class ReplaySession(Session, ReplayControl)``);
    the UI checks ``isinstance(session, ReplayControl)``.  Nominal rather than a
    structural ``typing.Protocol`` on purpose: a session with a ``speed`` attribute of
    its own must not be taken for a replay."""

    length_ns: int | None = None
    """Data time the recording spans; None while not yet known."""

    @property
    @abstractmethod
    def speed(self) -> float:
        """Playback speed (1.0 real time; 0 as fast as it can be read)."""

    @abstractmethod
    def set_speed(self, speed: float) -> None:
        """Change the speed without jumping in the recording."""

    @property
    @abstractmethod
    def paused(self) -> bool:
        """Whether playback is paused."""

    @abstractmethod
    def toggle_pause(self) -> bool:
        """Pause or resume; returns the new paused state."""

    @abstractmethod
    def elapsed_ns(self) -> int:
        """How far into the recording the replay is (data time since its start)."""


class Adapter(ABC):
    """Knows one kind of target; ``connect()`` gives a ``Session``.

    Subclasses declare ``SUPPORTS_RECONNECT`` exactly when they also declare the
    ``Reconnecting`` protocol; a class where the two disagree fails when it is defined
    (``TypeError``), which ``rltperf adapters`` shows as BROKEN."""

    NAME: ClassVar[str] = ""
    """Adapter name (the entry-point name)."""
    SCHEMES: ClassVar[tuple[str, ...]] = ()
    """Target prefixes this adapter accepts, e.g. ``("tcp://",)``."""
    SUFFIXES: ClassVar[tuple[str, ...]] = ()
    """File-name endings this adapter accepts, e.g. ``(".rltrec",)``."""
    TARGET_FORM: ClassVar[str] = ""
    """How a target looks, for messages (``tcp://HOST:PORT``); default: the schemes."""
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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if bool(cls.SUPPORTS_RECONNECT) != issubclass(cls, Reconnecting):
            raise TypeError(
                f"{cls.__name__}: SUPPORTS_RECONNECT = {cls.SUPPORTS_RECONNECT} but the class "
                f"{'does not declare' if cls.SUPPORTS_RECONNECT else 'declares'} the Reconnecting protocol"
            )

    @classmethod
    def accepts(cls, target: str) -> bool:
        """Whether this adapter handles ``target`` (the one decision the registry asks;
        default: a declared scheme prefix or file suffix)."""
        return cls.scheme_of(target) is not None or cls.suffix_of(target) is not None

    @classmethod
    def scheme_of(cls, target: str) -> str | None:
        """The longest declared scheme ``target`` starts with, or None."""
        return max((s for s in cls.SCHEMES if target.startswith(s)), key=len, default=None)

    @classmethod
    def suffix_of(cls, target: str) -> str | None:
        """The longest declared suffix ``target`` ends with, or None."""
        return max((s for s in cls.SUFFIXES if target.endswith(s)), key=len, default=None)

    @classmethod
    def target_form(cls) -> str:
        """``TARGET_FORM``, else the schemes (``toy://…``), for messages and listings."""
        return cls.TARGET_FORM or ", ".join(f"{s}…" for s in cls.SCHEMES)

    @abstractmethod
    def connect(self) -> Session:
        """Open a session; raises ``AdapterConnectionError`` with a helpful message."""


class Reconnecting(ABC):
    """An adapter whose sessions connect, and reconnect after the target goes away, in
    their own thread (declare it with ``SUPPORTS_RECONNECT = True``).

    ``session()`` returns such a session before it is connected: a monitor that waits
    for a target uses it so that an unanswered connection attempt never blocks it."""

    @abstractmethod
    def session(self) -> Session:
        """A session not yet connected; its ``read()`` connects and retries, and says
        with ``SessionEvent``s why it is not connected yet."""


def new_capture_id() -> str:
    """A short unique capture id."""
    return uuid.uuid4().hex[:12]
