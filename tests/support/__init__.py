"""Helpers shared by every family's tests (import as `support.<module>`; tests/ is on sys.path via conftest)."""
