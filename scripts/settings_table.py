"""Prints the README's settings tables from the settings modules (so the README never drifts)."""

from backend.settings import OPTIONS as BACKEND
from frontend.settings import OPTIONS as FRONTEND


def table(title: str, options) -> str:
    rows = [f"### {title}", "", "| flag | environment variable | default | meaning |", "|---|---|---|---|"]
    for o in options:
        rows.append(f"| `{o.flag}` | `{o.env}` | `{o.default!r}` | {o.help} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table("Backend (`python -m backend`)", BACKEND))
    print()
    print(table("Frontend (`python -m frontend`)", FRONTEND))
