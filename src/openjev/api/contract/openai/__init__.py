"""OpenAI's Decisions format (`POST /v1/decisions`): what a request reads (`items.py`), its
questions and body (`schemas.py`), the answer's shape (`answers.py`), the conversion to and
from the core's types (`convert.py`), and the format itself, the pipeline's plug-in
(`format.py`)."""
