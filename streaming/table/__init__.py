"""The Iceberg table: catalog.py (open_catalog, create_table), commit.py (Committer: the one idempotent, retried
append of a batch), row_delta.py, deletes.py (reading equality deletes), evolve.py (`geoingest table evolve`)."""
