"""Outcomes: what a task learns from the true answers of its past decisions. Pure logic,
stdlib only: whether a task's recent answers drifted from its fit's estimate (`drift`), and
whether a fit on the recent answers alone would do better (`refit`)."""
