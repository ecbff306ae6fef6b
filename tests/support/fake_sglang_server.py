"""A named fake of an SGLang server process, for testing how openjev starts, checks,
supervises and stops its engine child (`python -m tests.support.fake_sglang_server --model-path
FOLDER --host H --port P`). It speaks the native protocol openjev uses (/health,
/get_model_info, /get_server_info, /generate with input_ids or text, one prompt or a batch of
them, with `max_new_tokens` 0 or 1, /abort_request) and answers with deterministic fake
log-probs. Not a model: the real-server suite runs
SGLang-JAX."""

from __future__ import annotations

import argparse
import time

from tests.support.fake_http_server import Answer, serve
from tests.support.fakes import fake_logprobs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--disable-radix-cache", action="store_true")
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--delay-s", type=float, default=0.0, help="how long each token-id /generate takes")
    args, _ = parser.parse_known_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_path, local_files_only=True)
    info = {
        "model_path": args.model_path,
        "tokenizer_path": args.model_path,
        "is_generation": True,
        "disable_radix_cache": args.disable_radix_cache,
        "context_length": args.context_length,
    }
    if args.context_length is not None:  # as SGLang's scheduler reports it (its KV pool is larger here)
        info["max_req_input_len"] = args.context_length - 1

    def get(path: str) -> Answer:
        if path == "/health":
            return 200, {}
        if path in ("/get_model_info", "/get_server_info"):
            return 200, info
        return 404, {"error": "not found"}

    def post(path: str, body: dict) -> Answer:
        if path == "/abort_request":
            return 200, {}
        if path != "/generate":
            return 404, {"error": "not found"}
        if body.get("input_ids"):
            time.sleep(args.delay_s)  # a forward in progress (the text probe is not delayed)
        if body.get("input_ids") and isinstance(body["input_ids"][0], list):  # a batch, as SGLang 0.5.23 takes it
            items = zip(body["input_ids"], body["token_ids_logprob"], body["rid"], strict=True)
            return 200, [{"text": "", "meta_info": meta(ids, labels, rid, body)} for ids, labels, rid in items]
        ids = body.get("input_ids") or tokenizer(body["text"], add_special_tokens=False)["input_ids"]
        return 200, {"text": "", "meta_info": meta(ids, body.get("token_ids_logprob") or [], body.get("rid"), body)}

    def meta(ids: list[int], labels: list[int], rid: str | None, body: dict) -> dict:
        new_tokens = body["sampling_params"]["max_new_tokens"]
        values = fake_logprobs(ids, len(labels))
        meta = {
            "id": rid,
            "finish_reason": {"type": "length", "length": new_tokens},
            "prompt_tokens": len(ids),
            "completion_tokens": new_tokens,
            "cached_tokens": 0,
            "output_token_ids_logprobs": [[[v, t, None] for v, t in zip(values, labels, strict=True)]],
        }
        if body.get("logprob_start_len") == 0:
            meta["input_token_logprobs"] = [[None if i == 0 else -1.0, t, None] for i, t in enumerate(ids)]
        return meta

    serve(args.host, args.port, get, post)


if __name__ == "__main__":
    main()
