"""Planning an HTTP engine's calls for one plan: which submission strategy it runs
(submission.py: auto's choice from the plan, the prefixes sent lately and what calls cost),
which branches sent together go in one call, and whether a stage's calls are shared with
concurrent requests' (coalesce.py). Pure decisions on the protocol and the plan: nothing
is sent here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from openjev.core.plan import Plan
from openjev.engines.http.protocol import HTTPProtocol
from openjev.engines.http.submission import CallCosts, RecentPrefixes, choose


@dataclass
class CallPlanner:
    """`strategy` as configured (--strategy); the rest as HTTPEngine's keywords of those names."""

    protocol: HTTPProtocol
    strategy: str
    warmup_min_tokens: int
    stage_min_tokens: int
    step_tokens: int | None
    recent: RecentPrefixes
    costs: CallCosts

    def strategy_of(self, plan: Plan) -> str:
        if self.strategy == "auto" and self.protocol.shares_prefix_within_a_batch:
            return "all"
        batched = self.protocol.batch_body is not None
        return choose(
            self.strategy,
            plan,
            self.recent,
            warmup_min_tokens=self.warmup_min_tokens,
            batched=batched,
            step_tokens=self.step_tokens,
            stage_min_tokens=self.stage_min_tokens,
            costs=self.costs.estimate() if batched else None,
        )

    def shares_calls(self, plan: Plan, groups: Sequence[Sequence[int]]) -> bool:
        """Whether these calls of `plan` may go through a coalescer: each call is a batch the
        protocol takes whole (not a lone branch whose labels are split over calls, not a
        namespace the batch form would drop)."""
        per_call = self.protocol.max_ids_per_call
        return (not plan.cache_namespace or self.protocol.batch_keeps_namespace) and all(
            per_call is None or len(plan.branches[g[0]].label_ids) <= per_call for g in groups if len(g) == 1
        )

    def groups(self, plan: Plan, indices: Sequence[int]) -> list[list[int]]:
        """The calls these branches (sent together) go in, as lists of branch indices: all
        in one where the protocol batches (keeping the plan's cache namespace, if it has
        one), else one each. A branch whose labels need splitting over calls goes alone;
        where a call asks every item for the union of labels, a new call starts before
        that union would pass max_ids_per_call."""
        p, per_call = self.protocol, self.protocol.max_ids_per_call
        if p.batch_body is None or (plan.cache_namespace and not p.batch_keeps_namespace):
            return [[i] for i in indices]
        if per_call is None:
            return [list(indices)]
        labels = {i: plan.branches[i].label_ids for i in indices}
        groups = [[i] for i in indices if len(labels[i]) > per_call]
        current: list[int] = []
        union: set[int] = set()
        for i in (i for i in indices if len(labels[i]) <= per_call):
            wider = union | set(labels[i]) if p.batch_shares_labels else union
            if current and len(wider) > per_call:
                groups.append(current)
                current, wider = [], set(labels[i])
            current.append(i)
            union = wider
        return [*groups, current] if current else groups
