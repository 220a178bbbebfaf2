"""Pure kernels over Arrow and numpy, arrays in and arrays out, no Spark and no I/O: Hilbert keys
(hilbert.py), geohash cells (geohash.py), WKB headers (wkb.py), anti-meridian boxes (antimeridian.py),
raster footprints (raster_bounds.py), primary-key hashes (key_hash.py), hexadecimal and base64 text
(text_encodings.py), Arrow buffer views (buffers.py), GeoParquet metadata (geoparquet.py)."""
