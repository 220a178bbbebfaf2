"""Table upkeep: maintain.py (maintain: manifests, expiry, orphans), compaction.py (compact along the Hilbert curve),
retention.py (old partitions dropped), plan.py (pure plans from table facts), lease.py (one maintainer at a time),
orphans.py (files no snapshot references), native.py (a native (v3) table's maintenance commits, by Iceberg Java),
copy.py (a table's live rows into a new table of another contract)."""
