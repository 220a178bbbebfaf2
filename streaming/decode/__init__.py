"""Records to rows: one module per input format (formats/), the table's geometry rules and reprojection (validate.py,
crs.py), the bbox covering (covering.py), columns and properties, reject reasons, the time budget; entry point
decoder.py: Decoder, DecodeOptions."""
