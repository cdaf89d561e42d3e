"""A candidate as the scorers and the picker see it (``CandidateView``), and what a picker returns."""

from __future__ import annotations

import msgspec

from policies.decision import Estimate
from policies.ledger import IDLE, RouterView
from policies.types import BackendSnapshot, Deployment, PrefixMatch, Reason


class CandidateView(msgspec.Struct, frozen=True):
    """A candidate as scorers see it: the deployment, its backend's snapshot, the cost estimate; and
    what only a router's own history tells (the published routers' scorers read these two alone, with
    the snapshot's engine metrics): what its prefix index holds of the prompt there, and its own
    requests there (``policies.ledger``)."""

    deployment: Deployment
    snapshot: BackendSnapshot
    estimate: Estimate
    match: PrefixMatch | None = None
    router: RouterView = IDLE


Pick = tuple[int, Reason | None]
"""The winner's index among the scored candidates, and the reason recorded for it (None: the
profile's own)."""
