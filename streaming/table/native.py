"""Iceberg v3 tables whose geometry column is Iceberg's own `geometry` type, made and appended to by
Iceberg Java 1.12 in a JVM of this process's own.

pyiceberg 0.12 writes no v3 metadata nor v3 manifests (apache/iceberg-python#1551), so the table's
metadata is Iceberg Java's: its catalog client, its schema and spec parsers, its manifest writers.
The JVM is a plain one started through py4j with Iceberg's runtime jar, the catalog's JDBC driver and
Spark's own jars (Hadoop's file system for `file://` and HDFS warehouses); it serves the driver and
the CLI alike, neither of which needs a Spark session for it.

Only the geometry bounds are ours: Iceberg's writer takes them from each value it writes
(GeometryFieldMetrics), and for a file written elsewhere its footer reader records none (ParquetMetrics
skips geometry columns). Parquet keeps the column's geospatial statistics, which the data files'
writer reads back (DataFileRecord.geometry_extent), and Iceberg's own GeospatialBound serializes them.
"""

from __future__ import annotations

import datetime
import json
import re
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyiceberg.types
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.types import GeometryType

from streaming.write.data_files import DataFileRecord

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

FORMAT_VERSION = 3

# Iceberg Java writes a geometry type as the spec spells it, `geometry(OGC:CRS84)`; pyiceberg 0.12
# parses only a quoted CRS (`geometry('OGC:CRS84')`) and so cannot load such a table at all. Its
# parser reads this module-level pattern, which is made to take the CRS quoted or not.
pyiceberg.types.GEOMETRY_REGEX = re.compile(r"geometry(?:\(\s*['\"]?([^'\")]+?)['\"]?\s*\))?$")


class NativeTableError(RuntimeError):
    """A native-geometry table cannot be made or written here; the message names the cause."""


_classpath_and_java: Callable[[], tuple[Sequence[Path], Path]] | None = None


def configure(classpath_and_java: Callable[[], tuple[Sequence[Path], Path]]) -> None:
    """How to start the JVM when a native table is first met: the caller's jars and java (the
    app layer's: app.maven.iceberg_java_classpath, app.java.java_executable), asked then only."""
    global _classpath_and_java
    _classpath_and_java = classpath_and_java


def is_native(table: Table) -> bool:
    """A v3 table with a geometry column of Iceberg's type: written through Iceberg Java."""
    return table.metadata.format_version >= FORMAT_VERSION and any(
        isinstance(f.field_type, GeometryType) for f in table.schema().fields
    )


def native_catalog(catalog: Catalog) -> NativeCatalog:
    """The Iceberg Java catalog on the same settings as pyiceberg's `catalog`."""
    return IcebergJava.shared().catalog(catalog.name, catalog.properties)


def native_table(table: Table) -> NativeTable:
    """Iceberg Java's handle on the table pyiceberg loaded."""
    return native_catalog(table.catalog).load_table(".".join(table.name()))


@contextmanager
def java_commit_errors() -> Iterator[None]:
    """Iceberg Java's commit failures as pyiceberg's, which the committer retries."""
    from py4j.protocol import Py4JJavaError

    try:
        yield
    except Py4JJavaError as exc:
        name = str(exc.java_exception.getClass().getName())
        message = str(exc.java_exception.getMessage())
        if name.endswith(("CommitFailedException", "ValidationException")):
            raise CommitFailedException(message) from None
        if name.endswith("CommitStateUnknownException"):
            raise CommitStateUnknownException(message) from None
        if name.endswith(_CATALOG_UNAVAILABLE):
            # The catalog was not there (SQLite locked or gone, a REST server down or failing):
            # the committer waits for it as for pyiceberg's own such errors.
            raise ConnectionError(f"Iceberg Java: {name}: {message}") from None
        raise NativeTableError(f"Iceberg Java: {name}: {message}") from None


_CATALOG_UNAVAILABLE = (
    "UncheckedSQLException",
    "SQLException",
    "SQLiteException",
    "ServiceUnavailableException",
    "ServiceFailureException",
)


class IcebergJava:
    """A JVM with Iceberg Java, reached through py4j; one per process (`shared`)."""

    _shared: IcebergJava | None = None
    _lock = threading.Lock()

    def __init__(self, classpath: Sequence[Path], java: Path) -> None:
        """`classpath`: Iceberg Java's jars, the catalog's JDBC driver, Spark's jars (app.maven's
        iceberg_java_classpath); `java`: the java to run."""
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

        py4j_jar = next(Path(j) for j in classpath if j.name.startswith("py4j-"))
        port = launch_gateway(
            jarpath=str(py4j_jar),
            classpath=":".join(str(j) for j in classpath),
            java_path=str(java),
            # The AWS SDK would read ~/.aws and ask the EC2 metadata service for what the catalog's
            # s3.* settings leave out (an S3 warehouse): it is to take those settings alone.
            javaopts=["-Xmx512m", "-XX:+UseSerialGC", "-Daws.disableEc2Metadata=true"],
            die_on_exit=True,
            redirect_stderr=None,
        )
        self.gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port, auto_convert=True))
        self.jvm = self.gateway.jvm
        self.iceberg = self.jvm.org.apache.iceberg
        self._catalogs: dict[tuple, NativeCatalog] = {}
        self._members: dict[str, Any] = {}

    def unhurried(self, operation: Any) -> Any:
        """A snapshot operation whose manifest work runs in the calling thread. On Iceberg's worker
        pool, each of its parallel steps (writing the new files' manifest, merging manifests,
        reading the parent's) waits for its tasks by polling every 10 ms (Tasks.waitFor): 39 ms
        of a native commit's 57 ms were spent so, measured on a small append; run in the caller's
        thread, each task is done when the wait begins."""
        direct = self.member(
            "org.apache.iceberg.relocated.com.google.common.util.concurrent.MoreExecutors.newDirectExecutorService"
        )
        operation.scanManifestsWith(direct())
        return operation

    def member(self, path: str) -> Any:
        """A class, or a static method or field of one ("org.apache.iceberg.DataFiles.builder"),
        looked up once per process: py4j resolves each dotted name with a round trip to the JVM,
        which made up most of a native commit's cost (about 120 round trips per data file)."""
        found = self._members.get(path)
        if found is None:
            found = self.jvm
            for name in path.split("."):
                found = getattr(found, name)
            self._members[path] = found
        return found

    @classmethod
    def shared(cls) -> IcebergJava:
        """This process's JVM, started on first use as `configure` said."""
        with cls._lock:
            if cls._shared is None:
                if _classpath_and_java is None:
                    raise NativeTableError("native-geometry tables: no Iceberg Java configured in this process")
                cls._shared = cls(*_classpath_and_java())
            return cls._shared

    def java_map(self, values: Mapping[str, str]) -> Any:
        out = self.jvm.java.util.HashMap()
        for key, value in values.items():
            out.put(key, value)
        return out

    def catalog(self, name: str, properties: Mapping[str, str]) -> NativeCatalog:
        """The catalog of these settings, opened once per process: each opening is a JDBC pool,
        or a REST client, of its own."""
        key = (name, tuple(sorted(properties.items())))
        with self._lock:
            if key not in self._catalogs:
                self._catalogs[key] = NativeCatalog(self, name, properties)
            return self._catalogs[key]


def java_catalog_properties(properties: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """(Iceberg Java catalog class, its properties) for the service's catalog settings, which are
    pyiceberg's: a SQLite SQL catalog is Iceberg's JDBC catalog on the same tables
    (iceberg_tables, iceberg_namespace_properties), a REST catalog is the same on both sides."""
    props = {k: v for k, v in properties.items() if not k.startswith("geoingest.")}
    uri = props.get("uri", "")
    warehouse = props.get("warehouse", "")
    scheme = warehouse.partition("://")[0] if "://" in warehouse else "file"
    if scheme in ("s3", "s3a"):
        # Iceberg's S3FileIO takes pyiceberg's s3.* settings under the same names, but the region.
        props.setdefault("io-impl", "org.apache.iceberg.aws.s3.S3FileIO")
        if "s3.region" in props:
            props.setdefault("client.region", props.pop("s3.region"))
    elif scheme != "file":
        raise NativeTableError(
            f"warehouse {warehouse!r}: native-geometry tables are written to file:// and s3:// warehouses"
        )
    kind = props.pop("type", "sql" if uri.startswith("sqlite:") else "rest" if uri.startswith("http") else "")
    if kind == "sql" or uri.startswith("sqlite:"):
        if not uri.startswith("sqlite:///"):
            raise NativeTableError(f"catalog uri {uri!r}: native-geometry tables take a SQLite file (sqlite:///...)")
        props["uri"] = "jdbc:sqlite:" + uri.removeprefix("sqlite:///")
        props.setdefault("jdbc.schema-version", "V1")
        # SQLite's JDBC driver fails at once on a database another writer holds (pyiceberg's
        # SQLAlchemy waits 5 s); this one waits as long as a commit's retries may take.
        props.setdefault("jdbc.busy_timeout", "30000")
        props.pop("init_catalog_tables", None)
        return "org.apache.iceberg.jdbc.JdbcCatalog", props
    if kind == "rest":
        return "org.apache.iceberg.rest.RESTCatalog", props
    raise NativeTableError(f"catalog type {kind!r}: native-geometry tables are written to SQLite and REST catalogs")


class NativeCatalog:
    """An Iceberg Java catalog opened on the service's catalog settings."""

    def __init__(self, java: IcebergJava, name: str, properties: Mapping[str, str]) -> None:
        self.java = java
        impl, props = java_catalog_properties(properties)
        conf = java.jvm.org.apache.hadoop.conf.Configuration()
        # Hadoop's default local file system writes a .crc file beside every file it writes,
        # metadata and manifests alike; the warehouse gets the files Iceberg writes, nothing more.
        conf.set("fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
        self.catalog = java.iceberg.CatalogUtil.loadCatalog(impl, name, java.java_map(props), conf)

    def _identifier(self, table: str) -> Any:
        return self.java.iceberg.catalog.TableIdentifier.parse(table)

    def create_table(
        self,
        table: str,
        schema_json: str,
        geometry_id: int,
        crs: str | None = None,
        properties: Mapping[str, str] | None = None,
        partition: Sequence[tuple[str, str, str]] = (),
    ) -> NativeTable:
        """A v3 table of the schema (pyiceberg's JSON) with field `geometry_id` made `geometry`
        in `crs` (None: OGC:CRS84), created if missing with `properties`; its namespace too.
        Unpartitioned first (spec 0), the `partition` fields (column, Iceberg transform as text,
        name) on top as spec 1, in one commit: as a v2 table, an upsert table's equality deletes
        go to spec 0, where they reach every partition."""
        iceberg = self.java.iceberg
        identifier = self._identifier(table)
        if not self.catalog.tableExists(identifier):
            namespace = identifier.namespace()
            if not self.catalog.namespaceExists(namespace):
                try:
                    self.catalog.createNamespace(namespace)
                except Exception as exc:  # another writer made it meanwhile
                    if "AlreadyExists" not in str(exc):
                        raise
            schema = iceberg.SchemaParser.fromJson(native_schema_json(schema_json, geometry_id, crs))
            table_properties = {**(properties or {}), iceberg.TableProperties.FORMAT_VERSION: str(FORMAT_VERSION)}
            try:
                create = self.catalog.newCreateTableTransaction(
                    identifier, schema, iceberg.PartitionSpec.unpartitioned(), self.java.java_map(table_properties)
                )
                if partition:
                    update = create.updateSpec()
                    for column, transform, name in partition:
                        kind = schema.findField(column).type()
                        term = iceberg.expressions.Expressions.transform(
                            column, iceberg.transforms.Transforms.fromString(kind, transform)
                        )
                        update = update.addField(name, term)
                    update.commit()
                create.commitTransaction()
            except Exception as exc:
                if "AlreadyExists" not in str(exc):
                    raise
        return self.load_table(table)

    def load_table(self, table: str) -> NativeTable:
        return NativeTable(self.java, self.catalog.loadTable(self._identifier(table)))


def partition_json(kind: str, value: Any) -> Any:
    """A partition value as Iceberg's JSON of it (SingleValueParser): a date (a day transform's days
    since 1970-01-01) as ISO 8601, a timestamp (microseconds) as ISO 8601, any other as it is."""
    if value is None:
        return None
    if kind == "DATE":
        return (datetime.date(1970, 1, 1) + datetime.timedelta(days=int(value))).isoformat()
    if kind in ("TIMESTAMP", "TIMESTAMPTZ"):
        moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=int(value))
        return moment.isoformat(timespec="microseconds") + ("+00:00" if kind == "TIMESTAMPTZ" else "")
    return value


def geometry_bound(x: float, y: float) -> bytes:
    """A geometry bound as the v3 spec stores an XY point (appendix D): x then y, little-endian doubles."""
    return struct.pack("<dd", x, y)


def native_schema_json(schema_json: str, geometry_id: int, crs: str | None) -> str:
    """The schema with the geometry field's type `geometry` (in `crs`, unless the default)."""
    schema = json.loads(schema_json)
    fields = [f for f in schema["fields"] if f["id"] == geometry_id]
    if not fields:
        raise NativeTableError(f"the schema has no field {geometry_id} to make geometry")
    fields[0]["type"] = "geometry" if crs in (None, "OGC:CRS84") else f"geometry({crs})"
    return json.dumps(schema)


class NativeTable:
    """A v3 table, loaded by Iceberg Java."""

    def __init__(self, java: IcebergJava, table: Any) -> None:
        self.java = java
        self.table = table
        # Looked up once per table handle, or per commit (each lookup is a round trip to the JVM).
        self._specs: dict[int, Any] | None = None
        self._partition_kinds: dict[int, list[str]] = {}

    @property
    def format_version(self) -> int:
        return int(self.java.iceberg.TableUtil.formatVersion(self.table))

    @property
    def metadata_location(self) -> str:
        return str(self.table.operations().current().metadataFileLocation())

    def current_snapshot_id(self) -> int | None:
        self.table.refresh()
        current = self.table.currentSnapshot()
        return None if current is None else int(current.snapshotId())

    def schema_json(self) -> str:
        return str(self.java.iceberg.SchemaParser.toJson(self.table.schema()))

    def summaries(self) -> list[dict[str, str]]:
        """Every snapshot's summary, oldest first."""
        self.table.refresh()
        return [dict(s.summary()) for s in self.table.snapshots()]

    def append(
        self,
        files: Iterable[DataFileRecord],
        geometry_id: int,
        summary: Mapping[str, str],
        checked_snapshot_id: int | None = None,
    ) -> int:
        """Append data files, each under the spec it was written for (the table's default when
        it names none), in one snapshot carrying `summary`; returns its id."""
        default = int(self.table.spec().specId())
        data = [(record, default if record.spec_id is None else record.spec_id) for record in files]
        return self.commit(data, (), (), geometry_id, summary, checked_snapshot_id)

    def commit(
        self,
        files: Sequence[tuple[DataFileRecord, int]],
        delete_files: Sequence[tuple[DataFileRecord, int]],
        equality_ids: Sequence[int],
        geometry_id: int,
        summary: Mapping[str, str],
        checked_snapshot_id: int | None,
        added: Sequence[tuple[tuple[str, ...], str]] = (),
        widened: Sequence[tuple[str, str]] = (),
    ) -> int:
        """Data files and equality delete files (on `equality_ids`), each under the spec id given
        with it, in one snapshot carrying `summary`; returns its id. With the columns and struct
        members `added` (path, type as pyiceberg's JSON) and the columns `widened` (name, type)
        made the table's in the same commit (schema evolution).

        `checked_snapshot_id`: the snapshot the caller's replay check saw (None: an empty table).
        Iceberg Java retries a conflicting commit by itself, re-applied to the refreshed table; an
        append that another writer made since that snapshot (a second instance committing the
        same batch) makes it fail instead (a ValidationException, raised as CommitFailedException),
        so that the caller checks again. Rewrites and expiries since then are re-applied over."""
        self._specs = None  # the table's, as of this commit
        transaction = self.table.newTransaction() if added or widened else None
        if transaction is not None:
            update = transaction.updateSchema()
            for path, kind in added:
                parent = ".".join(path[:-1]) or None
                update = update.addColumn(parent, path[-1], self._java_type(kind))
            for name, kind in widened:
                update = update.updateColumn(name, self._java_type(kind))
            update.commit()
        delta = self.java.unhurried((transaction or self.table).newRowDelta())
        for record, spec_id in files:
            delta = delta.addRows(self.data_file(record, spec_id, geometry_id))
        for record, spec_id in delete_files:
            delta = delta.addDeletes(self._delete_file(record, spec_id, equality_ids))
        if checked_snapshot_id is not None:
            delta = delta.validateFromSnapshot(checked_snapshot_id)
        delta = delta.conflictDetectionFilter(
            self.java.member("org.apache.iceberg.expressions.Expressions.alwaysTrue")()
        )
        delta = delta.validateNoConflictingDataFiles()
        for key, value in summary.items():
            delta = delta.set(key, value)
        with java_commit_errors():
            delta.commit()
            if transaction is not None:
                transaction.commitTransaction()
        self.table.refresh()
        return int(self.table.currentSnapshot().snapshotId())

    def evolve(
        self,
        read_location: str,
        columns: Sequence[tuple[str, str, str | None]],
        partition_removed: Sequence[str],
        partition_added: Sequence[tuple[str, str, str]],
        properties: Mapping[str, str],
    ) -> None:
        """Change the schema, the partition spec and properties in one commit on the metadata at
        `read_location` (CommitFailedException when the table changed since). `columns`: (rename,
        column, new name), (widen, column, type), (make-optional, column, None), (drop, column,
        None), (add, column, type), types as pyiceberg's JSON, in order; `partition_added`:
        (column, Iceberg transform as text, field name).

        Iceberg Java stages the changes in a transaction, whose metadata is then committed as one
        attempt: its own commit would re-apply them to a table changed meanwhile, and columns
        added there would take other ids than the contract gives them."""
        with java_commit_errors():
            self.table.refresh()
            base = self.table.operations().current()
            if str(base.metadataFileLocation()) != read_location:
                raise CommitFailedException("the table changed since the changes were planned")
            transaction = self.table.newTransaction()
            if columns:
                update = transaction.updateSchema()
                for kind, column, argument in columns:
                    if kind == "rename":
                        update.renameColumn(column, argument)
                    elif kind == "widen":
                        update.updateColumn(column, self._java_type(str(argument)))
                    elif kind == "make-optional":
                        update.makeColumnOptional(column)
                    elif kind == "drop":
                        update.deleteColumn(column)
                    elif kind == "add":
                        update.addColumn(column, self._java_type(str(argument)))
                    else:
                        raise NativeTableError(f"column change {kind!r} of {column}: not one Iceberg makes here")
                update.commit()
            if partition_removed or partition_added:
                spec = transaction.updateSpec()
                for name in partition_removed:
                    spec.removeField(name)
                schema = transaction.table().schema()
                expressions, transforms = self.java.iceberg.expressions.Expressions, self.java.iceberg.transforms
                for column, transform, name in partition_added:
                    kind = schema.findField(column).type()
                    spec.addField(
                        name, expressions.transform(column, transforms.Transforms.fromString(kind, transform))
                    )
                spec.commit()
            if properties:
                update_properties = transaction.updateProperties()
                for key, value in properties.items():
                    update_properties.set(key, value)
                update_properties.commit()
            self.table.operations().commit(base, transaction.table().operations().current())
            self.table.refresh()

    def _java_type(self, kind_json: str) -> Any:
        """An Iceberg type given as pyiceberg's JSON, as Iceberg Java's (through a one-field schema)."""
        field = {"id": 2_000_000_000, "name": "t", "required": False, "type": json.loads(kind_json)}
        schema = {"type": "struct", "schema-id": 0, "fields": [field]}
        return self.java.iceberg.SchemaParser.fromJson(json.dumps(schema)).findField(2_000_000_000).type()

    def _spec(self, spec_id: int, path: str) -> Any:
        if self._specs is None:
            self._specs = dict(self.table.specs())
        spec = self._specs.get(spec_id)
        if spec is None:
            raise NativeTableError(f"{path}: written for partition spec {spec_id}, which the table has not")
        return spec

    def data_file(self, record: DataFileRecord, spec_id: int, geometry_id: int) -> Any:
        """The data file under spec `spec_id`, as Iceberg Java's DataFile."""
        return self._content_file(record, spec_id, {"content": "data"}, geometry_id)

    def _delete_file(self, record: DataFileRecord, spec_id: int, equality_ids: Sequence[int]) -> Any:
        extra = {"content": "equality-deletes", "equality-ids": list(equality_ids)}
        return self._content_file(record, spec_id, extra, None)

    def _content_file(
        self, record: DataFileRecord, spec_id: int, content: Mapping[str, Any], geometry_id: int | None
    ) -> Any:
        """The file as Iceberg's JSON of a content file (ContentFileParser, the REST catalog's own),
        parsed by Iceberg Java in two round trips to the JVM; built with one call per field, the
        file took about 50, a native commit's largest cost.

        Its metrics are the ones the writer recorded (`record.metrics`, which a v2 table's manifests
        get too), not read again from the footer (ParquetUtil.fileMetrics: 9 ms per file, measured
        warm), with the geometry's bounds added: (xmin, ymin) and (xmax, ymax) of its vertices'
        planar extent (`record.geometry_extent`), none where that is unknown.

        Not the bbox covering's box, which wraps at the anti-meridian for rows read the short way:
        an engine reads a `geometry` as planar, so a line from 179 to -179 crosses x = 0, and a
        wrapped bound (x >= 179 or x <= -179) would have it skip a file it must read."""
        spec = self._spec(spec_id, record.path)
        stats = record.metrics

        def counts(name: str) -> dict[str, list]:
            values = {int(k): v for k, v in (stats.get(name) or {}).items()}
            return {"keys": list(values), "values": list(values.values())}

        def bounds(name: str, extra: bytes | None) -> dict[str, list]:
            values = {int(k): v.upper() for k, v in (stats.get(name) or {}).items()}
            if extra is not None and geometry_id is not None:
                values[geometry_id] = extra.hex().upper()
            return {"keys": list(values), "values": list(values.values())}

        extent = record.geometry_extent if geometry_id is not None else None
        low = None if extent is None else geometry_bound(extent[0], extent[1])
        high = None if extent is None else geometry_bound(extent[2], extent[3])
        document = {
            "spec-id": spec_id,
            **content,
            "file-path": record.path,
            "file-format": "parquet",
            "partition": self._partition_json(spec, spec_id, record),
            "file-size-in-bytes": record.file_size_in_bytes,
            "record-count": record.record_count,
            "column-sizes": counts("column_sizes"),
            "value-counts": counts("value_counts"),
            "null-value-counts": counts("null_value_counts"),
            "nan-value-counts": counts("nan_value_counts"),
            "lower-bounds": bounds("lower_bounds", low),
            "upper-bounds": bounds("upper_bounds", high),
        }
        if stats.get("split_offsets"):
            document["split-offsets"] = list(stats["split_offsets"])
        member = self.java.member
        node = member("org.apache.iceberg.util.JsonUtil.mapper")().readTree(json.dumps(document))
        return member("org.apache.iceberg.ContentFileParser.fromJson")(node, spec)

    def _partition_json(self, spec: Any, spec_id: int, record: DataFileRecord) -> list:
        kinds = self._partition_kinds.get(spec_id)
        if kinds is None:
            kinds = self._partition_kinds[spec_id] = [
                "TIMESTAMPTZ" if str(t.typeId()) == "TIMESTAMP" and t.shouldAdjustToUTC() else str(t.typeId())
                for t in (f.type() for f in spec.partitionType().fields())
            ]
        if len(kinds) != len(record.partition_values):
            raise NativeTableError(
                f"{record.path}: {len(record.partition_values)} partition values for spec {spec_id}, "
                f"which has {len(kinds)} fields"
            )
        return [partition_json(kind, value) for kind, value in zip(kinds, record.partition_values, strict=True)]
