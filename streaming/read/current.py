"""The current rows of some keys of an upsert table, read by a reducer on an executor: the values a
change event did not carry (streaming/write/versions.py `CurrentRows`) are the key's current ones.

The executor has no catalog: it reads the table's metadata file the driver named (the table as
the batch found it, which holds every earlier batch of this writer) through the table's FileIO.
Every live data file's key column is read (files are laid out along the Hilbert curve, not by
key, so manifests prune little), the rows of the wanted keys kept, the later equality deletes
applied, and only then the wanted columns of those rows read. It runs only for rows whose event
lacked a value: with the connector settings docs/debezium.md gives, rarely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.table import StaticTable

from streaming.read.projection import FieldIdProjection
from streaming.table.deletes import EqualityDeletes, listed_mask, snapshot_files


@dataclass(frozen=True)
class TableRows:
    """`CurrentRows` of the table whose metadata file is `metadata_location` ("": an empty table)."""

    metadata_location: str
    io_properties: dict[str, str]

    def __call__(self, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
        key_columns = list(keys.column_names)
        wanted = [*key_columns, *(c for c in columns if c not in key_columns)]
        if not self.metadata_location or keys.num_rows == 0:
            return pa.table({name: pa.array([], keys.schema.field(name).type) for name in key_columns})
        table = StaticTable.from_metadata(self.metadata_location, properties=self.io_properties)
        snapshot = table.current_snapshot()
        schema = table.schema()
        projection = FieldIdProjection(schema.select(*wanted))
        if snapshot is None:
            return projection.arrow_schema.empty_table()
        planned = snapshot_files(table, snapshot)
        deletes = EqualityDeletes(table, planned.reaching_deletes())
        found: list[pa.Table] = []
        for data in planned.data:
            path = data.file.file_path
            with table.io.new_input(path).open() as stream:
                parquet = pq.ParquetFile(stream, pre_buffer=True)
                key_projection = FieldIdProjection(schema.select(*key_columns))
                file_keys = key_projection(
                    parquet.read(columns=key_projection.columns_to_read(parquet.schema_arrow)), path
                )
                hits = listed_mask(file_keys, key_columns, keys)
                if not hits.any():
                    continue
                rows = projection(parquet.read(columns=projection.columns_to_read(parquet.schema_arrow)), path)
            rows = rows.filter(pa.array(hits))
            found.append(deletes.live(rows, data.sequence_number))
        return pa.concat_tables(found) if found else projection.arrow_schema.empty_table()
