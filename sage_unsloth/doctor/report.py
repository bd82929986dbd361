"""One result line of ``sage-unsloth doctor``: PASS / WARN / FAIL / SKIP, what was seen, and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass

STATUSES = ("PASS", "WARN", "FAIL", "SKIP")


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    def line(self) -> str:
        text = f"[{self.status}] {self.name:<14} {self.detail}"
        return text + (f"\n       fix: {self.fix}" if self.fix and self.status in ("FAIL", "WARN") else "")

    def to_dict(self) -> dict:
        return asdict(self)


def passed(checks: list[Check]) -> bool:
    return all(c.status != "FAIL" for c in checks)
