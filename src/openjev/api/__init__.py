"""The HTTP edge: FastAPI app, wire schemas (pydantic lives only here), conversion, middleware."""
