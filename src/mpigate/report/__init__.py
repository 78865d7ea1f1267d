"""Compliance reports from audit exports."""
