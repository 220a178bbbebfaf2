"""A client of a schema registry's Confluent-compatible REST API, with a cache of schemas by id.

Registry-encoded Kafka values (the Confluent wire format) start with a zero byte and a 4-byte
big-endian schema id; the schema is fetched once per id (`GET <url>/schemas/ids/<id>`), with the
schemas it refers to (`references`: `GET <url>/subjects/<subject>/versions/<version>`), and kept:
an id names one schema for good, so the cache is never invalidated. Apicurio Registry serves this
API under `/apis/ccompat/v7`, Confluent's Schema Registry and Karapace at their root.

What can go wrong is told apart, since the decoder acts on it differently:
- the registry answers that it has no such id: `UnknownSchemaId`, the records are rejected
  (`unknown_schema_id`) and the stream goes on; the answer is cached too, for a while, so a batch
  full of one bad id costs one request;
- the registry cannot be reached, or answers with an error of its own: `RegistryUnavailable`,
  which stops the batch (and so the query) with the URL named, since every record behind it would
  be rejected for the registry's fault, not its own.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

# A schema id the registry did not know is asked for again after this long (it may be registered
# by then: a producer registers before it sends, but registries replicate).
_UNKNOWN_RETRY_S = 30.0
SETTING_KEYS = ("url", "username", "password", "ca_file", "timeout_s")


class RegistryUnavailable(RuntimeError):
    """The schema registry could not be reached or did not answer as the API says: a stop."""


class UnknownSchemaId(LookupError):
    """The registry has no schema of this id."""


@dataclass(frozen=True)
class RegisteredSchema:
    id: int
    schema_type: str  # "AVRO" or "PROTOBUF" (the registry's names)
    text: str
    # The schemas it refers to by name (schema references), each after the ones it refers to.
    references: tuple[str, ...] = ()
    # The name each of them is referred to by: a .proto file's import path, an Avro type's full name.
    reference_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class RegistrySettings:
    """The `schema_registry` settings: the API's base URL, HTTP basic auth, and the CA file that
    signs an https registry's certificate (default: the machine's trusted CAs)."""

    url: str = ""
    username: str = ""
    password: str = ""
    ca_file: str = ""
    timeout_s: float = 10.0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, str]) -> RegistrySettings:
        unknown = sorted(set(raw) - set(SETTING_KEYS))
        if unknown:
            raise ValueError(f"schema_registry: unknown keys {unknown}; expected some of {list(SETTING_KEYS)}")
        url = raw.get("url", "").rstrip("/")
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"schema_registry.url: {url!r} is not an http:// or https:// URL")
        if bool(raw.get("username")) != bool(raw.get("password")):
            raise ValueError("schema_registry: username and password go together")
        try:
            timeout = float(raw.get("timeout_s", 10.0))
        except ValueError:
            raise ValueError(f"schema_registry.timeout_s: {raw['timeout_s']!r} is not a number") from None
        return cls(url, raw.get("username", ""), raw.get("password", ""), raw.get("ca_file", ""), timeout)

    def __repr__(self) -> str:
        return (
            f"RegistrySettings(url={self.url!r}, username={self.username!r}, password='***', ca_file={self.ca_file!r})"
        )


class SchemaRegistryClient:
    def __init__(self, settings: RegistrySettings):
        if not settings.url:
            raise RegistryUnavailable(
                "a registry-encoded format needs the schema registry's URL: set schema_registry.url "
                "(GEOINGEST_SCHEMA_REGISTRY__URL)"
            )
        self.settings = settings
        self._schemas: dict[int, RegisteredSchema] = {}
        self._unknown: dict[int, float] = {}
        self._lock = threading.Lock()
        self._context = ssl.create_default_context(cafile=settings.ca_file or None)
        self._headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if settings.username:
            token = base64.b64encode(f"{settings.username}:{settings.password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self.requests = 0  # how many times the registry was asked (the cache's effect, for tests)

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema of this id, from the cache or the registry. Raises UnknownSchemaId or
        RegistryUnavailable."""
        with self._lock:
            cached = self._schemas.get(schema_id)
            if cached is not None:
                return cached
            refused = self._unknown.get(schema_id)
            if refused is not None and time.monotonic() - refused < _UNKNOWN_RETRY_S:
                raise UnknownSchemaId(schema_id)
        body = self._get(f"/schemas/ids/{schema_id}", schema_id)
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise RegistryUnavailable(
                f"schema registry at {self.settings.url}: GET /schemas/ids/{schema_id} answered "
                f"{str(body)[:200]!r}, which is not a schema"
            )
        referred = self._references(body, schema_id, set())
        found = RegisteredSchema(
            schema_id,
            str(body.get("schemaType") or "AVRO").upper(),
            body["schema"],
            tuple(text for _, text in referred),
            tuple(name for name, _ in referred),
        )
        with self._lock:
            self._schemas[schema_id] = found
        return found

    def _references(self, body: dict, schema_id: int, seen: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """The name and text of each schema `body` refers to (`references`: name, subject and
        version each), the ones they refer to first. A reference the registry does not have is left
        out: the schema then names a type it does not define, which the compiler reports."""
        texts: list[tuple[str, str]] = []
        for reference in body.get("references") or ():
            if not isinstance(reference, dict):
                continue
            key = (str(reference.get("subject", "")), str(reference.get("version", "")))
            if key in seen:
                continue
            seen.add(key)
            path = f"/subjects/{urllib.parse.quote(key[0], safe='')}/versions/{urllib.parse.quote(key[1], safe='')}"
            try:
                referred = self._get(path, None)
            except UnknownSchemaId:
                continue
            if isinstance(referred, dict) and isinstance(referred.get("schema"), str):
                texts += self._references(referred, schema_id, seen)
                texts.append((str(reference.get("name", "")), referred["schema"]))
        return texts

    def _get(self, path: str, schema_id: int | None) -> object:
        url = f"{self.settings.url}{path}"
        request = urllib.request.Request(url, headers=self._headers)
        self.requests += 1
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s, context=self._context) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            if exc.code == 404:
                if schema_id is not None:
                    with self._lock:
                        self._unknown[schema_id] = time.monotonic()
                raise UnknownSchemaId(schema_id) from None
            raise RegistryUnavailable(
                f"schema registry at {self.settings.url} answered GET {path} with HTTP {exc.code}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryUnavailable(f"schema registry at {self.settings.url} is unreachable: {reason}") from None


_CLIENTS: dict[RegistrySettings, SchemaRegistryClient] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(settings: RegistrySettings) -> SchemaRegistryClient:
    """One client (and so one cache) per registry in a process: every task of an executor shares it."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(settings)
        if client is None:
            client = _CLIENTS[settings] = SchemaRegistryClient(settings)
        return client
