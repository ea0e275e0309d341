"""`neve sql "SELECT ..."`: DuckDB over the topics' Iceberg tables, one view per table named after
it (`SELECT * FROM orders`), and the one-liner `neve dev` prints for a table. Also the one place
DuckDB's iceberg extension is loaded, from the files its PyPI packages install (nothing is
downloaded at run time); the tests' readers load it from here too."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from compactor.catalog import TABLE_EXTRA, CatalogTarget, catalog_target, load_catalog
from compactor.config import CompactorConfig

if TYPE_CHECKING:
    import duckdb

DUCKDB_EXTENSIONS = ("httpfs", "avro", "iceberg")  # httpfs and avro first: iceberg reads through them
FORMATS = ("box", "csv", "json")


class SqlError(RuntimeError):
    """Why `neve sql` cannot answer: one line for the user."""


# Table names come from catalogs any engine (or an older neve) may have written: every name and
# path put into DuckDB's SQL is quoted, never pasted.
def quote_identifier(name: str) -> str:
    """`name` as one SQL identifier (DuckDB: double quotes, a double quote doubled)."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """`text` as one SQL string literal (a single quote doubled)."""
    return "'" + text.replace("'", "''") + "'"


def duckdb_extension_path(name: str) -> Path:
    """The extension file the PyPI package duckdb-extension-NAME installs."""
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    if spec is None or not spec.submodule_search_locations:
        raise SqlError(f"duckdb-extension-{name} is not installed: {TABLE_EXTRA}")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob(f"extensions/*/{name}.duckdb_extension"))
    if not found:
        raise SqlError(f"no {name}.duckdb_extension inside duckdb-extension-{name}: reinstall it ({TABLE_EXTRA})")
    return found[-1]


def duckdb_connect() -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB with the three extensions loaded from their files (each load takes a
    fraction of a second), autoloading off so that nothing is fetched, time zone UTC."""
    try:
        import duckdb
    except ImportError as e:
        raise SqlError(f"neve sql needs duckdb 1.5.5: {TABLE_EXTRA} ({e})") from None
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for name in DUCKDB_EXTENSIONS:
        con.execute(f"LOAD {quote_literal(str(duckdb_extension_path(name)))}")
    con.execute("SET TimeZone = 'UTC'")
    return con


def set_s3_secret(con: duckdb.DuckDBPyConnection, io: dict[str, str]) -> None:
    """DuckDB's S3 secret from pyiceberg's FileIO properties (s3.endpoint, keys, region)."""
    endpoint = io.get("s3.endpoint", "")
    settings = [f"KEY_ID {quote_literal(io.get('s3.access-key-id', ''))}", f"SECRET {quote_literal(io.get('s3.secret-access-key', ''))}", f"REGION {quote_literal(io.get('s3.region', 'us-east-1'))}"]
    if endpoint:
        # DuckDB takes the endpoint without its scheme, and needs path-style URLs for a local S3
        settings += [f"ENDPOINT {quote_literal(endpoint.split('://', 1)[-1])}", "URL_STYLE 'path'", f"USE_SSL {str(endpoint.startswith('https://')).lower()}"]
    con.execute(f"CREATE OR REPLACE SECRET neve_s3 (TYPE s3, {', '.join(settings)})")


def create_views(con: duckdb.DuckDBPyConnection, settings: CompactorConfig, wanted: set[str] | None = None) -> list[str]:
    """A view per table of the compactor's namespace (only those named in `wanted`, when given:
    each costs a read of its metadata), as `name` and as `namespace.name`, over the table's
    current metadata file: a SQL catalog writes no version-hint that DuckDB could follow, so
    the catalog says which file is current. Returns the names of the tables there are."""
    import duckdb

    target = _existing_catalog(settings)
    catalog = load_catalog(target)
    names = sorted(name for _ns, name in catalog.list_tables(settings.namespace))
    namespace = quote_identifier(settings.namespace)
    if names and settings.namespace != "main":
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {namespace}")
    for name in names:
        if wanted is not None and name not in wanted:
            continue
        table = catalog.load_table((settings.namespace, name))
        if table.metadata_location.startswith("s3"):
            set_s3_secret(con, dict(table.io.properties))
        scan = f"SELECT * FROM iceberg_scan({quote_literal(table.metadata_location)})"
        try:
            con.execute(f"CREATE VIEW {quote_identifier(name)} AS {scan}")
            if settings.namespace != "main":
                con.execute(f"CREATE VIEW {namespace}.{quote_identifier(name)} AS {scan}")
        except duckdb.Error as e:  # e.g. a path DuckDB's iceberg_scan cannot parse: the other tables still answer
            sys.stderr.write(f"no view of table {name!r}: DuckDB cannot read it ({' '.join(str(e).split())})\n")
    return names


def _existing_catalog(settings: CompactorConfig) -> CatalogTarget:
    target = catalog_target(settings)
    path = sqlite_path(target)
    if path is not None and not os.path.exists(path):
        raise SqlError(f"no tables yet: {path} does not exist (the compactor creates a topic's table at its first records)")
    return target


def sqlite_path(target: CatalogTarget) -> str | None:
    """The file of a SQLite catalog; None for other catalogs."""
    return "/" + target.jdbc_url.removeprefix("jdbc:sqlite:").lstrip("/") if target.jdbc_url.startswith("jdbc:sqlite:") else None


def run(settings: CompactorConfig, query: str | None, fmt: str = "box", out=None) -> None:
    """Answer `query` (without one: the tables there are) on stdout, as DuckDB's boxes, CSV or
    JSON lines."""
    import duckdb

    out = out or sys.stdout
    con = duckdb_connect()
    try:
        wanted = duckdb.get_table_names(query, qualified=False) if query else None
    except duckdb.Error:
        wanted = None  # DuckDB will say what is wrong with it
    names = create_views(con, settings, (wanted or None) if query else set())  # listing needs no view
    if query is None:
        if not names:
            out.write(f"no tables yet in namespace {settings.namespace} (the compactor creates a topic's table at its first records)\n")
        for name in names:
            out.write(f"{name}\n")
        return
    try:
        relation = con.sql(query)
        if relation is None:  # a statement without rows
            return
        if fmt == "box":
            width = shutil.get_terminal_size().columns if out.isatty() else 1 << 20  # piped: every column
            out.write(_boxes(con, relation, width))
        else:
            relation.to_view("neve_sql_result")
            options = "FORMAT csv, HEADER true" if fmt == "csv" else "FORMAT json"
            out.flush()
            con.execute(f"COPY (SELECT * FROM neve_sql_result) TO '/dev/stdout' ({options})")
    except duckdb.Error as e:
        raise SqlError(" ".join(str(e).split())) from None


def _boxes(con, relation, width: int) -> str:
    """DuckDB's boxes with every row (who wants fewer says LIMIT); `show` prints to stdout only."""
    rows = relation.fetch_arrow_table()  # once: counting them first would run the query twice
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        con.from_arrow(rows).show(max_width=width, max_rows=max(rows.num_rows, 1))
    return buffer.getvalue()


# -- what `neve dev` prints -----------------------------------------------------------------------


def neve_command() -> str:
    """How this shell reaches the `neve` command that runs now: `neve` when it is on PATH, else its
    absolute path (`make dev` runs .venv/bin/neve without putting .venv/bin on PATH)."""
    here = Path(sys.executable).parent / "neve"
    on_path = shutil.which("neve")
    if on_path and here.exists() and Path(on_path).resolve() == here.resolve():
        return "neve"
    if here.exists():
        return shlex.quote(str(here))
    return f"{shlex.quote(sys.executable)} -m neve"


def table_query(table: str) -> str:
    """A first query of a topic's table: where each record is, then its key and value columns
    (`value`, the Avro value's columns, last when the topic has a schema). `table` is pasted as
    it is: the compactor's tables are plain identifiers (table/names.py), and `<topic>` stands for one."""
    return f"SELECT kafka.partition, kafka.offset, * EXCLUDE (kafka, headers) FROM {table}"


def one_liner(query: str, data_dir: str | None) -> str:
    """The `neve sql` command line for `query`, over the catalog of `data_dir` (None: the
    configured one)."""
    where = f" --data-dir {shlex.quote(data_dir)}" if data_dir else ""
    return f"{neve_command()} sql{where} {shlex.quote(query)}"


def pyiceberg_one_liner(target: CatalogTarget, identifier: str) -> str | None:
    """A python one-liner printing a table through pyiceberg, for a SQLite catalog (others need
    credentials on the command line)."""
    if sqlite_path(target) is None:
        return None
    name, uri, warehouse, table = (json.dumps(v) for v in (target.name, target.uri, target.warehouse, identifier))  # "": no quote for the shell to escape
    code = f"from pyiceberg.catalog.sql import SqlCatalog; print(SqlCatalog({name}, uri={uri}, warehouse={warehouse}).load_table({table}).scan().to_arrow())"
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"
