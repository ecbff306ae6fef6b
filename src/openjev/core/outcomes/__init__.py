"""Outcomes: the true answers of past decisions, read back into a task's fit without engine
work. `readings.py`: what a decision keeps of each question (the option log-probabilities a
task's fit consumes); `schedule.py`: when a task fed by outcomes is refitted."""
