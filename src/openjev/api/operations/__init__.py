"""What operators see and what protects the process: connections and HTTP framing under
uvicorn, request ids and body limits, metrics, the access log, and what a client may learn
of an error (disclosure). Imports only `api.contract` from `api/`."""
