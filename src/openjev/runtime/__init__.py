"""Engine processes: command lines, start, health, supervision, shutdown."""
