"""The wire contract: what crosses the HTTP edge and how it maps to the core. Each format in
a folder of its own (`jev/`, `openai/`: schemas, conversion, the format); what they share
beside them: the format port (`format_port.py`) and registry (`formats.py`), the strict
JSON parser (`strict_json.py`) and the routes that apply it (`json_route.py`), what every
format does with a parsed body (`common.py`), the documented statuses, the readout headers
and the served paths. Imports nothing else from `api/`."""
