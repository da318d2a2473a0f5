"""Exit policies: at which loop depth each produced token stops.

- ``fixed`` / ``fixed:N``: every token runs N loops (default: all of them).
- ``gate:q`` (Ouro): after pass t the gate gives lambda_t = sigmoid(gate(h_t)); the
  cumulative exit probability is 1 - prod_{j<=t}(1 - lambda_j); a token exits at the first
  t where it reaches q (and at the last loop otherwise).
- ``kl:eps`` (Huginn): a token exits at the first t >= 2 where KL(p_t || p_{t-1}) < eps,
  p_t the output distribution read from the state after pass t (LM head on the normed
  state; the coda is not run per pass -- a simplification of Huginn's criterion).
- ``oracle:p1,p2,...``: exit depths drawn from the given distribution (index d-1 is the
  probability of depth d; normalised; missing depths are 0).  Ground truth for tests.

Only tokens that produce an output are subject to exits; prompt tokens that produce
nothing run every loop (their KV is needed at every depth).

Exit modes: ``select`` runs every loop for every token and picks each output from its
exit depth (what Ouro's HF code does); ``compact`` drops a sequence's tokens from the
batch once all of them have exited, so later loops run on fewer tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_MODES = ("select", "compact")


@dataclass(frozen=True)
class ExitPolicy:
    """A parsed exit policy."""

    kind: str
    """``fixed``, ``gate``, ``kl`` or ``oracle``."""
    depth: int = 0
    """``fixed``: loops to run (0: all)."""
    threshold: float = 0.0
    """``gate``: q; ``kl``: eps."""
    probs: tuple[float, ...] = ()
    """``oracle``: probability of each exit depth, index d-1 for depth d (sums to 1)."""

    def describe(self) -> str:
        """The policy as its command-line string."""
        if self.kind == "fixed":
            return f"fixed:{self.depth}" if self.depth else "fixed"
        if self.kind == "oracle":
            return "oracle:" + ",".join(f"{p:g}" for p in self.probs)
        return f"{self.kind}:{self.threshold:g}"


def parse_exit(text: str, max_loops: int) -> ExitPolicy:
    """Parse ``--exit``; ``ValueError`` with a sentence a person can act on."""
    s = text.strip()
    kind, _, arg = s.partition(":")
    kind = kind.strip().lower()
    if kind == "fixed":
        if not arg:
            return ExitPolicy("fixed", depth=0)
        try:
            d = int(arg)
        except ValueError:
            raise ValueError(f"--exit fixed:N needs a whole number of loops, not {arg!r}") from None
        if not 1 <= d <= max_loops:
            raise ValueError(f"--exit fixed:{d}: the depth must be between 1 and max_loops={max_loops}")
        return ExitPolicy("fixed", depth=d)
    if kind in ("gate", "kl"):
        try:
            v = float(arg)
        except ValueError:
            what = "q, the cumulative exit probability (0 < q <= 1)" if kind == "gate" else "eps > 0"
            raise ValueError(f"--exit {kind}:X needs a number X ({what}), not {arg!r}") from None
        if kind == "gate" and not 0.0 < v <= 1.0:
            raise ValueError(f"--exit gate:{v:g}: q must be in (0, 1]")
        if kind == "kl" and not v > 0.0:
            raise ValueError(f"--exit kl:{v:g}: eps must be positive")
        return ExitPolicy(kind, threshold=v)
    if kind == "oracle":
        try:
            probs = [float(x) for x in arg.split(",") if x.strip()]
        except ValueError:
            raise ValueError(
                f"--exit oracle:P1,P2,... needs comma-separated probabilities of exiting at depth 1, 2, ...; got {arg!r}"
            ) from None
        if not probs:
            raise ValueError("--exit oracle: give the exit-depth distribution, e.g. oracle:0.1,0.2,0.3,0.4")
        if len(probs) > max_loops:
            raise ValueError(
                f"--exit oracle: {len(probs)} depths given but the model loops at most {max_loops} times"
            )
        if any(p < 0 for p in probs) or sum(probs) <= 0:
            raise ValueError("--exit oracle: probabilities must be >= 0 and not all zero")
        tot = sum(probs)
        return ExitPolicy("oracle", probs=tuple(p / tot for p in probs))
    raise ValueError(f"unknown exit policy {text!r}; use fixed, fixed:N, gate:Q, kl:EPS or oracle:P1,P2,...")


def parse_exit_mode(text: str) -> str:
    """Validate ``--exit-mode``."""
    if text not in EXIT_MODES:
        raise ValueError(f"unknown exit mode {text!r}; use select or compact")
    return text
