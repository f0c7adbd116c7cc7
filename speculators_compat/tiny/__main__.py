"""``python -m speculators_compat.tiny``: regenerate the embedded chat dataset or build a fixture."""

from speculators_compat.cli import fixtures

if __name__ == "__main__":
    fixtures(prog_name="python -m speculators_compat.tiny")
