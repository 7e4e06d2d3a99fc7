"""Settings, all from the environment.

Unset variables fall back to the embedded defaults: an SQLite database and a
secret key kept under the state dir (``LLMGW_STATE_DIR``, ``./var`` by default),
and a private Redis that ``make run`` and ``make test`` start themselves
(see ``fleet.devstack.redis``).
"""

import importlib.util
import json
import os
import secrets
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from fleet.conf import from_environ

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("LLMGW_STATE_DIR", BASE_DIR / "var")).resolve()
STATE_DIR.mkdir(parents=True, exist_ok=True)


def _env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _secret_key() -> str:
    """The key from the environment, else one generated once and kept in the state dir.

    Kept rather than regenerated so sessions and signed values survive a restart.
    """
    if key := os.environ.get("SECRET_KEY"):
        return key
    path = STATE_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        key = secrets.token_urlsafe(50)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key)
        return key


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


SECRET_KEY = _secret_key()
DEBUG = _env_bool("DEBUG")
# No default: with DEBUG off and none given, llmgw_site.asgi refuses to start
# (with DEBUG on, Django allows localhost). `make run` and the tests name theirs.
ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS")
CSRF_TRUSTED_ORIGINS = _env_list("CSRF_TRUSTED_ORIGINS")

# HTTPS, for a control plane behind a TLS-terminating proxy (README, "Running in
# production"; `manage.py check --deploy` asks for all of them). Off by default:
# `make run` serves plain HTTP on 127.0.0.1. None of them touches /v1/*, /metrics
# or the agents' socket, which are served ahead of Django's middleware.
SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT")
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "0"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = _env_bool("SECURE_HSTS_PRELOAD")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _env_bool("SECURE_COOKIES")
# The header the proxy sets to "https" for a request that came over TLS, e.g.
# X-Forwarded-Proto. Only name one the proxy always sets (or strips): a client
# could send it otherwise.
if _proxy_header := os.environ.get("SECURE_PROXY_SSL_HEADER", "").strip():
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_header.upper().replace("-", "_"), "https")

# /metrics without this bearer token is refused 401 (fleet.metrics); empty: open.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
# /api/schema/ and /api/docs/ are for staff (a session or a manage key) unless this is on.
API_DOCS_PUBLIC = _env_bool("API_DOCS_PUBLIC")

# Daphne's app, first, where it serves: under `manage.py runserver` it serves the ASGI
# app (agent sockets included) in development. Nowhere else: importing it installs
# Twisted's reactor, 0.13 s at the start of every web, Celery and manage.py process
# that never uses it; production runs uvicorn (llmgw_site/serve.py).
_DAPHNE = ["daphne"] if sys.argv[1:2] == ["runserver"] else []

INSTALLED_APPS = [
    *_DAPHNE,
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    # The audit trail's entries (fleet/audit.py says who and through which door).
    "auditlog",
    "fleet",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's, DRF's) served by the application itself, before
    # sessions and the rest: no web server in front is needed. Right after
    # SecurityMiddleware so its HTTPS redirect and headers still apply to them.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Who changes what, through which door and from where: the audit trail's scope.
    "fleet.audit.AuditMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its 429 page.
    "axes.middleware.AxesMiddleware",
]

# Login throttling (django-axes): after LOGIN_FAILURE_LIMIT failed logins a
# username is locked out, and so is the address they came from, for
# LOGIN_LOCKOUT_MINUTES; every later try, right or wrong, is refused with 429
# and restarts the wait. Unknown bearer keys on /api/v1/ count against their
# address only (fleet.api.authentication). Locked-out users and addresses are
# listed, and released, in the admin under "Access attempts".
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    # Object permissions only: teams' scope (fleet/services/teams.py) narrows them.
    "rules.permissions.ObjectPermissionBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("LOGIN_LOCKOUT_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = "fleet.api.authentication.lockout_parameters"
# The client's address is the connection's: a header can be forged by the client.
# Behind a proxy, run the web process with --forwarded-allow-ips naming it, so the
# connection's address is the one the proxy saw (README, "Running in production").
AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)

# Single sign-on for the admin and the console through OpenID Connect
# (fleet/sso.py; docs/security.md, "Single sign-on"): on when
# LLMGW_OIDC_CLIENT_ID is set. Local accounts keep working beside it.
OIDC_RP_CLIENT_ID = os.environ.get("LLMGW_OIDC_CLIENT_ID", "").strip()
if OIDC_RP_CLIENT_ID:
    _OIDC_NEEDED = {
        "OIDC_RP_CLIENT_SECRET": "LLMGW_OIDC_CLIENT_SECRET",
        "OIDC_OP_AUTHORIZATION_ENDPOINT": "LLMGW_OIDC_AUTHORIZATION_ENDPOINT",
        "OIDC_OP_TOKEN_ENDPOINT": "LLMGW_OIDC_TOKEN_ENDPOINT",
        "OIDC_OP_USER_ENDPOINT": "LLMGW_OIDC_USERINFO_ENDPOINT",
        "OIDC_OP_JWKS_ENDPOINT": "LLMGW_OIDC_JWKS_ENDPOINT",
    }
    if _missing := [env for env in _OIDC_NEEDED.values() if not os.environ.get(env, "").strip()]:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"LLMGW_OIDC_CLIENT_ID is set, so single sign-on needs {', '.join(_missing)} too "
            "(docs/security.md, 'Single sign-on')"
        )
    for _name, _env in _OIDC_NEEDED.items():
        globals()[_name] = os.environ[_env].strip()
    OIDC_OP_END_SESSION_ENDPOINT = os.environ.get("LLMGW_OIDC_END_SESSION_ENDPOINT", "").strip()
    OIDC_RP_SIGN_ALGO = os.environ.get("LLMGW_OIDC_SIGN_ALGO", "RS256").strip()
    OIDC_RP_SCOPES = os.environ.get("LLMGW_OIDC_SCOPES", "openid email profile").strip()
    LLMGW_OIDC_GROUPS_CLAIM = os.environ.get("LLMGW_OIDC_GROUPS_CLAIM", "groups").strip()
    OIDC_USE_PKCE = True
    OIDC_STORE_ID_TOKEN = True  # the hint for signing out at the provider
    OIDC_OP_LOGOUT_URL_METHOD = "fleet.sso.provider_logout"
    OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
    LOGIN_REDIRECT_URL_FAILURE = "/admin/login/?sso=refused"
    AUTHENTICATION_BACKENDS += ["fleet.sso.Backend"]
# Where a sign-in lands when it was not sent from a page: the cluster page; and
# where signing out does (after the provider's own, for a single sign-on).
LOGIN_REDIRECT_URL = "/admin/cluster/"
LOGOUT_REDIRECT_URL = "/admin/login/"

ROOT_URLCONF = "llmgw_site.urls"
ASGI_APPLICATION = "llmgw_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "fleet.context_processors.fleet_banner",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{STATE_DIR / 'llmgw.sqlite3'}",
        conn_max_age=int(os.environ.get("DATABASE_CONN_MAX_AGE", "0")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Many agents write at once; WAL lets readers go on while one writes, and the
    # busy timeout queues writers instead of failing them with "database is locked".
    # IMMEDIATE: a transaction takes the write lock when it begins, so the busy
    # timeout applies; a deferred one that reads, then writes after another
    # process wrote, fails at once with "database is locked" whatever the timeout.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
        }
    )
    DATABASES["default"]["TEST"] = {"NAME": str(STATE_DIR / "test.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis: channel layer and Celery broker. The embedded default is a private
# redis-server on a unix socket in the state dir, started by `make run`/`make test`.
REDIS_URL = os.environ.get("REDIS_URL") or f"unix://{STATE_DIR / 'redis.sock'}"

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py 8 changed two defaults the layer relies on. It times out
            # any read after 5 s, which kills the blocking BZPOPMIN and with it
            # every idle consumer. And it caps a pool at 100 connections, failing
            # the 101st: when 2,000 agents drop at once (bench/agents.py) their
            # disconnects' group_discard died with "Too many connections" and
            # left the nodes marked connected. Both back to redis-py 7's values.
            "hosts": [{"address": REDIS_URL, "socket_timeout": None, "max_connections": 2**31}],
            "prefix": os.environ.get("LLMGW_CHANNEL_PREFIX", "llmgw"),
            # Messages to a node are doorbells and requests: dropping one when a
            # channel is full is survivable (the desired set is re-sent), piling
            # up hours of them is not.
            "capacity": 1000,
            "expiry": 30,
        },
    }
}


def _batch_storage(fleet: dict, state_dir: Path) -> dict:
    """The ``batches`` storage from its two settings; a wrong one stops the start, named."""
    backend = fleet["BATCH_STORAGE_BACKEND"]
    try:
        options = json.loads(fleet["BATCH_STORAGE_OPTIONS"] or "{}")
    except ValueError as exc:
        raise ImproperlyConfigured(f"LLMGW_BATCH_STORAGE_OPTIONS is not JSON: {exc}") from None
    if not isinstance(options, dict):
        raise ImproperlyConfigured("LLMGW_BATCH_STORAGE_OPTIONS must be a JSON object")
    if backend == "django.core.files.storage.FileSystemStorage":
        options.setdefault("location", str(state_dir / "batch-files"))
    elif backend.startswith("storages.backends.s3") and importlib.util.find_spec("boto3") is None:
        raise ImproperlyConfigured(
            f"LLMGW_BATCH_STORAGE_BACKEND={backend} needs boto3: pip install boto3"
        )
    return {"BACKEND": backend, "OPTIONS": options}


def _celery_url(url: str) -> str:
    return "redis+socket://" + url[len("unix://") :] if url.startswith("unix://") else url


# Fleet behaviour: every LLMGW_* setting, declared with its type and default in
# fleet/conf.py and read through fleet.conf.fleet_settings().
LLMGW = from_environ()

CELERY_BROKER_URL = _celery_url(REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = _env_bool("CELERY_TASK_ALWAYS_EAGER")
# The reconciler runs every few seconds, and at once after a change that matters
# (fleet.services.reconciler.ask). An entry expires rather than piling up behind
# a busy worker: the next one does the same work.
_RECONCILE_EVERY_S = LLMGW["RECONCILE_INTERVAL_S"]
# One queue per installation (and per test run) sharing a Redis, named like the
# channel-layer prefix, so one installation's workers never run another's tasks.
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("LLMGW_CHANNEL_PREFIX", "llmgw")
CELERY_BEAT_SCHEDULE: dict = {
    "reconcile": {
        "task": "fleet.tasks.reconcile",
        "schedule": _RECONCILE_EVERY_S,
        "options": {"expires": _RECONCILE_EVERY_S},
    },
    # Unused weights (fleet.services.weights_gc), under the reconciler's lock.
    "gc-weights": {
        "task": "fleet.tasks.gc_weights",
        "schedule": LLMGW["WEIGHTS_GC_INTERVAL_S"],
        "options": {"expires": LLMGW["WEIGHTS_GC_INTERVAL_S"]},
    },
    # What new or changed profiles' models need (fleet.services.estimate): reads
    # weights' headers, so in the worker, never in a request or a pass.
    # Audit entries past LLMGW_AUDIT_RETENTION_DAYS (fleet/audit.py).
    "audit-retention": {
        "task": "fleet.tasks.audit_retention",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
    # The Batch API (fleet.services.batches.runner): new batches checked, old ones
    # expired, and each team's batches handed to a worker.
    "batches": {
        "task": "fleet.tasks.batches_tick",
        "schedule": LLMGW["BATCH_TICK_S"],
        "options": {"expires": LLMGW["BATCH_TICK_S"]},
    },
    "estimate-profiles": {
        "task": "fleet.tasks.estimate_profiles",
        "schedule": 10.0,
        "options": {"expires": 10.0},
    },
    # What each replica holds, counted into the hour's costs (fleet.services.costs).
    "accrue-costs": {
        "task": "fleet.tasks.accrue_costs",
        "schedule": LLMGW["COST_INTERVAL_S"],
        "options": {"expires": LLMGW["COST_INTERVAL_S"]},
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Static files: `manage.py collectstatic --no-input` (which `make run` does)
# copies them to STATIC_ROOT with a hash of their content in each name and a
# gzipped copy beside each; WhiteNoiseMiddleware serves them from there,
# compressed when the client accepts it, a hashed name with a far-future
# Cache-Control. Without the collected manifest every page naming a static file
# is a 500: collect at every deploy (README, "Running in production").
STATIC_URL = "static/"
STATIC_ROOT = STATE_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    # The Batch API's files (fleet.services.batches.files): LLMGW_BATCH_STORAGE_BACKEND
    # and its LLMGW_BATCH_STORAGE_OPTIONS, under the state dir by default.
    "batches": _batch_storage(LLMGW, STATE_DIR),
}
# WhiteNoise answers with a file iterator Django reads in a thread under ASGI, and
# Django says so once per process. The files are the admin's and the console's CSS
# and scripts, tens of KiB each and cached for a year by browsers: nothing to act on.
warnings.filterwarnings(
    "ignore",
    message="StreamingHttpResponse must consume synchronous iterators",
    module="django.core.handlers.asgi",
)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleet.api.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Staff, as for the admin, and then the same model permissions the admin asks for.
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAdminUser",
        "fleet.api.permissions.FleetModelPermissions",
    ],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.SearchFilter",
        "rest_framework.filters.OrderingFilter",
    ],
    # JSON in, as the schema says; a form-encoded body cannot say null, or a list.
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "fleet.api.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "fleet.api.exceptions.handle",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "llmgw API",
    "DESCRIPTION": (
        "The management API of llmgw: nodes and GPUs, the catalog (models, profiles, "
        "engines, prices), replicas and shards, keys and join tokens, teams, adapters, "
        "weights, usage, costs, events and the audit trail. The OpenAI-style gateway, "
        "batches included, is at /v1/ (docs/gateway.md)."
    ),
    "VERSION": "1",
    # Tags and operation ids by resource ("nodes", nodes_drain_create), not "v1":
    # what a generated client names its modules and methods after.
    "SCHEMA_PATH_PREFIX": r"/api/v[0-9]+",
    # The schema describes the API (/api/v1/), not the page that serves it.
    "SERVE_INCLUDE_SCHEMA": False,
    # A request body's own components (ModelRequest, PatchedModelRequest): without
    # read-only fields, and with the rules (minLength...) that only writing has.
    "COMPONENT_SPLIT_REQUEST": True,
    # One name for a choice set two fields share (a GPU's health and its fault).
    "ENUM_NAME_OVERRIDES": {"GPUHealthEnum": "fleet.models.choices.GPUHealth"},
    # After the enum hook, ours: every operation's error statuses and their bodies.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "fleet.api.schema.document_errors",
    ],
    "SERVE_PERMISSIONS": [
        "rest_framework.permissions.AllowAny"
        if API_DOCS_PUBLIC
        else "rest_framework.permissions.IsAdminUser"
    ],
    # Swagger UI from our own static files (drf-spectacular-sidecar), not a CDN's
    # `@latest`: the docs page works offline and runs no script we did not ship.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "filters": {
        "quiet_sockets": {"()": "llmgw_site.logfilters.QuietSockets"},
        "quiet_bad_frames": {"()": "llmgw_site.logfilters.QuietBadFrames"},
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        # Its "connection open/closed" for every socket; agent sockets are logged
        # by the consumer, with their node.
        # And a text frame of invalid UTF-8 as one line, not a traceback.
        "uvicorn.error": {"filters": ["quiet_sockets", "quiet_bad_frames"]},
        "daphne": {"level": "WARNING"},
        "django.channels.server": {"level": "WARNING"},
        # Its start banner and every failed login at INFO; lockouts are WARNING.
        "axes": {"level": "WARNING"},
    },
}
