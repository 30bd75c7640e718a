"""What a claim needs to know of several daemons sharing its work area: the right under
which this daemon holds its claims (its `Tenure`, a lease in `instances.py`), the error
that ends the work on a claim once that right is gone (`ClaimLost`), and the name of a
claim's saved state, by which another daemon finds the claims it takes over."""

from __future__ import annotations

from typing import Protocol

STATE_FILE = ".claim.json"


class ClaimLost(Exception):
    """This daemon no longer holds the claim: its lease ended (the daemon was paused or cut
    off from the share for longer than the lease allows, and another daemon may have taken
    the claim over). Nothing more is written for it."""


class Tenure(Protocol):
    """The right under which a daemon holds the claims of one work area (its lease there)."""

    def holds(self) -> bool:
        """Whether the daemon still holds its claims: it may write for them."""
        ...

    def check(self) -> None:
        """Raise ClaimLost unless the daemon still holds its claims."""
        ...


class Unshared:
    """The tenure of a work area no other daemon shares (the tools, tests of one part)."""

    def holds(self) -> bool:
        return True

    def check(self) -> None:
        return None


UNSHARED = Unshared()
