"""The live terminal dashboard (`met serve` in a terminal, `met top`)."""

from met.tui.app import Dashboard, run_dashboard

__all__ = ["Dashboard", "run_dashboard"]
