"""Lockstep A/B against a base commit: both sides measured in one job, taking turns on one machine."""
