//! Views and reprs of the v1 wire format (see `docs/wire-format.md`).
