"""The running set: requests whose prompt is computed and that generate one token per step."""

from __future__ import annotations

from ..batch import Batch
from ..request import Req


class DecodeManager:
    def __init__(self) -> None:
        self.running: dict[int, Req] = {}  # uid -> request, in admission order

    def add(self, req: Req) -> None:
        self.running[req.uid] = req

    def remove(self, req: Req) -> None:
        self.running.pop(req.uid, None)

    def newest(self) -> Req:
        return next(reversed(self.running.values()))

    def schedule(self) -> Batch | None:
        # a request whose last allowed token is still in flight (overlap) has nothing to compute
        reqs = [req for req in self.running.values() if req.output_len < req.max_new_tokens]
        if not reqs:
            return None
        return Batch("decode", reqs, [1] * len(reqs))
