# One image, two targets:
#   proxy: ddmq-proxy and the ddmq CLI (producer, consumer, status, offsets, dead letters, demo-producer)
#   spark: the above plus Java 17 and PySpark, for `ddmq spark-pipeline`
# The base is pinned to Debian 12 (bookworm): its archive has openjdk-17-jre-headless, which the spark
# target installs; Debian 13 (trixie, the unpinned tag's base now) ships Java 21 only.
# tests/system/test_compose.py replays the COPY and `pip install .` steps without Docker, so a file the build
# needs and the COPY lines miss fails the test suite.
FROM python:3.11-slim-bookworm AS proxy
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The build backend (buildsys/ddmq_build.py, named in pyproject.toml) and setup.py are part of the build.
COPY pyproject.toml setup.py MANIFEST.in README.md pyspark_ddmq.py ./
COPY buildsys ./buildsys
COPY proxy ./proxy
COPY actions ./actions
COPY client ./client
COPY config ./config
COPY protocol ./protocol
# The slim base has no C compiler, so this installs the pure-Python hot path (docs/running.md, "Installing").
RUN pip install --no-cache-dir .
# 9713: Thrift pull API; 9714: HTTP API, /metrics, /healthz, /readyz
EXPOSE 9713 9714
CMD ["ddmq-proxy", "--config", "/app/config/examples/compose.yaml"]

FROM proxy AS spark
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir ".[spark]"
# Spark's Python workers must import ddmq (installed above): use this interpreter.
ENV PYSPARK_PYTHON=/usr/local/bin/python PYSPARK_DRIVER_PYTHON=/usr/local/bin/python
CMD ["ddmq", "spark-pipeline", "--servers", "proxy:9713", "--group", "cg_rides", "--out", "/data/trips"]
