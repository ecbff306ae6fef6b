"""The wire contract: what crosses the HTTP edge and how it maps to the core. Pydantic
schemas of both formats (Jev SystemOne, OpenAI Decisions), the strict JSON parse, the
converters to and from `core.types`, the documented statuses, the readout headers and the
served paths. Imports nothing else from `api/`."""
