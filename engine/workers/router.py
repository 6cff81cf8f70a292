"""Which data-parallel replica serves a request (``--dp N``).

Every replica has its own radix cache, so a chat whose next turn lands on another replica
prefills its whole history again. The front end therefore remembers, for the prompts it sent,
which replica got them, and sends a new prompt to the replica that got the longest prefix of
it: the second turn of a chat finds its first turn's KV, a regenerated reply its prompt's. A
prompt that shares nothing known goes to the replica with the fewest requests in flight.

What the front end remembers is an approximation of the replicas' caches (it does not see
their evictions), kept as hashes of prompt prefixes cut into blocks, as SGLang's
cache-aware router keeps an approximate tree of each worker's requests. Cached tokens are
weighed against load: many new chats over one short system prompt spread over the replicas
(each soon holds the system prompt), a long chat history stays where it is cached unless
that replica has several requests more in flight than another.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

ROUTING_POLICIES = ("prefix", "round-robin")
TOKEN_BLOCK = 16  # prompt ids per hashed block
TEXT_BLOCK = 64  # characters per hashed block (chat messages and plain prompts)
MAX_REMEMBERED_BLOCKS = 200_000  # least recently used prefixes are forgotten beyond this
# a replica running one more request than another is still chosen for this many more cached tokens:
# re-prefilling a short shared prefix (a system prompt) elsewhere costs less than queueing behind
# others, re-prefilling a long chat history costs more
TOKENS_PER_REQUEST_IN_FLIGHT = 256


def prompt_blocks(
    text: str | None, messages: list[dict[str, Any]] | None, input_ids: Sequence[int] | None
) -> list:
    """A prompt cut into the blocks its prefixes are made of, in the order the model reads it:
    token ids by ``TOKEN_BLOCK``, text by ``TEXT_BLOCK`` characters, chat messages one by one
    (a long one in ``TEXT_BLOCK`` pieces), so that a chat's next turn, which repeats the
    earlier messages, shares their blocks. The last block may be short: the same prompt sent
    again (a regenerated reply) matches it whole."""
    if input_ids is not None:
        return [
            tuple(input_ids[i : i + TOKEN_BLOCK]) for i in range(0, len(input_ids), TOKEN_BLOCK)
        ]
    if text is not None:
        return _pieces(text)
    blocks = []
    for message in messages or []:
        content = message.get("content")
        blocks += _pieces(
            f"{message.get('role')}\x1f{content if isinstance(content, str) else repr(content)}\x1e"
        )
    return blocks


def _pieces(text: str) -> list[str]:
    return [text[i : i + TEXT_BLOCK] for i in range(0, len(text), TEXT_BLOCK)]


def prefix_hashes(blocks: list) -> list[int]:
    """One hash per block, each covering every block before it too."""
    hashes, running = [], 0
    for block in blocks:
        running = hash((running, block))
        hashes.append(running)
    return hashes


class ReplicaRouter:
    """Chooses a replica per request and counts each replica's requests in flight."""

    def __init__(
        self, num_replicas: int, policy: str = "prefix", max_blocks: int = MAX_REMEMBERED_BLOCKS
    ) -> None:
        if policy not in ROUTING_POLICIES:
            raise ValueError(
                f"unknown routing policy {policy!r}; choose one of {', '.join(ROUTING_POLICIES)}"
            )
        self.num_replicas = num_replicas
        self.policy = policy
        self.max_blocks = max_blocks
        self.in_flight = [0] * num_replicas
        self.holders: OrderedDict[int, int] = (
            OrderedDict()
        )  # prefix hash -> bit mask of the replicas that got it
        self._turns = itertools.count()

    def choose(self, blocks: list) -> int:
        """The replica for a prompt given as ``prompt_blocks`` (and remember that it now holds
        the prompt's prefixes): the most cached prompt tokens, less ``TOKENS_PER_REQUEST_IN_FLIGHT``
        for each request it is already running; ties go to the least loaded, then in turn."""
        if self.num_replicas == 1:
            return 0
        if self.policy == "round-robin":
            return next(self._turns) % self.num_replicas
        hashes = prefix_hashes(blocks)
        cached = self.cached_tokens(blocks, hashes)
        rank = {
            r: (cached[r] - TOKENS_PER_REQUEST_IN_FLIGHT * self.in_flight[r], -self.in_flight[r])
            for r in range(self.num_replicas)
        }
        best = max(rank.values())
        tied = [r for r in range(self.num_replicas) if rank[r] == best]
        # the turn moves only when it decides, so that new prompts alternate between idle replicas
        replica = tied[next(self._turns) % len(tied)] if len(tied) > 1 else tied[0]
        self.remember(hashes, replica)
        return replica

    def remember(self, hashes: list[int], replica: int) -> None:
        """``replica`` now holds these prefixes."""
        for h in hashes:
            self.holders[h] = self.holders.get(h, 0) | (1 << replica)
            self.holders.move_to_end(h)
        while len(self.holders) > self.max_blocks:
            self.holders.popitem(last=False)

    def cached_tokens(self, blocks: list, hashes: list[int]) -> list[int]:
        """For each replica, about how many of the prompt's first tokens it got before (a text
        block counts a token per 4 characters)."""
        cached = [0] * self.num_replicas
        alive = (1 << self.num_replicas) - 1  # replicas whose known prefix reaches this block
        for block, h in zip(blocks, hashes):
            alive &= self.holders.get(h, 0)
            if not alive:
                break
            weight = len(block) if isinstance(block, tuple) else max(1, len(block) // 4)
            for r in range(self.num_replicas):
                if alive >> r & 1:
                    cached[r] += weight
        return cached

    def started(self, replica: int) -> None:
        self.in_flight[replica] += 1

    def ended(self, replica: int) -> None:
        self.in_flight[replica] -= 1
