"""A named fake of an SGLang server process, for testing how openjev starts, checks,
supervises and stops its engine child (`python -m tests.fake_sglang_server --model-path
FOLDER --host H --port P`). It speaks the native protocol openjev uses (/health,
/get_model_info, /get_server_info, /generate with input_ids or text, /abort_request) and
answers with deterministic fake log-probs. Not a model: the real-server suite runs
SGLang-JAX."""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.fakes import fake_logprobs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--disable-radix-cache", action="store_true")
    args, _ = parser.parse_known_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_path, local_files_only=True)
    info = {
        "model_path": args.model_path,
        "tokenizer_path": args.model_path,
        "is_generation": True,
        "disable_radix_cache": args.disable_radix_cache,
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:  # quiet
            pass

        def _json(self, status: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {})
            elif self.path in ("/get_model_info", "/get_server_info"):
                self._json(200, info)
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if self.path == "/abort_request":
                self._json(200, {})
                return
            if self.path != "/generate":
                self._json(404, {"error": "not found"})
                return
            ids = body.get("input_ids") or tokenizer(body["text"], add_special_tokens=False)["input_ids"]
            labels = body.get("token_ids_logprob") or []
            values = fake_logprobs(ids, len(labels))
            meta = {
                "id": body.get("rid"),
                "finish_reason": {"type": "length", "length": 1},
                "prompt_tokens": len(ids),
                "completion_tokens": 1,
                "cached_tokens": 0,
                "output_token_ids_logprobs": [[[v, t, None] for v, t in zip(values, labels, strict=True)]],
            }
            if body.get("logprob_start_len") == 0:
                meta["input_token_logprobs"] = [[None if i == 0 else -1.0, t, None] for i, t in enumerate(ids)]
            self._json(200, {"text": "", "meta_info": meta})

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
