"""The HTTP edge (pydantic lives only here), grouped by job: `contract` (what crosses the
edge), `operations` (what operators see, what guards the process), `identity` (who calls,
what they may do) and `server` (the app assembled). docs/architecture.md gives their rule."""
