"""Compliance reports from the audit trail: SOC 2, HIPAA, GDPR and PCI DSS control evidence,
chargeback, integrity — as HTML, Markdown, JSON or CSV.

::

    from mpigate.audit import KeyRing
    from mpigate.report import ReportOptions, build_report, render

    report = build_report(["/var/lib/mpigate/audit"], ["/var/log/kubernetes/audit.log"],
                          keys=KeyRing.load(public_key_files=["audit-key.pub"]),
                          options=ReportOptions(since="2026-11-01T00:00:00.000Z", frameworks=("soc2",)))
    html = render(report, "html")

Reading streams (memory does not grow with the number of records); see docs/compliance.md.
"""

from .aggregate import ReportBuilder, ReportOptions
from .assess import STATUS_RULES, EvidenceFacts, assess_control
from .build import build_report, config_context
from .controls import RECORD_KINDS, Control, Framework, all_frameworks, framework, parse_frameworks
from .k8saudit import ApiEvent, K8sAuditReader, K8sAuditStats
from .output import CSV_COLUMNS, FORMATS, render, report_schema

__all__ = [
    "CSV_COLUMNS",
    "FORMATS",
    "RECORD_KINDS",
    "STATUS_RULES",
    "ApiEvent",
    "Control",
    "EvidenceFacts",
    "Framework",
    "K8sAuditReader",
    "K8sAuditStats",
    "ReportBuilder",
    "ReportOptions",
    "all_frameworks",
    "assess_control",
    "build_report",
    "config_context",
    "framework",
    "parse_frameworks",
    "render",
    "report_schema",
]
