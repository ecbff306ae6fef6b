"""openjev: an open server for the Jev SystemOne decision API.

Decisions are read from the model, not written: one prefill per branch and the
log-probabilities of label tokens at the last position; no text is generated.
"""

__version__ = "0.1.0"
