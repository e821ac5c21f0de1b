"""Template ftd rule plugin (see rule.py)."""
