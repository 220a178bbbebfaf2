"""The Iceberg table: catalog.py (open_catalog, create_table), commit.py (Committer: the one idempotent, retried
append of a batch), turns.py (the turns a service's ingest and maintenance commits take), row_delta.py (the snapshot producers pyiceberg lacks: an upsert batch's row delta, a
compaction's rewrite), deletes.py (reading equality deletes), evolve.py (`geoingest table evolve`), native.py (Iceberg v3 tables with
native geometry, made and committed to by Iceberg Java)."""
