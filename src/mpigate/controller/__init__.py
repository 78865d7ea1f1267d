"""The in-cluster controller (kopf): per-job NetworkPolicy, lifecycle and residency evidence."""
