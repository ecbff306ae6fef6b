"""POST /v1/decisions: OpenAI's Decisions API over the same DecisionService as /v1/systemone.

The body is converted once (api/contract/openai_convert.py) into the core's DecisionRequest; from
there it is the same path: the caller's cache namespace (api/identity/tenancy.py, here partitioned by
`prompt_cache_key`), the readout-override headers, admission and per-key limits (the gated
engine, api/identity/admission.py), calibration, the abstain rule, metrics and the access log. Its errors
leave in OpenAI's shape (api/contract/faces.py).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from openjev.api.contract import convert, documented
from openjev.api.contract import openai_convert as oc
from openjev.api.contract import openai_schemas as oa
from openjev.api.contract.overrides import decide_options
from openjev.api.contract.responses import FastJSONResponse
from openjev.api.identity import tenancy
from openjev.api.identity.auth import require_key
from openjev.api.operations.logs import pseudonym
from openjev.api.operations.middleware import request_id_of
from openjev.api.server.assembly import Runtime
from openjev.config import Settings

log = logging.getLogger(__name__)

PATH = "/v1/decisions"


def _error(text: str) -> dict[str, Any]:
    return {"description": text, "model": oa.DecisionErrorBody}


# The statuses documented.DECISION_ERRORS lists, in OpenAI's shape; validation is a 400 here.
OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    code: _error(spec["description"]) for code, spec in documented.DECISION_ERRORS.items() if code != 422
}
OPENAI_ERRORS[400] = _error(
    "invalid_request_error, `param` naming the field: the body's schema, a Jev-shaped body (send it to "
    "/v1/systemone), more questions than --max-questions, an input_image, a tool output without its call, "
    "a token budget exceeded (context_length_exceeded), invalid JSON, NaN, repeated keys, lone surrogates, "
    "nesting deeper than max_json_depth, a bad x-openjev-* header; also a corrupt gzip/zstd body or a "
    "refused Host"
)
# Any other client error (405, 408, 431 ...) leaves in the same shape; OpenAI has no 422.
OPENAI_ERRORS["4XX"] = _error(
    "any other client error the app answers (e.g. 405), in the same shape (the 408 and 431 of a slow or "
    "oversized request head come from the connection layer, before any route is known, in Jev's shape)"
)


def install(app: FastAPI, settings: Settings, runtime: Runtime, unless_disconnected: Any) -> None:
    async def decisions(body: oa.DecisionCreate, request: Request) -> JSONResponse:
        decision = oc.request_of(body, settings.max_questions)
        decision = tenancy.partitioned(tenancy.scoped(decision), oc.cache_partition(body.prompt_cache_key))
        spec, calibrate = decide_options(request.headers, settings)
        service, card = runtime.ready()
        model = convert.resolve_model(body.model, card.name)
        if body.safety_identifier is not None:  # the value itself is never logged
            log.info(
                "safety_identifier",
                extra={
                    "fields": {
                        "request_id": request_id_of(request.scope),
                        "safety_identifier_hmac": pseudonym(body.safety_identifier),
                    }
                },
            )
        result = await unless_disconnected(request, service.decide(decision, readout=spec, calibrate=calibrate))
        request.state.result = result  # for the access log and metrics (api/operations/access.py)
        return FastJSONResponse(oc.result_to_wire(body, result, model), headers=convert.result_headers(result))

    app.add_api_route(
        PATH,
        decisions,
        methods=["POST"],
        response_model=oa.Decision,
        responses=OPENAI_ERRORS,
        openapi_extra={"parameters": documented.READOUT_HEADERS},
        dependencies=[Depends(require_key)],
        summary="Answer typed questions about an input (OpenAI's Decisions format)",
    )
