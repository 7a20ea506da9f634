//! Nothing but tests: see `tests/` (each file one suite; `tests/e2e/` one file per scenario).
