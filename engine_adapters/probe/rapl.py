"""RAPL: the CPU packages' energy counters under ``/sys/class/powercap`` (Linux).

Read in the device sampler's thread, about once a second.  Only the top-level zones
(``intel-rapl:N``, one per package; the kernel uses that name on AMD too) are summed:
their sub-zones (``intel-rapl:N:M``: core, uncore, dram) are parts of the package and
would count twice.  ``energy_uj`` wraps at ``max_energy_range_uj``
(``definitions.energy.Unwrapper`` undoes it).  On kernels patched for CVE-2020-8694 the
file is readable by root only: then ``reason`` says so and nothing is estimated.
"""

from __future__ import annotations

import os

from engine_adapters.definitions.energy import Unwrapper

POWERCAP = "/sys/class/powercap"
"""Where the kernel exposes RAPL zones."""
ENV_POWERCAP = "RLTPERF_POWERCAP"
"""Environment variable naming another folder laid out like ``POWERCAP`` (a container's
bind mount of the host's, or a test's tree)."""


def powercap_root() -> str:
    """``RLTPERF_POWERCAP`` when set, else ``POWERCAP``."""
    return os.environ.get(ENV_POWERCAP) or POWERCAP


class RaplReader:
    """Cumulative joules of every CPU package, or ``reason`` why there are none.

    Args:
        root: the powercap directory; None: ``powercap_root()``.
    """

    def __init__(self, root: str | None = None) -> None:
        root = root or powercap_root()
        self.root = root
        self.zones: list[tuple[str, Unwrapper]] = []
        self.reason: str | None = None
        self.names: list[str] = []
        try:
            entries = sorted(os.listdir(root))
        except OSError as exc:
            self.reason = f"RAPL not present ({root}: {exc.strerror or exc})"
            return
        tops = [e for e in entries if e.startswith("intel-rapl:") and e.count(":") == 1]
        if not tops:
            self.reason = f"RAPL not present (no intel-rapl zone in {root})"
            return
        for z in tops:
            d = os.path.join(root, z)
            try:
                max_range = int(_read(os.path.join(d, "max_energy_range_uj")))
                u = Unwrapper(max_range)
                u.add(int(_read(os.path.join(d, "energy_uj"))))
            except OSError as exc:
                self.zones = []
                why = "root only on recent kernels" if isinstance(exc, PermissionError) else exc.strerror
                self.reason = f"RAPL not readable ({os.path.join(d, 'energy_uj')}: {why})"
                return
            except ValueError as exc:
                self.zones = []
                self.reason = f"RAPL unreadable ({d}: {exc})"
                return
            self.zones.append((os.path.join(d, "energy_uj"), u))
            try:
                self.names.append(_read(os.path.join(d, "name")).strip() or z)
            except OSError:
                self.names.append(z)

    def read_j(self) -> float | None:
        """Joules all packages used since this reader was made; None when unreadable now."""
        if not self.zones:
            return None
        total = 0
        try:
            for path, u in self.zones:
                total += u.add(int(_read(path)))
        except (OSError, ValueError):
            return None
        return total / 1e6


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()
