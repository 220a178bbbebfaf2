"""The input formats, each a module of its own, and the one place they are registered.

A format is an `InputFormat` (streaming/decode/formats/base.py): the contract `formats` names it reads,
the first byte that tells its values apart, and `decode`, which reads the values it claims into
the batch's `Decoded`. The decoder (streaming/decode/decoder.py) routes each value to the format its first
significant byte names; the geometry rules (streaming/decode/validate.py) and the column mapping
(streaming/decode/columns.py) then apply to every format alike.
"""

from __future__ import annotations

from streaming.decode.formats.avro import AvroFormat
from streaming.decode.formats.base import Decoded, InputFormat
from streaming.decode.formats.debezium import DebeziumFormat
from streaming.decode.formats.geojson import GeoJsonFormat
from streaming.decode.formats.gpkg import GeoPackageFormat
from streaming.decode.formats.json_fields import JsonFieldsFormat
from streaming.decode.formats.protobuf import ProtobufFormat
from streaming.decode.formats.stac import StacFormat
from streaming.decode.formats.wkb import WkbFormat
from streaming.decode.formats.wkt import WktFormat

# Every input format; their `names` together are the contract's FORMATS.
INPUT_FORMATS: tuple[type[InputFormat], ...] = (
    GeoJsonFormat,
    WkbFormat,
    GeoPackageFormat,
    JsonFieldsFormat,
    WktFormat,
    AvroFormat,
    ProtobufFormat,
    StacFormat,
    DebeziumFormat,
)

__all__ = ["INPUT_FORMATS", "Decoded", "InputFormat"]
