"""commitline's benchmark suite, run by ``make bench`` (``python -m bench``).

Every figure is printed beside a baseline measured in the same run, against the same
PostgreSQL: ``COMMITLINE_BENCH_DSN`` if set, else an embedded PostgreSQL in a temporary
folder with fsync on. See ``bench/__main__.py`` for the list of benchmarks.
"""
