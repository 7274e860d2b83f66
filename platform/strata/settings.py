"""Django settings for the Strata control plane. Everything tunable comes from STRATA_* variables."""

from __future__ import annotations

import secrets
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from components.runtime.shared.broker import celery_broker_options
from strata.conf import env_bool, env_float, env_float_or_none, env_int, env_list, env_str, strata_home

HOME = strata_home()
BASE_DIR = Path(__file__).resolve().parent


def _secret_key() -> str:
    configured = env_str("STRATA_SECRET_KEY")
    if configured:
        return configured
    # Embedded deployments keep a generated key in the state directory so sessions survive restarts.
    key_file = HOME / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(64))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
# Rotating the key: the old one here keeps sessions and signed values valid until they expire (docs/operations.md).
SECRET_KEY_FALLBACKS = env_list("STRATA_SECRET_KEY_FALLBACKS", [])
DEBUG = env_bool("STRATA_DEBUG", False)  # Django's DEBUG: never in production
# The host names the server answers (Django's ALLOWED_HOSTS); never "*" in production.
ALLOWED_HOSTS = env_list("STRATA_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
# The URL users and nodes reach the control plane at; its https origin is trusted for CSRF.
STRATA_PUBLIC_URL = env_str("STRATA_PUBLIC_URL", "http://127.0.0.1:8000")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


# The public URL's origin is trusted for CSRF (the browser's Origin behind a proxy), plus any listed.
CSRF_TRUSTED_ORIGINS = env_list("STRATA_CSRF_TRUSTED_ORIGINS", [])
if _origin(STRATA_PUBLIC_URL).startswith("https://") and _origin(STRATA_PUBLIC_URL) not in CSRF_TRUSTED_ORIGINS:
    CSRF_TRUSTED_ORIGINS.append(_origin(STRATA_PUBLIC_URL))
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
# --- HTTPS (docs/operations/production.md): TLS ends at a proxy in front of `strata server` ----------------
# STRATA_HTTPS=1: redirect plain HTTP to HTTPS (except the probes), HSTS, Secure cookies.
STRATA_HTTPS = env_bool("STRATA_HTTPS", False)
SESSION_COOKIE_SECURE = env_bool("STRATA_SECURE_COOKIES", STRATA_HTTPS)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("STRATA_SSL_REDIRECT", STRATA_HTTPS)
# Load balancers and Prometheus probe the replicas over plain HTTP, straight, not through the proxy.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("STRATA_HSTS_SECONDS", 31_536_000 if STRATA_HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("STRATA_HSTS_INCLUDE_SUBDOMAINS", STRATA_HTTPS)
SECURE_HSTS_PRELOAD = env_bool("STRATA_HSTS_PRELOAD", False)
# The header the TLS proxy sets to say a request came over HTTPS, e.g. "X-Forwarded-Proto" (value: https).
# Only with a proxy that always sets (overwrites) it: otherwise a client could claim HTTPS.
_PROXY_SSL_HEADER = env_str("STRATA_SECURE_PROXY_SSL_HEADER")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _PROXY_SSL_HEADER.strip().upper().replace("-", "_"), "https") if _PROXY_SSL_HEADER else None)
# Checks an operator has decided about (e.g. security.W021, HSTS preload): `strata check --deploy` skips them.
SILENCED_SYSTEM_CHECKS = env_list("STRATA_SILENCED_CHECKS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "strata.accounts",
    "strata.cluster",
    "strata.quotas",
    "strata.jobs",
    "strata.scheduling",
    "strata.telemetry",
    "strata.audit",
    "strata.notify",
    "strata.tracking",
    "strata.api",
    "dashboard",
]

MIDDLEWARE = [
    "strata.api.head.HeadResponseMiddleware",  # outermost: a HEAD response keeps its headers, loses its body
    "strata.api.middleware.ProbeMiddleware",  # /healthz, /readyz, /metrics answer any Host (probes, Prometheus)
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "strata.api.middleware.BodySizeLimitMiddleware",
    "strata.api.middleware.RequestTextMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "strata.accounts.login_guard.LoginGuardMiddleware",  # 429 + Retry-After when the login guard refused
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "strata.urls"
WSGI_APPLICATION = "strata.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# --- database: SQLite in STRATA_HOME by default, STRATA_DATABASE_URL for PostgreSQL ----------------------
DATABASE_URL = env_str("STRATA_DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(HOME / "strata.sqlite3"),
            "OPTIONS": {
                # IMMEDIATE takes the write lock at BEGIN, so concurrent admissions serialize instead of
                # failing with "database is locked" on lock upgrade; WAL lets readers run alongside.
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "/static/"
STATIC_ROOT = str(HOME / "static")
(HOME / "static").mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/jobs/"

# --- login guard (strata.accounts.login_guard; docs/security.md) ------------------------------------
# Every password login goes through this backend, which refuses guessing before it checks the password.
AUTHENTICATION_BACKENDS = ["strata.accounts.backends.GuardedModelBackend",
                           "strata.accounts.oidc.OidcBackend"]  # single sign-on: only its callback
# A user name from one address: free failures, then backoff, then a lockout of LOCKOUT_SECONDS per attempt.
STRATA_LOGIN_FREE_FAILURES = env_int("STRATA_LOGIN_FREE_FAILURES", 5, minimum=1)
STRATA_LOGIN_LOCKOUT_FAILURES = env_int("STRATA_LOGIN_LOCKOUT_FAILURES", 10, minimum=1)
# One address, any user name: the same shape, higher thresholds.
STRATA_LOGIN_ADDRESS_FREE_FAILURES = env_int("STRATA_LOGIN_ADDRESS_FREE_FAILURES", 20, minimum=1)
STRATA_LOGIN_ADDRESS_LOCKOUT_FAILURES = env_int("STRATA_LOGIN_ADDRESS_LOCKOUT_FAILURES", 50, minimum=1)
# One user name, any address: backoff only (never a lockout); addresses it logged in from skip it.
STRATA_LOGIN_USER_FREE_FAILURES = env_int("STRATA_LOGIN_USER_FREE_FAILURES", 10, minimum=1)
STRATA_LOGIN_BACKOFF_SECONDS = env_float("STRATA_LOGIN_BACKOFF_SECONDS", 1.0, minimum=0.0)  # doubles per failure
STRATA_LOGIN_BACKOFF_MAX_SECONDS = env_float("STRATA_LOGIN_BACKOFF_MAX_SECONDS", 60.0, minimum=0.0)
STRATA_LOGIN_LOCKOUT_SECONDS = env_float("STRATA_LOGIN_LOCKOUT_SECONDS", 900.0, minimum=0.0)
STRATA_LOGIN_WINDOW_SECONDS = env_float("STRATA_LOGIN_WINDOW_SECONDS", 3600.0, minimum=1.0)  # failures expire
STRATA_LOGIN_KNOWN_ADDRESS_DAYS = env_float("STRATA_LOGIN_KNOWN_ADDRESS_DAYS", 30.0, minimum=0.0)

# --- single sign-on with OpenID Connect (strata.accounts.oidc; docs/operations.md, Single sign-on) ----------
# Off: the login page hides the password form and every password login (web UI, admin, API login) is refused.
STRATA_PASSWORD_LOGIN = env_bool("STRATA_PASSWORD_LOGIN", True)
# The provider's issuer URL (or its /.well-known/openid-configuration URL); empty: no single sign-on.
STRATA_OIDC_ISSUER = env_str("STRATA_OIDC_ISSUER", "")
STRATA_OIDC_CLIENT_ID = env_str("STRATA_OIDC_CLIENT_ID", "")  # the client registered at the provider for Strata
STRATA_OIDC_CLIENT_SECRET = env_str("STRATA_OIDC_CLIENT_SECRET", "")  # its secret (or STRATA_OIDC_CLIENT_SECRET_FILE)
STRATA_OIDC_SCOPES = env_list("STRATA_OIDC_SCOPES", ["openid", "email", "profile"])  # scopes asked for; most need groups
STRATA_OIDC_PROVIDER_NAME = env_str("STRATA_OIDC_PROVIDER_NAME", "single sign-on")  # the login page: Sign in with <name>
# The claim that names the Strata user (falls back to email, then sub).
STRATA_OIDC_USERNAME_CLAIM = env_str("STRATA_OIDC_USERNAME_CLAIM", "preferred_username")
# The claim listing the user's groups (e.g. groups); empty: logins never change teams or the admin flag.
STRATA_OIDC_TEAM_CLAIM = env_str("STRATA_OIDC_TEAM_CLAIM", "")
# Only groups with this prefix are teams (the prefix stripped); "slug:team-admin" or "slug:viewer" gives that role.
STRATA_OIDC_TEAM_PREFIX = env_str("STRATA_OIDC_TEAM_PREFIX", "")
STRATA_OIDC_CREATE_TEAMS = env_bool("STRATA_OIDC_CREATE_TEAMS", False)  # a group naming no team creates it
STRATA_OIDC_ADMIN_GROUP = env_str("STRATA_OIDC_ADMIN_GROUP", "")  # a group (team claim) of cluster admins
STRATA_OIDC_SIGN_ALGO = env_str("STRATA_OIDC_SIGN_ALGO", "RS256")  # the ID token's signature algorithm
STRATA_OIDC_TIMEOUT_SECONDS = env_float("STRATA_OIDC_TIMEOUT_SECONDS", 10.0, minimum=0.1)  # each call to it

# --- request limits -----------------------------------------------------------------------------------
STRATA_MAX_BODY_BYTES = env_int("STRATA_MAX_BODY_BYTES", 1 * 2**20, minimum=1024)
STRATA_MAX_UPLOAD_BYTES = env_int("STRATA_MAX_UPLOAD_BYTES", 512 * 2**20, minimum=1024)
# A code bundle's files, unpacked (POST /api/v1/code/, strata submit --code): over it, the error names the largest.
STRATA_MAX_CODE_BYTES = env_int("STRATA_MAX_CODE_BYTES", 100 * 2**20, minimum=1024)
# A data set (strata data upload, /api/v1/uploads/): its bytes, and its files unpacked; and one chunk of an upload.
STRATA_MAX_DATA_BYTES = env_int("STRATA_MAX_DATA_BYTES", 10 * 2**30, minimum=1024)
STRATA_MAX_DATA_CHUNK_BYTES = env_int("STRATA_MAX_DATA_CHUNK_BYTES", 64 * 2**20, minimum=1024)
# An upload not completed within this many hours of its start expires: the beat deletes it with its chunks.
STRATA_UPLOAD_EXPIRY_HOURS = env_float("STRATA_UPLOAD_EXPIRY_HOURS", 24.0, minimum=0.01)
# How many uploads a team may have open at once (one more is a 409 naming the limit).
STRATA_MAX_OPEN_UPLOADS = env_int("STRATA_MAX_OPEN_UPLOADS", 16, minimum=1)

# --- retention of stored bytes (docs/operations.md, Retention; strata.quotas.retention) ---------------------
# The cluster's defaults, under a team's policy (its quota's keep) and a job's own keep. Checkpoints: latest (each
# job keeps its newest), all, best:N or best:N:METRIC:min|max (the N best of a job and its child jobs, by the metric
# or else by the kind's objective). Artifacts of ended jobs: kept this many days; unset: forever.
STRATA_RETENTION_CHECKPOINTS = env_str("STRATA_RETENTION_CHECKPOINTS", "latest")
# Artifacts of ended jobs are kept this many days; unset or empty: forever.
STRATA_RETENTION_ARTIFACTS_DAYS = env_float_or_none("STRATA_RETENTION_ARTIFACTS_DAYS", None, minimum=0)
# A code bundle that no job ever referenced is deleted this many days after its upload; empty: never.
STRATA_RETENTION_UNUSED_CODE_DAYS = env_float_or_none("STRATA_RETENTION_UNUSED_CODE_DAYS", 7.0, minimum=0)
# Log lines of ended jobs are kept this many days (the rest deleted, and the job's logs say how many: strata.jobs.
# log_search); unset or empty: forever (only STRATA_MAX_LOG_LINES_PER_JOB bounds them).
STRATA_RETENTION_LOG_DAYS = env_float_or_none("STRATA_RETENTION_LOG_DAYS", None, minimum=0)
# How often the scheduler leader's beat runs the collector.
STRATA_RETENTION_INTERVAL_SECONDS = env_float("STRATA_RETENTION_INTERVAL_SECONDS", 3600.0, minimum=10)
DATA_UPLOAD_MAX_MEMORY_SIZE = STRATA_MAX_BODY_BYTES
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000
FILE_UPLOAD_MAX_MEMORY_SIZE = 8 * 2**20

# --- HTTP server (strata server: waitress hardened in strata/api/server.py) ------------------------------
# Open connections one process keeps; at the limit the oldest idle ones are evicted.
STRATA_SERVER_CONNECTION_LIMIT = env_int("STRATA_SERVER_CONNECTION_LIMIT", 1000, minimum=16)
# Seconds an idle connection is kept.
STRATA_SERVER_IDLE_TIMEOUT = env_float("STRATA_SERVER_IDLE_TIMEOUT", 30.0, minimum=1.0)
# Seconds a request's headers may take to arrive (not its body).
STRATA_SERVER_HEADER_TIMEOUT = env_float("STRATA_SERVER_HEADER_TIMEOUT", 10.0, minimum=1.0)
# Threads kept for requests under /api/v1/node/, which user requests cannot take.
STRATA_SERVER_NODE_THREADS = env_int("STRATA_SERVER_NODE_THREADS", 4, minimum=0)
# `strata server` processes sharing the port (SO_REUSEPORT): one waitress process is one interpreter, ~one core.
STRATA_SERVER_WORKERS = env_int("STRATA_SERVER_WORKERS", 1, minimum=1)

# --- REST framework -------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "strata.accounts.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "strata.api.pagination.StrataPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_RATES": {
        "user": env_str("STRATA_THROTTLE_USER", "20000/hour"),  # per user, every API request
        "submit": env_str("STRATA_THROTTLE_SUBMIT", "600/min"),  # per user, POST /api/v1/jobs/
    },
    "EXCEPTION_HANDLER": "strata.api.errors.exception_handler",
    "DEFAULT_PARSER_CLASSES": ["strata.api.parsers.StrictJSONParser", "rest_framework.parsers.FormParser", "rest_framework.parsers.MultiPartParser"],
    "NUM_PROXIES": env_int("STRATA_NUM_PROXIES", 0, minimum=0),  # proxies in front: X-Forwarded-For
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Strata API",
    "DESCRIPTION": "Submit and watch jobs, manage nodes, teams and quotas.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Separate request and reply components (JobSubmitRequest, QuotaRequest...): fields typed per direction.
    "COMPONENT_SPLIT_REQUEST": True,
    # Request bodies are documented as JSON, the API's contract (forms are accepted for the browsable API only).
    "PARSER_WHITELIST": ["strata.api.parsers.StrictJSONParser"],
    # strata/api/schema.py: typed job bodies (a schema per kind), error answers on every operation.
    "PREPROCESSING_HOOKS": ["strata.api.schema.register_extensions"],
    "POSTPROCESSING_HOOKS": ["strata.api.schema.postprocess_enums", "strata.api.schema.add_error_responses",
                             "strata.api.schema.add_plugin_routes"],
    "ENUM_NAME_OVERRIDES": {
        "TokenKindEnum": "strata.accounts.models.ApiToken.Kind",
        "DeviceKindEnum": "strata.cluster.models.Device.Kind",
        "ArtifactKindEnum": "strata.jobs.models.Artifact.Kind",
        "JobStateEnum": "strata.jobs.models.JobState",
        "ParticipantStateEnum": "strata.jobs.models.Participant.State",
        "NodeStateEnum": "strata.cluster.models.Node.State",
        "SharingPolicyEnum": "strata.cluster.models.DevicePool.Policy",
        "WebhookFormatEnum": "strata.notify.models.Webhook.Format",
        "DataFormatEnum": "strata.jobs.models.DataSet.Format",  # "format" is a webhook's field too
    },
}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# A shared cache (redis://...) so request throttles count for the cluster, not per process.
if env_str("STRATA_CACHE_URL"):
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": env_str("STRATA_CACHE_URL")}}

# --- Celery ---------------------------------------------------------------------------------------------
# Redis or AMQP; unset: kombu's filesystem transport in $STRATA_HOME/broker (one machine).
CELERY_BROKER_URL = env_str("STRATA_BROKER_URL") or f"filesystem://{HOME / 'broker'}"
STRATA_BROKER_PREFIX = env_str("STRATA_BROKER_PREFIX")  # namespaces Strata's Redis keys
CELERY_BROKER_OPTIONS = celery_broker_options(CELERY_BROKER_URL, STRATA_BROKER_PREFIX)
# What nodes are told to connect to (the control plane may see the broker under another address).
STRATA_NODE_BROKER_URL = env_str("STRATA_NODE_BROKER_URL") or CELERY_BROKER_URL

# --- cluster behaviour ----------------------------------------------------------------------------------
# A node whose lease runs out is lost: its attempts end and are requeued.
STRATA_NODE_LEASE_SECONDS = env_float("STRATA_NODE_LEASE_SECONDS", 15.0, minimum=1.0)
STRATA_HEARTBEAT_SECONDS = env_float("STRATA_HEARTBEAT_SECONDS", 3.0, minimum=0.1)  # nodes' interval
# An agent renews its lease every heartbeat with the lean node/renew/ and sends its batched device samples and its
# plugins' reports in a full heartbeat this often (None: five heartbeat intervals; never less than one interval).
STRATA_NODE_TELEMETRY_SECONDS = env_float("STRATA_NODE_TELEMETRY_SECONDS", None, minimum=0.1)
# Node tokens, once checked, are trusted this long by a server process without reading them again
# (accounts.node_tokens): a revoked node token's other calls stop within it on every process (at once on the one
# that revoked it); a lease renewal checks its token in its own UPDATE and is refused at once. 0: no cache.
STRATA_NODE_TOKEN_CACHE_SECONDS = env_float("STRATA_NODE_TOKEN_CACHE_SECONDS", 5.0, minimum=0.0)
# The scheduler's beat: a scheduling pass, and the leader's reaper and reconciler, this often.
STRATA_SCHEDULER_TICK_SECONDS = env_float("STRATA_SCHEDULER_TICK_SECONDS", 2.0, minimum=0.1)
# Foresight (scheduling/eta.py): the leader refreshes the waiting jobs' start-time estimates this often (0: never).
STRATA_ETA_SECONDS = env_float("STRATA_ETA_SECONDS", 30.0, minimum=0.0)
# The most waiting jobs (the first in queue order) whose start-time estimate one refresh computes.
STRATA_ETA_JOBS = env_int("STRATA_ETA_JOBS", 50, minimum=1)
# Simulations of the queue per refresh, each with run times drawn from their predicted quantiles (the 80 % interval).
STRATA_ETA_SAMPLES = env_int("STRATA_ETA_SAMPLES", 24, minimum=1)
# Of several `strata scheduler` replicas one leads (reaper, reconciler, telemetry rollups): its lease lasts this
# long and is renewed every tick, so a dead leader is replaced within it (scheduling/leader.py).
STRATA_LEADER_LEASE_SECONDS = env_float("STRATA_LEADER_LEASE_SECONDS", 15.0, minimum=1.0)
# A dispatch not claimed this long is published again by the reconciler.
STRATA_DISPATCH_REPUBLISH_SECONDS = env_float("STRATA_DISPATCH_REPUBLISH_SECONDS", 30.0, minimum=1.0)
# A node that leaves an attempt dispatched to it unclaimed this long is told so in its heartbeat answer, and its
# agent restarts its worker (a worker that lives on but takes no work, as after some broker outages).
STRATA_CLAIM_TIMEOUT_SECONDS = env_float("STRATA_CLAIM_TIMEOUT_SECONDS", 120.0, minimum=5.0)
# The default lifetime of a new API token.
STRATA_TOKEN_TTL_DAYS = env_int("STRATA_TOKEN_TTL_DAYS", 90, minimum=1)
# Participants (machines outside the cluster that joined a running job): one whose last heartbeat is older than
# this is no longer active (it stops counting against the quota at once; the reaper marks it lost). They are
# told to heartbeat every third of it.
STRATA_PARTICIPANT_LEASE_S = env_float("STRATA_PARTICIPANT_LEASE_S", 30.0, minimum=1.0)
# How long a job credential (a signed statement for a job's worker, strata.jobs.credentials) stays valid.
STRATA_CREDENTIAL_TTL_S = env_float("STRATA_CREDENTIAL_TTL_S", 60.0, minimum=5.0)
# How long an attempt credential (what an attempt's processes use instead of the node token,
# strata.accounts.attempt_credentials) stays valid; attempts renew it at a quarter of this.
STRATA_ATTEMPT_CREDENTIAL_TTL_S = env_float("STRATA_ATTEMPT_CREDENTIAL_TTL_S", 3600.0, minimum=10.0)
# Where LocalArtifactStorage keeps every stored byte; STRATA_ARTIFACT_STORAGE names the backend class.
STRATA_ARTIFACT_ROOT = Path(env_str("STRATA_ARTIFACT_ROOT", str(HOME / "artifacts")))
STRATA_ARTIFACT_STORAGE = env_str("STRATA_ARTIFACT_STORAGE", "strata.jobs.storage.LocalArtifactStorage")
# S3-compatible object storage (AWS S3, MinIO, SeaweedFS, Ceph RGW), used with
# STRATA_ARTIFACT_STORAGE=strata.jobs.storage.S3ArtifactStorage. Without an access key, boto3's standard chain
# (AWS_* environment, ~/.aws, an instance or pod role) supplies the credentials; *_FILE forms read a secret file.
STRATA_S3_ENDPOINT = env_str("STRATA_S3_ENDPOINT", "") or ""  # empty: AWS S3 of STRATA_S3_REGION
STRATA_S3_BUCKET = env_str("STRATA_S3_BUCKET", "") or ""
STRATA_S3_PREFIX = env_str("STRATA_S3_PREFIX", "") or ""  # every key under it, e.g. "strata/prod/"
STRATA_S3_REGION = env_str("STRATA_S3_REGION", "") or ""
STRATA_S3_ACCESS_KEY_ID = env_str("STRATA_S3_ACCESS_KEY_ID", "") or ""
STRATA_S3_SECRET_ACCESS_KEY = env_str("STRATA_S3_SECRET_ACCESS_KEY", "") or ""
STRATA_S3_ADDRESSING = env_str("STRATA_S3_ADDRESSING", "path") or "path"  # path | virtual
if STRATA_S3_ADDRESSING not in ("path", "virtual"):
    raise ImproperlyConfigured(f"STRATA_S3_ADDRESSING must be path or virtual, got {STRATA_S3_ADDRESSING!r}")
# Direct transfers (strata.jobs.transfers): with an object store, nodes and users move bytes to and from it through
# presigned URLs; objects smaller than STRATA_DIRECT_MIN_BYTES (and every object on local disk) go through the
# control plane. A presigned URL works for STRATA_PRESIGN_EXPIRY_S seconds.
STRATA_DIRECT_TRANSFERS = env_bool("STRATA_DIRECT_TRANSFERS", True)
STRATA_DIRECT_MIN_BYTES = env_int("STRATA_DIRECT_MIN_BYTES", 1 * 2**20, minimum=0)
STRATA_PRESIGN_EXPIRY_S = env_int("STRATA_PRESIGN_EXPIRY_S", 900, minimum=10)
# Log lines stored per job (later ones are dropped).
STRATA_MAX_LOG_LINES_PER_JOB = env_int("STRATA_MAX_LOG_LINES_PER_JOB", 100_000, minimum=100)
STRATA_MAX_TIME_LIMIT_SECONDS = env_int("STRATA_MAX_TIME_LIMIT_SECONDS", 7 * 86400, minimum=60)  # the longest a job may ask for
# The operation history (strata.jobs.history): one JSON line per committed job and attempt change, appended to this
# file by every control-plane process. Off when empty. The chaos suite checks it (benchmarks.core.history_check).
STRATA_HISTORY_LOG = env_str("STRATA_HISTORY_LOG", "") or ""

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("STRATA_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.server": {"level": "WARNING"},
        "waitress.queue": {"level": "ERROR"},
        "kombu.connection": {"level": "ERROR"},  # the embedded broker has no host name to announce
    },
}
# Run scheduling passes in the web process after each submit (tests), not through the broker.
STRATA_SCHEDULE_INLINE = env_bool("STRATA_SCHEDULE_INLINE", False)
STRATA_TELEMETRY_RETENTION_DAYS = env_int("STRATA_TELEMETRY_RETENTION_DAYS", 35, minimum=1)  # hour rollups
STRATA_TELEMETRY_RAW_DAYS = env_int("STRATA_TELEMETRY_RAW_DAYS", 2, minimum=1)  # raw heartbeat samples
# Audit log entries (strata.audit) older than this many days are deleted by the scheduler leader's beat, hourly;
# 0: kept forever.
STRATA_AUDIT_RETENTION_DAYS = env_int("STRATA_AUDIT_RETENTION_DAYS", 365, minimum=0)

# --- metrics (docs/operations/metrics.md) -------------------------------------------------------------------
# Set: /metrics asks for "Authorization: Bearer <token>"; unset: it is open (aggregate counts only).
STRATA_METRICS_TOKEN = env_str("STRATA_METRICS_TOKEN") or None
# `strata scheduler` serves its own process's metrics (pass latency) here; 0 turns it off.
STRATA_SCHEDULER_METRICS_PORT = env_int("STRATA_SCHEDULER_METRICS_PORT", 9109, minimum=0)
# Where the scheduler's metrics server listens: loopback unless an operator opens it.
STRATA_METRICS_BIND = env_str("STRATA_METRICS_BIND", "127.0.0.1")

# --- notifications (strata.notify: webhooks and e-mail; docs/architecture.md, Notifications) ----------------
# A webhook delivery gives up on connecting after this many seconds ...
STRATA_NOTIFY_CONNECT_TIMEOUT_S = env_float("STRATA_NOTIFY_CONNECT_TIMEOUT_S", 3.0, minimum=0.1)
# ... and on the receiver's answer after this many (the whole answer, not each read).
STRATA_NOTIFY_READ_TIMEOUT_S = env_float("STRATA_NOTIFY_READ_TIMEOUT_S", 5.0, minimum=0.1)
# Tries per delivery (the first included); a failed one is retried after STRATA_NOTIFY_BACKOFF_S, doubling each time.
STRATA_NOTIFY_MAX_ATTEMPTS = env_int("STRATA_NOTIFY_MAX_ATTEMPTS", 6, minimum=1)
STRATA_NOTIFY_BACKOFF_S = env_float("STRATA_NOTIFY_BACKOFF_S", 10.0, minimum=0.0)  # the wait after the first failed try
STRATA_NOTIFY_BACKOFF_MAX_S = env_float("STRATA_NOTIFY_BACKOFF_MAX_S", 600.0, minimum=0.0)  # the longest wait
# Calls `strata notifier` (the worker of the notify and tracking queues: webhook and e-mail deliveries, MLflow
# rounds) makes at once, each in a thread of its own.
STRATA_NOTIFY_CONCURRENCY = env_int("STRATA_NOTIFY_CONCURRENCY", 8, minimum=1)
# Webhook URLs may name loopback, private and link-local addresses (off: only public ones, checked at each delivery).
STRATA_WEBHOOK_ALLOW_PRIVATE = env_bool("STRATA_WEBHOOK_ALLOW_PRIVATE", False)
# E-mail notifications go through Django's mail backend (smtp; tests use locmem) with these settings.
EMAIL_BACKEND = env_str("STRATA_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("STRATA_EMAIL_HOST", "localhost")  # the SMTP server
EMAIL_PORT = env_int("STRATA_EMAIL_PORT", 25, minimum=1)  # its port
EMAIL_HOST_USER = env_str("STRATA_EMAIL_USER", "") or ""  # SMTP login (empty: none)
EMAIL_HOST_PASSWORD = env_str("STRATA_EMAIL_PASSWORD", "") or ""  # or STRATA_EMAIL_PASSWORD_FILE
EMAIL_USE_TLS = env_bool("STRATA_EMAIL_STARTTLS", False)  # STARTTLS on the plain port
EMAIL_USE_SSL = env_bool("STRATA_EMAIL_SSL", False)  # TLS from the first byte (port 465)
EMAIL_TIMEOUT = env_float("STRATA_EMAIL_TIMEOUT_S", 10.0, minimum=0.1)  # seconds for the SMTP server to answer
DEFAULT_FROM_EMAIL = env_str("STRATA_EMAIL_FROM", "strata@localhost")  # the sender of notifications

# --- the MLflow bridge (strata.tracking: a team's jobs mirrored to its MLflow server; docs/architecture.md) ---
# How often the scheduler leader's beat mirrors jobs (new runs, metric batches, ended runs and their artifacts).
STRATA_MLFLOW_SYNC_SECONDS = env_float("STRATA_MLFLOW_SYNC_SECONDS", 15.0, minimum=1)
# An artifact or checkpoint larger than this is not copied to the run (a tag names it); 0: none is copied.
STRATA_MLFLOW_MAX_ARTIFACT_BYTES = env_int("STRATA_MLFLOW_MAX_ARTIFACT_BYTES", 2 * 2**30, minimum=0)
# A call to a tracking server gives up on connecting after this many seconds, on its answer after 4 times as many (an
# artifact's upload: 10 times, at least 60 s).
STRATA_MLFLOW_TIMEOUT_S = env_float("STRATA_MLFLOW_TIMEOUT_S", 5.0, minimum=0.1)
# A team whose server failed is retried after the sync interval, doubling each failed round up to this many seconds.
STRATA_MLFLOW_BACKOFF_MAX_S = env_float("STRATA_MLFLOW_BACKOFF_MAX_S", 600.0, minimum=1)
# One team's round stops starting new jobs' work after this many seconds (the rest is left to the next round).
STRATA_MLFLOW_ROUND_BUDGET_S = env_float("STRATA_MLFLOW_ROUND_BUDGET_S", 60.0, minimum=1)
