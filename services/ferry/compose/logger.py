"""The inference log's logger (``ferry logger``): its connections, its sink and its metrics."""

from __future__ import annotations

from ferry.errors import ConfigError
from ferry.inference_log.logger import Logger, consumer_name
from ferry.inference_log.sinks import Rotation, Sink, open_sink
from ferry.jobs.blobs import S3Keys
from ferry.redis_conn import lean
from ferry.settings.services import LoggerSettings
from ferry.telemetry.metrics import LoggerMetrics


def logger_sink(settings: LoggerSettings) -> Sink:
    """The sink ``log_sink`` names, with the rotation and the S3 settings."""
    keys = (S3Keys(settings.s3_access_key_id, settings.s3_secret_access_key)
            if settings.s3_access_key_id else None)
    return open_sink(settings.log_sink.strip(),
                     Rotation(settings.log_rotate_bytes, settings.log_rotate_s),
                     s3_endpoint=settings.s3_endpoint, s3_keys=keys)


def build_logger(settings: LoggerSettings, *, sink: Sink | None = None,
                 metrics: LoggerMetrics | None = None) -> Logger:
    """A logger of the models ``log_models`` names (a test's sink or registry in place of its
    own): its commands on one connection, its blocking reads on another (on a Redis Cluster,
    whose streams are in many slots, it polls through the first)."""
    if not settings.log_rates:
        raise ConfigError("log_models (FERRY_LOG_MODELS) names no model: the logger has "
                          "nothing to write")
    consumer = consumer_name()
    redis = lean(settings, f"ferry-logger-{consumer}")
    reader = None if settings.redis_cluster else lean(settings, f"ferry-logger-read-{consumer}")
    port = settings.log_metrics_port
    return Logger(list(settings.log_rates), redis, sink or logger_sink(settings),
                  metrics or LoggerMetrics(), reader=reader, consumer=consumer,
                  metrics_at=(settings.metrics_host, port) if port else None)
