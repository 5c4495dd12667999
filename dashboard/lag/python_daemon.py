"""Spark's Python worker daemon (``spark.python.daemon.module``, set by spark.get_spark for a
local session), importing PySpark from this environment's site-packages.

Spark puts its ``pyspark.zip`` first on its Python workers' path, and a zip holds no
bytecode: every fresh daemon's workers compiled PySpark's modules anew (pyspark.worker and
the SQL/Arrow modules a ``mapInArrow`` task needs: ~0.8 s of CPU each, against ~0.2 s from
the installed, compiled package). The same PySpark release either way: the zip is the one
shipped inside the installed package.
"""
import sys

sys.path[:] = [entry for entry in sys.path if not entry.endswith("pyspark.zip")]

from pyspark import daemon  # noqa: E402  (after the path is mended)

if __name__ == "__main__":
    daemon.manager()
