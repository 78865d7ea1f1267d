"""What a rule check returns before modes and exceptions are applied."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WARNING_LIMIT", "Finding", "short_warning"]

# The API server truncates each response warning; kubectl prints them one per line.
WARNING_LIMIT = 120


@dataclass(frozen=True, slots=True)
class Finding:
    """One rule hit: ``path`` as a user reads it, ``message`` with the numbers, ``fix`` what to do.

    ``short`` is the gist for ``response.warnings`` (the full text stays in the violation).
    ``value`` identifies the offending value where the message does not show it (a digest of a
    credential); it is never shown, only compared: on UPDATE a finding is grandfathered only when
    the stored object has an :attr:`identity`-equal one.
    """

    rule: str
    path: str
    message: str
    fix: str = ""
    short: str = ""
    value: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.rule, self.path, self.message)

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """Rule, path, message (which names the value) and the hidden value: what makes two
        findings the same finding."""
        return (self.rule, self.path, self.message, self.value)


def short_warning(rule: str, text: str) -> str:
    """``[ID] text`` cut to :data:`WARNING_LIMIT` characters (with an ellipsis when cut)."""
    full = f"[{rule}] {' '.join(text.split())}"
    if len(full) <= WARNING_LIMIT:
        return full
    return full[: WARNING_LIMIT - 1].rstrip() + "…"
