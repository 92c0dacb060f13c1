"""Operations: Prometheus metrics, group snapshots for the admin API, consumer lag, config reload."""
