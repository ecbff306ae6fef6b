"""What each labelled item is about, for evaluations that hold a whole kind of text out.

An item's domain is its `domain` field where the data file gives one, else the kind its id
names (`ticket-001` -> `ticket`), mapped to a group below. The groups are kinds of text, not
kinds of question: a fit that must carry to other text is fitted on some groups and judged
on another (evals/transfer_table.py).
"""

from __future__ import annotations

# id kind -> domain group (evals/data: see its README for what each kind holds)
GROUPS = {
    "ticket": "tickets",
    "review": "reviews",
    "log": "logs",
    "oneliner": "one-liners",
    "sms": "one-liners",
    "headline": "one-liners",
    "email": "e-mails",
    "lang": "other languages",
    "chat": "chats",
    "alert": "json records",
    "device": "json records",
    "order": "json records",
    "profile": "json records",
}


def domain_of_id(item_id: str) -> str:
    """The group of an id `kind-NNN`; the kind itself where it names no known group."""
    kind = item_id.rsplit("-", 1)[0]
    return GROUPS.get(kind, kind)
