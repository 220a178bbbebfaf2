"""Reading a table: query.py (query: spatial predicates, pruned by manifests and row groups, exact with shapely),
projection.py (files read by field id), output.py (GeoJSON lines, GeoParquet), inspect.py (file extents, the picture)."""
