"""The benchmark suite: `python -m bench <scenario>`. Not part of CI beyond short smoke runs."""
