"""The ledger: what gmd remembers. SQLAlchemy models, the store, interval accounting."""
