"""The envelope of POST /v1/systemone/batch (api/server/batch.py): `requests`, each a
/v1/systemone body validated one by one, or one question set over many `states`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from openjev.api.contract.jev import schemas


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: list[Any] | None = Field(
        None, min_length=1, description="items, each a /v1/systemone body (validated one by one)"
    )
    model: str = Field("jev-latest", description="states form: the model every item asks")
    questions: dict[str, schemas.Question] | None = Field(
        None, min_length=1, description="states form: the questions asked about every state"
    )
    states: list[Any] | None = Field(None, min_length=1, description="states form: one item per state")

    @model_validator(mode="after")
    def _one_form(self) -> BatchRequest:
        if self.requests is not None:
            if self.states is not None or self.questions is not None:
                raise ValueError("send either `requests` or `questions` with `states`, not both")
        elif self.states is None or self.questions is None:
            raise ValueError("send `requests` (a list of /v1/systemone bodies) or `questions` with `states`")
        return self
