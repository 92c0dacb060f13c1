# One image, two targets:
#   proxy: ddmq-proxy and the ddmq CLI (producer, consumer, status, demo-producer)
#   spark: the above plus Java 17 and PySpark, for `ddmq spark-pipeline`
FROM python:3.11-slim AS proxy
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md pyspark_ddmq.py ./
COPY proxy ./proxy
COPY actions ./actions
COPY client ./client
COPY config ./config
RUN pip install --no-cache-dir .
EXPOSE 9713
CMD ["ddmq-proxy", "--config", "/app/config/examples/compose.yaml"]

FROM proxy AS spark
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir ".[spark]"
# Spark's Python workers must import ddmq (installed above): use this interpreter.
ENV PYSPARK_PYTHON=/usr/local/bin/python PYSPARK_DRIVER_PYTHON=/usr/local/bin/python
CMD ["ddmq", "spark-pipeline", "--servers", "proxy:9713", "--group", "cg_rides", "--out", "/data/trips"]
