"""The tamper-evident audit trail: hash-chained JSONL, verify, export, OTLP."""
