"""Reading a table: query.py (query: pruned by partitions, manifests and row groups, exact with shapely), predicate.py
(Predicate, parse_bbox), projection.py (files read by field id), output.py (GeoJSON, GeoParquet), inspect.py (extents)."""
