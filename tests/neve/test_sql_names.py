"""`neve sql` over a catalog whose table names are hostile: another engine (or an older neve, which
took `neve.iceberg.table` unchecked) may have made a table whose name holds SQL. Listing the
tables and querying one must run nothing of it: each name is quoted as one identifier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog


def hostile_catalog(data_dir: Path, marker: Path) -> tuple[SqlCatalog, str]:
    """The catalog `neve dev` keeps in `data_dir`, with one table of a hostile name holding two rows:
    the name, as a view name pasted into SQL, would write `marker`."""
    (data_dir / "warehouse").mkdir(parents=True)
    catalog = SqlCatalog("neve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=f"file://{data_dir / 'warehouse'}")
    catalog.create_namespace("neve")
    name = f"x\" AS SELECT 1; COPY (SELECT 42) TO '{marker}'; --"
    # its files where a path holds no quote (the default location holds the name: see below)
    table = catalog.create_table(("neve", name), pa.schema([("n", pa.int64())]), location=f"file://{data_dir / 'warehouse' / 'hostile'}")
    table.append(pa.table({"n": [7, 8]}))
    return catalog, name


def neve_sql(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neve", "sql", "--data-dir", str(data_dir), *args], capture_output=True, text=True, timeout=120)


def test_neve_sql_lists_and_queries_a_table_with_a_hostile_name_and_runs_none_of_it(tmp_path):
    marker = tmp_path / "injected"
    data_dir = tmp_path / "data"
    catalog, name = hostile_catalog(data_dir, marker)

    listed = neve_sql(data_dir)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [name]
    assert not marker.exists()

    quoted = '"' + name.replace('"', '""') + '"'
    queried = neve_sql(data_dir, "--format", "json", f"SELECT n FROM {quoted} ORDER BY n")
    assert queried.returncode == 0, queried.stderr
    assert [json.loads(line) for line in queried.stdout.splitlines()] == [{"n": 7}, {"n": 8}]
    assert not marker.exists()

    # the same name where its files are too (a path iceberg_scan cannot read): listed, and a
    # query of another table still answers; nothing injected either way
    other = f"y' || (SELECT 1); COPY (SELECT 42) TO '{marker}'; --"
    catalog.create_table(("neve", other), pa.schema([("n", pa.int64())])).append(pa.table({"n": [9]}))
    listed = neve_sql(data_dir)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == sorted([name, other])
    queried = neve_sql(data_dir, "--format", "json", f"SELECT n FROM {quoted} ORDER BY n")
    assert queried.returncode == 0, queried.stderr
    assert [json.loads(line) for line in queried.stdout.splitlines()] == [{"n": 7}, {"n": 8}]
    assert not marker.exists()
