"""Jev's SystemOne format (`POST /v1/systemone`, and the batch): its schemas
(`schemas.py`), the conversion to and from the core's types (`convert.py`), and the
format itself, the pipeline's plug-in (`format.py`)."""
