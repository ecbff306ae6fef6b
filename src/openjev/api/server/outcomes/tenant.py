"""Whose decisions, outcomes and tasks a request sees: the one place the outcome routes and
the recorder ask it, so that how a caller's tenant is known changes here alone."""

from __future__ import annotations

from openjev.api.server.task_binding import owner


def tenant() -> str:
    """The calling key's tenant, as the task routes know a task's owner ("" without keys)."""
    return owner()
