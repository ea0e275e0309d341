"""The C producer (bench/loadgen/produce.c): built once per source and librdkafka, with the C
compiler, against the librdkafka that confluent-kafka's wheel ships, into build/loadgen/.

Kept free of the rest of the bench package: the producer worker process imports it."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).parent / "loadgen" / "produce.c"
BUILD_DIR = Path(__file__).resolve().parent.parent / "build" / "loadgen"


class NativeUnavailable(RuntimeError):
    """The C producer cannot be built here (no C compiler, or no librdkafka in confluent-kafka)."""


def librdkafka() -> Path:
    import confluent_kafka

    site = Path(confluent_kafka.__file__).resolve().parent.parent
    found = sorted(glob.glob(str(site / "confluent_kafka.libs" / "librdkafka*.so*")))
    if not found:
        raise NativeUnavailable(f"no librdkafka shared library under {site / 'confluent_kafka.libs'}")
    return Path(found[0])


def producer_binary() -> Path:
    """The built producer, compiling it first when its source or librdkafka changed."""
    lib = librdkafka()
    digest = hashlib.sha256(SOURCE.read_bytes() + str(lib).encode()).hexdigest()[:12]
    binary = BUILD_DIR / f"produce-{digest}"
    if binary.exists():
        return binary
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise NativeUnavailable("no C compiler (cc or gcc; `apt-get install gcc`), needed for the C producer; `--client python` runs without it")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(f".{os.getpid()}.tmp")
    command = [cc, "-O2", "-Wall", "-o", str(partial), str(SOURCE), str(lib), f"-Wl,-rpath,{lib.parent}", "-lm"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise NativeUnavailable(f"building the C producer failed: {' '.join(command)}\n{done.stderr}")
    os.replace(partial, binary)  # atomic: concurrent builds (parallel tests) each install a whole binary
    return binary
