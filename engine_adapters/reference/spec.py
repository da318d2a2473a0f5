"""Self-speculative decoding settings: draft at fewer loops, verify at full depth.

``--spec DRAFT_LOOPS,DRAFT_LEN`` drafts ``DRAFT_LEN`` tokens one by one with the shared
block looped only ``DRAFT_LOOPS`` times, then verifies them in one pass at full depth
(with the exit policy).  Acceptance is greedy by default: a drafted token is accepted
while it equals the verifier's own next token; the first mismatch is replaced by the
verifier's token, and everything after it is rolled back (KV positions freed).

``--spec-accept oracle:ALPHA`` replaces the comparison by a Bernoulli(ALPHA) draw per
drafted token (stopping at the first rejection), for tests: the mean acceptance length
(tokens committed per verification) is then (1 - ALPHA^(G+1)) / (1 - ALPHA) for G
drafted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding configuration."""

    draft_loops: int
    draft_len: int
    accept: str = "greedy"
    """``greedy`` or ``oracle``."""
    alpha: float = 0.0
    """Acceptance probability per drafted token for ``oracle``."""

    def describe(self) -> str:
        """For the engine info and the contract."""
        acc = f"oracle acceptance alpha={self.alpha:g}" if self.accept == "oracle" else "greedy acceptance"
        return f"self-speculative: draft {self.draft_len} tokens at {self.draft_loops} loops, verify at full depth, {acc}"


def parse_spec(text: str | None, accept: str | None, max_loops: int) -> SpecConfig | None:
    """Parse ``--spec`` and ``--spec-accept``; None when speculation is off."""
    if not text:
        if accept:
            raise ValueError("--spec-accept needs --spec DRAFT_LOOPS,DRAFT_LEN")
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        if len(parts) != 2:
            raise ValueError
        loops, length = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(
            f"--spec takes DRAFT_LOOPS,DRAFT_LEN (two whole numbers, e.g. 2,3), not {text!r}"
        ) from None
    if not 1 <= loops < max_loops:
        raise ValueError(
            f"--spec: draft loops must be between 1 and max_loops-1 = {max_loops - 1}, not {loops}"
        )
    if not 1 <= length <= 16:
        raise ValueError(f"--spec: draft length must be between 1 and 16, not {length}")
    acc = (accept or "greedy").strip()
    if acc == "greedy":
        return SpecConfig(loops, length)
    kind, _, arg = acc.partition(":")
    if kind != "oracle":
        raise ValueError(f"--spec-accept must be greedy or oracle:ALPHA, not {acc!r}")
    try:
        alpha = float(arg)
    except ValueError:
        raise ValueError(f"--spec-accept oracle:ALPHA needs a probability, not {arg!r}") from None
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"--spec-accept oracle:{alpha:g}: ALPHA must be in [0, 1)")
    return SpecConfig(loops, length, "oracle", alpha)


def expected_accept_len(alpha: float, draft_len: int) -> float:
    """Mean tokens committed per verification under i.i.d. acceptance ``alpha``."""
    if alpha >= 1.0:
        return float(draft_len + 1)
    return (1.0 - alpha ** (draft_len + 1)) / (1.0 - alpha)
