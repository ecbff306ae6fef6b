"""Outcomes: the true answers of past decisions, read back into a task's fit without engine
work, and what a task learns from them. Pure logic, stdlib only: what a decision keeps of
each question (`readings.py`: the option log-probabilities a task's fit consumes); when a
task fed by outcomes is refitted (`schedule.py`); whether a task's recent answers drifted
from its fit's estimate (`drift.py`); and whether a fit on the recent answers alone would do
better (`refit.py`)."""
