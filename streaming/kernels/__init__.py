"""Pure kernels over Arrow and numpy, arrays in and arrays out, no Spark and no I/O: Hilbert keys (hilbert.py),
WKB headers (wkb.py), Arrow buffer views (buffers.py), GeoParquet metadata (geoparquet.py)."""
