"""Prints the README's settings tables from the settings modules (so the README never drifts), and the section on
the fork's environment variables (backend/startup/fork_env.py)."""

from backend.startup.fork_env import readme_section
from backend.startup.settings import OPTIONS as BACKEND
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
    print()
    # The fork's names are the backend's POC_* settings (the frontend reads none).
    print(readme_section([(o.env, o.flag) for o in BACKEND if o.env.startswith("POC_")]))
