"""Spark's class archive (dashboard/lag/class_archive.py): which JVM options a session gets.
(That a Spark JVM maps the archive the install built: tests/test_lag_job.py.)"""
from dashboard.lag import class_archive


def test_an_archive_on_disk_is_mapped_quietly_and_falls_back_if_stale(tmp_path, monkeypatch):
    archive = tmp_path / "spark-classes.jsa"
    archive.write_bytes(b"an archive")
    monkeypatch.setenv("LAG_SPARK_CLASS_ARCHIVE", str(archive))
    options = class_archive.java_options().split()
    assert f"-XX:SharedArchiveFile={archive}" in options
    # A JDK update makes an archive stale: the JVM must go on without it, and say nothing.
    assert "-Xshare:auto" in options and "-Xlog:cds=off" in options


def test_no_archive_no_option(tmp_path, monkeypatch):
    monkeypatch.setenv("LAG_SPARK_CLASS_ARCHIVE", str(tmp_path / "never-built.jsa"))
    assert class_archive.java_options() == ""
    monkeypatch.setenv("LAG_SPARK_CLASS_ARCHIVE", "")   # turned off
    assert class_archive.java_options() == ""
    assert class_archive.archive_path() is None


def test_a_stray_argument_is_refused_with_usage(capsys):
    assert class_archive.main(["--bogus"]) == 2
    assert "usage" in capsys.readouterr().err
