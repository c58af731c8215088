"""The SQLite backend: SessionDB over one state.db file, its single writer and its readers."""
