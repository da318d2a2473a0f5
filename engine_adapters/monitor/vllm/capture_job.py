"""What a ``vllm+http://`` capture is and needs: its job (``HttpCaptureJob``) and the
session it runs for (``CaptureHost``, a protocol of public names, so the capture thread in
``capture.py`` never imports the adapter)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from engine_adapters.definitions.records import EngineInfo, Record
from engine_adapters.monitor.vllm.http import HttpClient


class CaptureHost(Protocol):
    """What a capture needs of the session that runs it (``VllmSession``)."""

    base_url: str
    http: HttpClient
    info: EngineInfo | None
    profiler_dir: str | None
    profiler_available: bool | None
    snapshot_root: str

    def post(self, rec: Record) -> None:
        """Queue a record for the session's reader."""

    def capture_blocker(self) -> str | None:
        """Why a capture cannot run here, or None."""

    def scrape_steps(self) -> dict[str, float] | None:
        """The server's cumulative engine steps by engine label, or None."""

    def capture_finished(self, cap: object) -> None:
        """The capture thread is done (another capture may start)."""

    def server_ranks(self) -> tuple[list[str] | None, dict[int, str]]:
        """The server's ranks (None: unknown) and its workers' pids by rank name."""


@dataclass
class HttpCaptureJob:
    """One capture through the server's profiler."""

    capture_id: str
    steps: int
    mode: str
    label: str
    prefix: str
    requested_ns: int
    live_at_trigger: dict[str, Any] = field(default_factory=dict)
    trigger: dict[str, Any] | None = None
    """The trigger rule that asked for this capture (``TriggerInfo`` as a dict), if any."""
    state: str = "armed"
    start_call_s: float | None = None
    stop_call_s: float | None = None
    steps_at_start: float | None = None
    engine_steps_at_start: dict[str, float] | None = None
    started_ns: int | None = None
    window_end_ns: int | None = None
    export_start_ns: int | None = None
    error: str | None = None
    stop_sent: bool = False
