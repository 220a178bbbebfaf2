"""Reading a table: query.py (query: pruned by partitions, manifests and row groups, exact with shapely), predicate.py
(Predicate, parse_bbox), bounds.py (each file's and row group's bounds: the covering's or the geometry's own),
projection.py (files read by field id), output.py (GeoJSON, GeoParquet), inspect.py (extents)."""
