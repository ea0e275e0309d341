"""Writing: a cycle's plan (which WAL reads each task makes), the job that runs the tasks (on Spark or
in this process) and writes their Parquet files, the table's layout as Iceberg and Arrow have it."""
