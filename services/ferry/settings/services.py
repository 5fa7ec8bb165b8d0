"""The services' settings: one flat, frozen dataclass per service, each setting a flag and a
``FERRY_*`` variable (``fields.setting``); beside the text of each structured setting, the typed
value parsed from it when the settings are built (a ``functools.cached_property``, computed by
``__post_init__`` through ``fields.parse_now``, so a bad value is refused then): the code uses
that value and never parses the text again. The checks and the parsing live by concern in this
package (``redis``, ``triton``, ``webhooks``, ``auth``, ``jobs``, ``rollouts``, ``partitions``),
each a function of the values it reads: this module imports them, and they import none of it.

Flat, not nested groups: the services' code and tests build and read settings by their field
names (``GatewaySettings(redis_url=..., max_wait_ms=...)``), and ``auth``, ``jobs`` and
``rollouts`` are settings' own names already."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ferry.errors import ConfigError
from ferry.settings.auth import (
    KeyEntry,
    Rate,
    api_key_entries,
    check_admin_token,
    jwt_algorithm_names,
    rate_limit_overrides,
)
from ferry.settings.declarations import Cascade
from ferry.settings.fairness import parse_weights
from ferry.settings.fields import parse_now, setting
from ferry.settings.inference_log import (
    check_log_bounds,
    check_log_sink,
    check_rotation,
    log_rates,
    redacted_fields,
)
from ferry.settings.jobs import check_job_limits, check_job_sources, job_windows
from ferry.settings.logs import LogLevels, log_levels
from ferry.settings.partitions import follows_replicas, owned
from ferry.settings.redis import check_redis, redis_sentinel_nodes
from ferry.settings.rollouts import Fallbacks, declared_cascades, declared_rollouts, fallbacks_of
from ferry.settings.triton import check_triton
from ferry.settings.webhooks import webhook_hosts

Declarations = Mapping[str, Mapping[str, Any]]  # model to its declared rollout's fields
LOG_MODELS_HELP = ("the inference log: the models whose finished tasks are logged, and the "
                   "share of each, 'model=rate,...' (a rate above 0 and at most 1; 'model' "
                   "alone: 1), e.g. moderation=0.1,sim=1; empty: no log "
                   "(docs/inference-log.md)")


@dataclass(frozen=True)
class CommonSettings:
    """Settings every Ferry service shares."""

    redis_url: str = setting("redis://127.0.0.1:6379/0", "Redis URL (queue and result store)")
    partitions: int = setting(16, "number of partition streams tasks are spread over")
    result_ttl_s: int = setting(600, "seconds a finished task's result is kept")
    pending_ttl_s: int = setting(86400, "seconds an accepted task's PENDING record is kept")
    triton_url: str = setting("127.0.0.1:8001", "Triton's gRPC addresses, host:port, "
                              "comma-separated: every server of the pool; a name that resolves "
                              "to several addresses (a headless Service) is one server each")
    triton_resolve_s: float = setting(2.0, "how often triton_url's names are looked up again "
                                      "(a Triton pod added takes work within this and a "
                                      "second)")
    log_level: str = setting("INFO", "log level: DEBUG, INFO, WARNING, ERROR; then optionally "
                             "name=LEVEL per logger, e.g. INFO,ferry.batches=DEBUG (a line per "
                             "batch)")
    redis_socket_timeout_s: float = setting(10.0, "longest wait for any one Redis reply")
    webhook_allowed_hosts: str = setting("", "hosts webhooks may be sent to: 'host' (any port) "
                                         "or 'host:port', comma-separated; empty: webhooks off")
    webhook_secret: str = setting("", "key of the webhooks' HMAC-SHA256 signature (required "
                                  "for webhooks)", secret=True)
    redis_cluster: bool = setting(False, "redis_url is a seed node of a Redis Cluster: keys are "
                                  "routed by slot (every key of a partition shares one)")
    redis_username: str = setting("", "Redis ACL user (overrides the URL's)")
    redis_password: str = setting("", "Redis password (overrides the URL's; or "
                                  "FERRY_REDIS_PASSWORD_FILE)", secret=True)
    redis_ca_file: str = setting("", "CA bundle that verifies a rediss:// server (default: the "
                                 "system's)")
    redis_cert_file: str = setting("", "client certificate for rediss:// (mutual TLS)")
    redis_key_file: str = setting("", "its private key")
    redis_sentinels: str = setting("", "Redis Sentinels, host:port comma-separated: the master "
                                   "is found through them and followed across a failover "
                                   "(redis_url then gives only the database, credentials and "
                                   "TLS)")
    redis_sentinel_master: str = setting("mymaster", "the master's name the sentinels monitor")
    redis_sentinel_password: str = setting("", "the sentinels' own password, if they have one "
                                           "(or FERRY_REDIS_SENTINEL_PASSWORD_FILE)",
                                           secret=True)
    redis_min_replicas: int = setting(0, "replicas that must confirm an admission's writes "
                                      "(WAIT) before it is answered; unconfirmed tasks are "
                                      "withdrawn and answered 503 (docs/redis.md)")
    redis_wait_ms: int = setting(500, "how long an admission waits for redis_min_replicas")
    triton_ssl: bool = setting(False, "gRPC over TLS to Triton")
    triton_ca_file: str = setting("", "CA bundle that verifies Triton (default: the system's)")
    triton_cert_file: str = setting("", "client certificate for Triton (mutual TLS)")
    triton_key_file: str = setting("", "its private key")
    cache_ttl_s: int = setting(300, "seconds a model's answer is cached for identical requests "
                               "(model, version, input), at most while its result is kept; 0: "
                               "no result cache")
    rollouts: str = setting("", "model versions as declared: a JSON object, model to {stable, "
                            "candidate, share, shadow, sticky, ...} (docs/versions.md); written "
                            "to Redis when the declaration changes, changed by the admin API "
                            "and the guard")

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ConfigError("partitions must be at least 1")
        if self.result_ttl_s < 1 or self.pending_ttl_s < 1:
            raise ConfigError("result_ttl_s and pending_ttl_s must be at least 1")
        if self.cache_ttl_s < 0:
            raise ConfigError("cache_ttl_s must be 0 (off) or more")
        check_triton(triton_url=self.triton_url,
                     triton_http_url=getattr(self, "triton_http_url", ""),  # a batcher's
                     triton_resolve_s=self.triton_resolve_s, triton_ssl=self.triton_ssl,
                     triton_ca_file=self.triton_ca_file, triton_cert_file=self.triton_cert_file,
                     triton_key_file=self.triton_key_file)
        parse_now(self, "log_levels", "declared_rollouts", "webhook_hosts")
        check_redis(redis_url=self.redis_url, redis_cluster=self.redis_cluster,
                    redis_cert_file=self.redis_cert_file, redis_key_file=self.redis_key_file,
                    redis_min_replicas=self.redis_min_replicas, redis_wait_ms=self.redis_wait_ms)
        parse_now(self, "redis_sentinel_nodes")

    # Parsed when the settings are built, each from the setting it names (neither a flag nor a
    # variable, and compared through that setting's text):

    @cached_property
    def log_levels(self) -> LogLevels:
        """``log_level``: the root level, and a level per logger."""
        return log_levels(self.log_level)

    @cached_property
    def declared_rollouts(self) -> Declarations:
        """``rollouts``: model to its declared rollout's fields."""
        return declared_rollouts(self.rollouts)

    @cached_property
    def webhook_hosts(self) -> frozenset[str]:
        """``webhook_allowed_hosts``: 'host' and 'host:port', lower case; none: webhooks are
        off."""
        return webhook_hosts(self.webhook_allowed_hosts, self.webhook_secret)

    @cached_property
    def redis_sentinel_nodes(self) -> tuple[tuple[str, int], ...]:
        """``redis_sentinels``: (host, port) of each; none: no sentinels."""
        return redis_sentinel_nodes(redis_sentinels=self.redis_sentinels,
                                    redis_sentinel_master=self.redis_sentinel_master,
                                    redis_cluster=self.redis_cluster)

    @property
    def triton_grpc_target(self) -> str:
        """``triton_url`` without a ``grpc://`` scheme, as tritonclient wants it."""
        return self.triton_url.removeprefix("grpc://")


@dataclass(frozen=True)
class GatewaySettings(CommonSettings):
    """The HTTP gateway."""

    host: str = setting("127.0.0.1", "address the gateway listens on")
    port: int = setting(8000, "port the gateway listens on")
    grpc_port: int = setting(8001, "port of Triton's gRPC protocol (inference."
                             "GRPCInferenceService) on the gateway; 0: off")
    default_model: str = setting("moderation", "model used when a request names none")
    max_body_bytes: int = setting(8 * 1024 * 1024, "largest accepted request body, in bytes")
    header_timeout_s: float = setting(10.0, "a request's line and headers must all arrive "
                                      "within this many seconds of its first byte, else 408 "
                                      "and the connection is closed (on the gRPC port: its "
                                      "HTTP/2 preface)")
    body_timeout_s: float = setting(30.0, "longest gap between two reads of a request's body "
                                    "(a stall, not the whole upload), else 408 and the "
                                    "connection is closed")
    max_poll_s: float = setting(30.0, "longest long-poll a client may ask for with ?wait=")
    catalog_refresh_s: float = setting(5.0, "seconds the gateway trusts its cached model list")
    access_log: bool = setting(False, "log every HTTP request (metrics count them anyway)")
    workers: int = setting(0, "gateway processes sharing the port; 0: one per available core")
    max_backlog: int = setting(0, "unfinished tasks a model may have before POST answers 429; "
                               "0: sized from the model's measured throughput so that a new "
                               "task waits at most max_queue_wait_s")
    max_queue_wait_s: float = setting(10.0, "the wait that sizes the automatic backlog limit")
    default_timeout_s: float = setting(0.0, "deadline of a task whose request sets none "
                                       "(X-Request-Timeout or timeout_s); 0: none")
    collapse_requests: bool = setting(True, "identical requests in flight at once share one "
                                      "inference")
    auth: str = setting("none", "who may use the API: 'none', 'api_key' or 'jwt'")
    api_keys: str = setting("", "API keys as '<client id>:<sha256 of the key>', comma- or "
                            "line-separated (see 'ferry keys new'; or FERRY_API_KEYS_FILE)",
                            secret=True)
    jwt_algorithms: str = setting("RS256", "JWT algorithms accepted, comma-separated (HMAC and "
                                  "public-key ones cannot be mixed)")
    jwt_public_key: str = setting("", "PEM public key verifying JWTs (or FERRY_JWT_PUBLIC_KEY_"
                                  "FILE)")
    jwt_jwks_url: str = setting("", "JWKS URL of the keys verifying JWTs, fetched and cached")
    jwt_jwks_refresh_s: float = setting(300.0, "seconds the fetched JWKS is trusted")
    jwt_secret: str = setting("", "HMAC secret of HS256 JWTs, 32+ characters (or "
                              "FERRY_JWT_SECRET_FILE)", secret=True)
    jwt_issuer: str = setting("", "required 'iss' of JWTs (empty: not checked)")
    jwt_audience: str = setting("", "required 'aud' of JWTs (empty: not checked)")
    jwt_client_claim: str = setting("sub", "JWT claim that names the client")
    jwt_weight_claim: str = setting("", "JWT claim that gives the client's fair-share weight "
                                    "(a number; a token without it: client_weights')")
    jwt_leeway_s: float = setting(30.0, "clock skew allowed on 'exp' and 'nbf'")
    rate_limit_per_min: int = setting(1000, "requests a minute per authenticated client, "
                                      "shared by every gateway (0: no limit)")
    rate_limit_burst: int = setting(0, "requests a client may send at once; 0: a tenth of its "
                                    "per-minute rate, at least 1 and at most 100")
    rate_limits: str = setting("", "per-client rates: 'client=per_min[/burst],...'")
    max_pending_per_client: int = setting(10000, "unfinished tasks one authenticated client "
                                          "may hold (0: no limit)")
    max_waits_per_client: int = setting(100, "open long-polls one authenticated client may "
                                        "hold in one gateway process (0: no limit)")
    fair_share_after: int = setting(4, "fair share between clients: once a model has this many "
                                    "unfinished tasks of one priority in a partition, new ones "
                                    "wait in fair order, each client's share by its weight "
                                    "(docs/fairness.md; 0: first come, first served)")
    client_weights: str = setting("", "fair-share weights: 'client=weight,...' (default 1; "
                                  "anonymous traffic is one client, '')")
    jobs: bool = setting(True, "run bulk jobs' runner in this gateway (feeds, collects and "
                         "finishes jobs; any number of gateways share the work)")
    job_store_dir: str = setting("ferry-jobs", "directory of bulk jobs' manifests and result "
                                 "files, shared by every gateway (a volume in Kubernetes)")
    job_store_url: str = setting("", "s3://bucket/prefix: keep jobs' files in an S3-compatible "
                                 "store instead of job_store_dir (credentials: AWS_* variables)")
    s3_endpoint: str = setting("", "endpoint of an S3-compatible store other than AWS's, for "
                               "job_store_url, s3:// job sources and an s3:// log_sink "
                               "(http:// allowed)")
    s3_access_key_id: str = setting("", "S3 access key (or FERRY_S3_ACCESS_KEY_ID_FILE); empty: "
                                    "AWS_* variables or the pod's identity", secret=True)
    s3_secret_access_key: str = setting("", "its secret (or FERRY_S3_SECRET_ACCESS_KEY_FILE)",
                                        secret=True)
    job_sources: str = setting("", "roots a job's 'uri' items may name, comma-separated "
                               "(file:///mnt/images/, s3://bucket/prefix/); empty: no URIs")
    job_max_items: int = setting(100_000, "lines one job's manifest may have")
    job_max_bytes: int = setting(1 << 30, "bytes one job's manifest may have")
    job_window: int = setting(256, "items a client's jobs keep in the queue at once (per "
                              "runner): a job never floods Redis or the backlog limit")
    job_max_unfinished: int = setting(8, "unfinished jobs one client may have")
    job_max_items_per_client: int = setting(1_000_000, "items one client's unfinished jobs may "
                                            "hold, all together (0: no limit)")
    job_lease_s: float = setting(15.0, "how long a runner holds a job without renewing: a "
                                 "job whose gateway died is resumed by another within this")
    job_completion_window: str = setting("24h", "a job's completion window when it names none "
                                         "(s, m, h, d); what is not done by then expires")
    job_max_completion_window: str = setting("7d", "the longest completion window a job may "
                                             "ask for")
    job_record_ttl_s: int = setting(30 * 86400, "seconds a finished job's record is kept "
                                    "(its files stay in job_store_dir)")
    admin_token: str = setting("", "bearer token of the admin API (/v1/admin/...: rollouts), "
                               "24+ characters (or FERRY_ADMIN_TOKEN_FILE); empty: the admin "
                               "API answers 403", secret=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_serving()
        check_admin_token(self.admin_token)
        check_job_sources(self.job_sources)
        check_job_limits(job_max_items=self.job_max_items, job_max_bytes=self.job_max_bytes,
                         job_window=self.job_window, job_max_unfinished=self.job_max_unfinished,
                         job_record_ttl_s=self.job_record_ttl_s, job_lease_s=self.job_lease_s)
        parse_now(self, "job_completion_window_s", "job_max_completion_window_s",
                  "api_key_entries", "jwt_algorithm_names", "rate_limit_overrides",
                  "client_weight_map")

    # Parsed when the settings are built, each from the setting it names:

    @cached_property
    def api_key_entries(self) -> tuple[KeyEntry, ...]:
        """``api_keys``: (client id, key digest) of each; none unless auth=api_key."""
        return api_key_entries(self.auth, self.api_keys)

    @cached_property
    def jwt_algorithm_names(self) -> tuple[str, ...]:
        """``jwt_algorithms``: none unless auth=jwt."""
        return jwt_algorithm_names(auth=self.auth, jwt_algorithms=self.jwt_algorithms,
                                   jwt_secret=self.jwt_secret,
                                   jwt_public_key=self.jwt_public_key,
                                   jwt_jwks_url=self.jwt_jwks_url)

    @cached_property
    def rate_limit_overrides(self) -> Mapping[str, Rate]:
        """``rate_limits``: client to its own rate."""
        return rate_limit_overrides(rate_limits=self.rate_limits,
                                    rate_limit_per_min=self.rate_limit_per_min,
                                    rate_limit_burst=self.rate_limit_burst,
                                    max_pending_per_client=self.max_pending_per_client,
                                    max_waits_per_client=self.max_waits_per_client)

    @cached_property
    def client_weight_map(self) -> Mapping[str, float]:
        """``client_weights``: client to its weight."""
        return parse_weights(self.client_weights)

    @cached_property
    def job_completion_window_s(self) -> float:
        """``job_completion_window``, in seconds."""
        return job_windows(self.job_completion_window, self.job_max_completion_window)[0]

    @cached_property
    def job_max_completion_window_s(self) -> float:
        """``job_max_completion_window``, in seconds."""
        return job_windows(self.job_completion_window, self.job_max_completion_window)[1]

    def _check_serving(self) -> None:
        if self.max_body_bytes < 1:
            raise ConfigError("max_body_bytes must be positive")
        if self.fair_share_after < 0:
            raise ConfigError("fair_share_after must be 0 (off) or more")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ConfigError("header_timeout_s and body_timeout_s must be positive")
        if self.workers < 0:
            raise ConfigError("workers must be 0 (one per core) or more")
        if not 0 <= self.grpc_port <= 65535 or self.grpc_port == self.port:
            raise ConfigError("grpc_port must be a port (0: off) other than port")
        if self.max_backlog < 0 or self.max_queue_wait_s <= 0 or self.default_timeout_s < 0:
            raise ConfigError("max_backlog and default_timeout_s must be >= 0, max_queue_wait_s "
                              "> 0")


@dataclass(frozen=True)
class BatcherSettings(CommonSettings):
    """A batcher worker."""

    max_batch: int = setting(64, "a batch leaves when it holds this many requests")
    max_wait_ms: float = setting(50.0, "... or this long after its first request arrived")
    owned_partitions: str = setting("all", "partitions this batcher reads: 'all', e.g. "
                                    "'0-7,12', or 'auto': replica <ordinal> of <replicas> owns "
                                    "those whose number modulo <replicas> is its ordinal")
    ordinal: int = setting(-1, "'auto': this replica's ordinal; -1: from the host name (a "
                           "StatefulSet pod's name ends in -<ordinal>)")
    replicas: int = setting(0, "'auto': how many batcher replicas share the partitions; 0: the "
                            "replica count of the StatefulSet named by statefulset, read through "
                            "the Kubernetes API and followed")
    statefulset: str = setting("", "'auto': the batchers' StatefulSet (in this pod's namespace)")
    replicas_check_s: float = setting(15.0, "'auto': how often the StatefulSet's replica count "
                                      "is read")
    max_inflight_batches: int = setting(0, "batches of one model at Triton at once, over every "
                                        "server (and, with a shared budget, every batcher); 0: "
                                        "as many as Triton runs instances of the model")
    batches_per_instance: int = setting(1, "Ferry's batches of a model at one Triton instance "
                                        "at once: 1 (one runs, none waits at Triton), or 2 (one "
                                        "runs and the next waits at Triton: no gap between "
                                        "them, at the cost of a batch formed a call earlier)")
    inflight_budget: str = setting("auto", "whose the in-flight budget (each model's instances "
                                   "over every Triton server) is: 'shared' by every batcher "
                                   "through Redis, 'local' to each batcher, or 'auto': shared "
                                   "while more than one batcher holds a live lease")
    budget_riders: bool = setting(True, "with a shared budget, one queue for the fleet: a "
                                  "batcher waiting for a slot offers its tasks of the model, "
                                  "and the batch of the next slot taken anywhere takes them "
                                  "along (off: each batcher's tasks wait for its own slots)")
    adaptive_flush: bool = setting(True, "send a batch early when Triton has a free instance "
                                   "and no other request is expected soon")
    slo_ms: float = setting(0.0, "latency objective of every task, from its submission to its "
                            "answer: no batch waits past the last moment that meets it, and "
                            "under load a free instance waits for a larger batch while that "
                            "still meets it; 0: none (a request's own deadline still counts)")
    max_attempts: int = setting(3, "inference attempts per request before it is dead-lettered")
    outage_budget_s: float = setting(300.0, "how long a batch waits for an unreachable Triton "
                                     "(not counted as attempts) before its tasks fail")
    backoff_base_ms: float = setting(100.0, "first retry delay; doubles on each attempt")
    backoff_max_ms: float = setting(2000.0, "longest retry delay")
    infer_timeout_s: float = setting(30.0, "deadline of one Triton infer call")
    triton_http_url: str = setting("", "Triton's HTTP addresses, host:port, one per triton_url "
                                   "address in the same order: when set, infer calls go there "
                                   "(HTTP/1.1, binary tensors, about a quarter of gRPC's CPU per "
                                   "call) and the rest stays on gRPC; over TLS with triton_ssl; "
                                   "empty: every call over gRPC")
    lease_ms: int = setting(2000, "a batcher renews its lease (a heartbeat in Redis) five "
                            "times in this: one that has not for this long is dead, and the "
                            "others take its tasks over at once (docs/redis.md: recovery)")
    claim_idle_ms: int = setting(30000, "a pending task idle this long is reclaimed by a batcher "
                                 "(the backstop to leases: a consumer that never held one)")
    claim_interval_ms: int = setting(5000, "how often a batcher looks for such tasks")
    max_deliveries: int = setting(5, "deliveries of one task (crashes included) before dead-letter")
    dead_letter_maxlen: int = setting(100000, "approximate length cap of each partition's "
                                      "dead-letter stream")
    breaker_threshold: float = setting(0.5, "a model's circuit breaker opens when this share of "
                                       "its calls failed over breaker_window_s ...")
    breaker_window_s: float = setting(10.0, "... the window the error rate is measured over ...")
    breaker_min_calls: int = setting(20, "... with at least this many calls in it")
    breaker_cooldown_s: float = setting(30.0, "an open breaker half-opens (one probe call) after "
                                        "this long")
    fallback_models: str = setting("", "models that answer while a model's breaker is open: "
                                   "'model=fallback,...'; also FERRY_FALLBACK_<MODEL>=fallback")
    webhook_retry_s: float = setting(300.0, "how long a webhook is retried (with backoff) "
                                     "before it is recorded as failed")
    webhook_timeout_s: float = setting(5.0, "deadline of one webhook POST")
    webhook_allow_private: bool = setting(False, "call allowlisted names that resolve to "
                                          "private, loopback or link-local addresses (IP "
                                          "literals on the allowlist are always called)")
    priority_aging_s: float = setting(2.0, "a normal or low task read this long ago boards "
                                      "ahead of every priority but high, so that normal work "
                                      "never starves low")
    read_block_ms: int = setting(200, "longest block of one stream read (bounds stop latency)")
    shutdown_grace_s: float = setting(10.0, "on stop, time given to in-flight batches")
    metrics_host: str = setting("127.0.0.1", "address of the batcher's (and the logger's) "
                                "/metrics endpoint")
    metrics_port: int = setting(9400, "port of the batcher's /metrics endpoint (0: off)")
    cascades: str = setting("", "two-tier cascades: a JSON object, model to {review_model, "
                            "review_version, when: always | unsafe | label_above:S | "
                            "labels:A,B} (docs/versions.md)")
    review_max_backlog: int = setting(10000, "unfinished tasks a review model may have before "
                                      "a new review is skipped (written SKIPPED, with why)")
    rollout_check_s: float = setting(2.0, "how often the rollouts' guard looks (on the batcher "
                                     "that owns partition 0)")
    client_labels: int = setting(20, "clients the per-client metrics name (those that cost "
                                 "the most GPU time, reranked each minute); the rest are "
                                 "'other' (docs/fairness.md)")
    # The inference log (docs/inference-log.md): what the batcher hands to it.
    log_models: str = setting("", LOG_MODELS_HELP)
    log_max_records: int = setting(100_000, "the bound of each logged model's log stream: "
                                   "records past it are dropped and counted "
                                   "(ferry_log_dropped_total), never waited for")
    log_max_payload_bytes: int = setting(65_536, "a logged request or answer whose JSON is "
                                         "longer is cut to this many bytes, and marked")
    log_redact: str = setting("", "JSON fields whose values the inference log replaces with "
                              "'[redacted]' (in requests and answers, at any depth), "
                              "comma-separated")

    # FERRY_FALLBACK_<MODEL>=<fallback> variables, by <MODEL>: read by the loader (no flag)
    fallback_variables: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_batch < 1 or self.max_wait_ms < 0 or self.slo_ms < 0:
            raise ConfigError("max_batch must be >= 1, max_wait_ms and slo_ms >= 0")
        if self.batches_per_instance not in (1, 2):
            raise ConfigError(f"batches_per_instance must be 1 or 2, not "
                              f"{self.batches_per_instance}")
        if self.inflight_budget not in ("auto", "shared", "local"):
            raise ConfigError(f"inflight_budget must be auto, shared or local, not "
                              f"{self.inflight_budget!r}")
        if self.max_attempts < 1 or self.max_inflight_batches < 0:
            raise ConfigError("max_attempts must be >= 1 and max_inflight_batches >= 0")
        if self.read_block_ms / 1000.0 >= self.redis_socket_timeout_s:
            raise ConfigError("read_block_ms must be shorter than redis_socket_timeout_s")
        if not 0 < self.breaker_threshold <= 1 or self.breaker_min_calls < 1:
            raise ConfigError("breaker_threshold must be in (0, 1] and breaker_min_calls >= 1")
        if self.lease_ms < 100:
            raise ConfigError("lease_ms must be at least 100")
        if self.review_max_backlog < 1 or self.rollout_check_s <= 0:
            raise ConfigError("review_max_backlog must be >= 1 and rollout_check_s > 0")
        parse_now(self, "owned", "follows_replicas", "fallbacks", "declared_cascades")
        check_log_bounds(self.log_max_records, self.log_max_payload_bytes)
        parse_now(self, "log_rates", "log_redacted")

    # Parsed when the settings are built, each from the setting it names:

    @cached_property
    def owned(self) -> tuple[int, ...]:
        """``owned_partitions``: the partitions it names; none for 'auto' (the supervisor then
        starts each batcher on a list of its own, from the replica count)."""
        return owned(owned_partitions=self.owned_partitions, partitions=self.partitions,
                     replicas=self.replicas, statefulset=self.statefulset,
                     replicas_check_s=self.replicas_check_s)

    @cached_property
    def follows_replicas(self) -> bool:
        """``owned_partitions``: whether it is 'auto'."""
        return follows_replicas(self.owned_partitions)

    @cached_property
    def fallbacks(self) -> Fallbacks:
        """``fallback_models`` and ``fallback_variables``."""
        return fallbacks_of(self.fallback_models, self.fallback_variables)

    @cached_property
    def declared_cascades(self) -> Mapping[str, Cascade]:
        """``cascades``: model to the cascade that reviews its answers."""
        return declared_cascades(self.cascades)

    @cached_property
    def log_rates(self) -> Mapping[str, float]:
        """``log_models``: model to the share of its finished tasks logged (none: no log)."""
        return log_rates(self.log_models)

    @cached_property
    def log_redacted(self) -> frozenset[str]:
        """``log_redact``: the names of the fields redacted."""
        return redacted_fields(self.log_redact)


@dataclass(frozen=True)
class LoggerSettings(CommonSettings):
    """The inference log's logger (``ferry logger``): it writes what the batchers hand off."""

    log_models: str = setting("", LOG_MODELS_HELP)
    log_sink: str = setting("inference-log", "where the logger writes records: a directory "
                            "(or file://DIR) or s3://bucket/prefix (JSONL files, rotated), or "
                            "an http(s):// CloudEvents collector (KServe's logger format)")
    log_rotate_bytes: int = setting(64 << 20, "a log file is closed and the next begun at "
                                    "about this size ...")
    log_rotate_s: float = setting(300.0, "... or this many seconds after it was begun: its "
                                  "records are acknowledged once it is closed")
    log_metrics_port: int = setting(9401, "port of the logger's /metrics, /healthz and "
                                    "/readyz (0: off)")
    metrics_host: str = setting("127.0.0.1", "address of the batcher's (and the logger's) "
                                "/metrics endpoint")
    s3_endpoint: str = setting("", "endpoint of an S3-compatible store other than AWS's, for "
                               "job_store_url, s3:// job sources and an s3:// log_sink "
                               "(http:// allowed)")
    s3_access_key_id: str = setting("", "S3 access key (or FERRY_S3_ACCESS_KEY_ID_FILE); empty: "
                                    "AWS_* variables or the pod's identity", secret=True)
    s3_secret_access_key: str = setting("", "its secret (or FERRY_S3_SECRET_ACCESS_KEY_FILE)",
                                        secret=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_log_sink(self.log_sink)
        check_rotation(self.log_rotate_bytes, self.log_rotate_s, self.log_metrics_port)
        parse_now(self, "log_rates")

    @cached_property
    def log_rates(self) -> Mapping[str, float]:
        """``log_models``: the models whose streams it drains (their rates are the
        batchers')."""
        return log_rates(self.log_models)


@dataclass(frozen=True)
class UpSettings(GatewaySettings, BatcherSettings, LoggerSettings):
    """``ferry up``: the whole local stack. Empty URLs mean 'start a private server'."""

    redis_url: str = setting("", "use this Redis instead of starting a private one")
    triton_url: str = setting("", "use this Triton (gRPC host:port) instead of starting one")
    model_repository: str = setting("", "Triton model repository to serve (default: bundled)")
    state_dir: str = setting(".ferry", "where logs and Redis data of the local stack go")
    metrics_port: int = setting(0, "batcher /metrics port (0: pick a free one)")
    log_metrics_port: int = setting(0, "with log_models, the logger's /metrics port (0: pick a "
                                    "free one)")

