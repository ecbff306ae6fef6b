"""Whose decisions, outcomes and tasks a request sees: the one place the outcome routes and
the recorder ask it, so that how a caller's tenant is known changes here alone."""

from __future__ import annotations

from starlette.requests import Request

from openjev.api.identity.caller import caller_of


def tenant(request: Request) -> str:
    """The calling key's tenant (core/caller.py; "" without keys), as the task routes know a
    task's owner."""
    return caller_of(request).tenant
