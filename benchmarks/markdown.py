"""Markdown for the benchmarks' printed tables and docs/results.md (`benchmarks/report.py`)."""


def n(x: float, digits: int = 0) -> str:
    """A figure with thousands separators: n(10572) → '10,572', n(4.7034, 3) → '4.703'."""
    return f"{x:,.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; columns after the first right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])
