"""The verdict: the rule, a stored check's verdict, an A/B ratio's, a test's and a run's outcome, their text."""
