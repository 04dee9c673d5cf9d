"""The usage ledger: its writer, the portable SQL, the SQLite and PostgreSQL stores, the factory."""
