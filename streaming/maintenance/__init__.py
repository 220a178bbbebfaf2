"""Table upkeep: maintain.py (maintain: manifests, expiry, orphans), compaction.py (compact along the Hilbert curve),
plan.py (pure plans from table facts), lease.py (one maintainer at a time), orphans.py (files no snapshot references)."""
